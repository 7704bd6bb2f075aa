"""What a fitted framework layer was fitted on (:class:`Calibration`): the runs, their span and how far its
predictions were off, the record :mod:`oppo.sim.logs.trust` writes into a calibrated setup and reads back to say
when a prediction extrapolates."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Calibration:
    """What a fitted layer was fitted on and how far its predictions were off (:mod:`oppo.sim.logs.trust` makes
    and reads it): the runs; the relative half-width of an interval holding ``coverage`` of the predicted steps
    (``step_err``) and of each stage's (``stage_err``, in ``stages`` order) when each run was predicted without its
    siblings (``basis``: "leave_one_group_out", or "within" for one run's own validated steps); and the span of the
    runs, each a (min, max) or the values seen: total GPUs, nodes, parameters (billions), response caps, the GPUs,
    algorithms, group sizes, the rollout engines' per-step resets ("unknown" where a log does not state it), the
    engines, their versions (scheduler, CUDA graphs, chunked prefill, token budget per iteration; "unknown" where a
    log does not state them), their tensor-parallel degrees
    (min, max), whether they reshard and whether the training passes shard their parameters, the training backends
    and their tensor- and pipeline-parallel degrees and update micro-batches (min, max), the roles they offloaded,
    whether they pushed weights to a rollout engine of its own, and the work of a forward micro-batch (min, max);
    and what its interval rests on: each run's median step error, and per axis of the span the largest of those of
    the runs that lay outside the other runs' span on it; and per run the interval the other groups' errors alone
    give (``held_out_step_err``), against which its own median error measures the coverage out of sample. Empty (no
    runs): an uncalibrated layer."""

    runs: tuple[str, ...] = ()
    basis: str = ""
    coverage: float = 0.8
    step_err: float = 0.0
    stages: tuple[str, ...] = ()
    stage_err: tuple[float, ...] = ()
    gpus: tuple[int, ...] = ()
    nodes: tuple[int, ...] = ()
    params_b: tuple[float, ...] = ()
    max_new_tokens: tuple[int, ...] = ()
    gpu_names: tuple[str, ...] = ()
    algos: tuple[str, ...] = ()
    group_sizes: tuple[int, ...] = ()
    kv_cache_resets: tuple[str, ...] = ()
    engines: tuple[str, ...] = ()
    rollout_tensor_parallel: tuple[int, ...] = ()
    weight_reshards: tuple[bool, ...] = ()
    sharded: tuple[bool, ...] = ()
    train_backends: tuple[str, ...] = ()  # empty in a record written before Megatron: no check
    train_tensor_parallel: tuple[int, ...] = ()
    train_pipeline_parallel: tuple[int, ...] = ()
    train_micro_batch: tuple[int, ...] = ()
    # empty in a record written before these were kept: no check
    offloads: tuple[str, ...] = ()  # each run's offloaded roles, comma-joined (":each": every micro-batch; "none")
    weight_pushes: tuple[bool, ...] = ()  # whether a run pushed weights to a rollout engine on GPUs of its own
    forward_gflop: tuple[float, ...] = ()  # (min, max) work of a scoring forward micro-batch on one GPU, GFLOP
    # empty in a record written before the engine's version was kept: no check. The values the runs' logs show, each
    # "unknown" where a run's log does not say (oppo.sim.logs.trust.engine_record)
    engine_schedulers: tuple[str, ...] = ()  # vLLM's engine generation: "v0", "v1"
    engine_cuda_graphs: tuple[str, ...] = ()  # "CUDA graphs", "eager"
    engine_chunked_prefill: tuple[str, ...] = ()  # "on", "off"
    engine_batched_tokens: tuple[str, ...] = ()  # max_num_batched_tokens, as text
    # empty in a record written before intervals were measured: no coverage said, and every extrapolation unbounded
    run_step_err: tuple[float, ...] = ()  # each run's median step error as ``basis`` predicted it, in ``runs`` order
    axes: tuple[str, ...] = ()  # the axes on which some run lay outside the others' span (``outside_span``'s axes)
    axis_err: tuple[float, ...] = ()  # per axis, the largest median step error of a run that lay outside there
    # empty in a record written before coverage was measured out of sample: the share said in sample
    held_out_step_err: tuple[float, ...] = ()  # per run, the interval the runs outside its group give (-1: none)
