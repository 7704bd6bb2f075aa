"""oppo.exec: a real PyTorch executor of the scheduling core (``python -m oppo.exec.train``).

Actor, critic, reference and reward transformers loaded through ``from_pretrained``; chunked decode with a
preallocated KV cache; scorers that prefill streamed chunks; PPO and GRPO; roles in Ray workers
(:mod:`oppo.exec.distributed`, the only room that imports Ray). Its rooms, and the order to read one step in, are
in ``docs/design.md`` ("Read this first").
"""
