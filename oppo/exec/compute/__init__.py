"""One step's compute on one rank, timed into the shared records: the rollout, the scorers' (streamed) passes, the
update, FSDP sharding and the timer.
"""
