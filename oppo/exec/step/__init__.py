"""One training step end to end: the driver's runner, the actor group's ranks, which roles sit where, held-out
evaluation and checkpoints.
"""
