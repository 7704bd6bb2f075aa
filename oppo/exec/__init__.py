"""oppo.exec: a real PyTorch executor of the scheduling core (``python -m oppo.exec.train``).

Actor, critic, reference and reward transformers loaded through ``from_pretrained``; chunked decode with a
preallocated KV cache; scorers that prefill streamed chunks; PPO; scorer roles in Ray workers
(:mod:`oppo.exec.distributed.placement`, the only module that uses Ray).
"""
