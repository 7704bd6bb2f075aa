"""The RL math of a step, as pure functions on tensors: log-probs, advantages (GAE, EGAE, group-relative), KL
estimators, the clipped policy and value losses and their aggregation.
"""
