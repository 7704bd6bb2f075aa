"""What the actor is asked and how its answers score: the synthetic task, datasets, reward functions (rule, verifiable,
user-given) and the arithmetic task.
"""
