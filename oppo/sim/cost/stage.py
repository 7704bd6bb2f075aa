"""One stage's framework terms and the load they price: each operation of a stage costs
:meth:`StageCost.seconds` of its :class:`StageLoad`,

    compute = roofline_s / efficiency × (1 + half_efficiency_tokens / micro-batch tokens)
    host = units × per_unit_s
    busy = max(compute, host) + exposed_host_frac × min(compute, host)
    gathers = gather_s / gather_bandwidth_frac + host_copy_s / host_link_frac
    seconds = max(busy, gathers) + exposed_gather_frac × min(busy, gathers)
              + row_tokens × per_token_s + steps × fixed_s + host_s / host_link_frac + extra_s
              + reinit_steps × cache_reinit_s + moves
    moves = reshard_s / reshard_frac + reshard_layers × reshard_layer_s + transfer_s / transfer_frac

The first term is a micro-batched pass whose efficiency grows with the tokens of a micro-batch and reaches half
its best at ``half_efficiency_tokens`` (a model-size-proportional cost per micro-batch: it transfers between
models, a fixed time per micro-batch would not); generation has no micro-batch term. The unit is a decode
iteration for ``gen`` and a micro-batch for the others; ``per_unit_s`` is the host's time per unit (Python,
the framework's hooks, kernel launches), which CUDA runs ahead of the GPU: a pass costs the larger of its compute
and its host time, plus the share ``exposed_host_frac`` of the smaller (1, the default: their sum; the layer
fitted across the shared runs keeps 1). A small model's short micro-batches wait on the
host, a large model's hide it.
``gather_s`` are the parameter gathers of a sharded pass
(FSDP / ZeRO-3) at the nominal link: FSDP prefetches the next layer's parameters while the current one computes,
so a pass costs the larger of its compute and its gathers plus the share of the smaller that does not overlap
(``exposed_gather_frac``; 1 is the serial sum); ``gather_bandwidth_frac`` is the achieved share of the nominal link
(a fitted factor: the datasheet's link is a prior, never a floor). ``per_token_s`` (``gen`` only) is charged per row
of the decode batch per iteration: per generated token on an engine that compacts the batch (vLLM), per row of the
padded batch, finished rows included, on one that does not (HF generate), and on one engine's rows (the role's
engines decode side by side; a layer fitted before this rule charged every engine's rows: its ``per_token_s`` is
the engine count times too small); a rollout engine whose KV memory cannot hold the whole batch runs it as resident
batches that fill it, so its time follows the tokens decoded rather than the longest response.
``fixed_s`` is charged once per step (an ``other`` operation of the role). ``host_s`` is an offloaded role's
parameters (and an offloaded optimizer's state) copied from the host and back around a call of its worker (a
scoring pass; an update, once a step), at the nominal host link (the GPU's, a prior), over its achieved share
``host_link_frac``; ``host_copy_s`` its shards copied from the host before each gather (FSDP's CPU
offload, at every micro-batch), over the same share, prefetched with the gathers. ``extra_s`` is what no term
scales. Every term but the overlap is linear in the load, so the loads of a step add up, and the log fit
(:mod:`oppo.sim.logs.fit`) measures them by simulating a step with this very class (with both exposed shares 1, where
the overlaps are sums too). Of a replayed step's passes of one stage, every one is alike, so the overlaps of their
summed loads are theirs; a logged stage that times several of ours at once (OpenRLHF's) is fitted on their summed
loads, and predicted as the sum of each one's overlap: the two differ where its parts fall on both sides of the
kink.

:mod:`oppo.sim.cost.framework` holds the layer (a setup's stages' terms) and the loads a run's passes make.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StageLoad:
    """What a stage's framework terms multiply, for one operation or summed over a step's (arrays broadcast):
    ``roofline_s`` seconds at the roofline; ``small_s`` roofline seconds per token of a micro-batch on one GPU
    (the micro-batch term); ``units`` decode iterations or micro-batches; ``row_tokens`` decode rows computed,
    one token each, summed over iterations; ``steps`` per-step charges; ``extra_s`` seconds no term scales;
    ``gather_s`` seconds of the sharded parameters' gathers at the nominal link; ``serial_s`` seconds of the
    collectives on a pass's critical path at the nominal link (Megatron's tensor-parallel all-reduces between a
    layer's matrix products, its gradients' all-reduce: nothing to overlap them with; priced at
    ``collective_frac``); the rollout engine's per-step
    costs (:meth:`oppo.sim.cost.framework.FrameworkCost.step_load`): ``reinit_steps`` re-initialisations of its KV
    cache, ``reshard_s`` seconds of the weights' reshard into it at the nominal links and ``reshard_layers`` the
    layers it reshards (its software: each tensor gathered whole and loaded into the engine, a call apiece),
    ``transfer_s`` seconds of its sleep mode's weight moves at the nominal links; ``host_s`` seconds of an
    offloaded role's parameters loaded onto its GPUs once a pass, at the nominal host link (serial: the pass waits
    for them); ``host_copy_s`` seconds of an offloaded role's shards copied in from the host before each gather
    (FSDP's CPU offload), at the nominal host link (prefetched with the gathers)."""

    roofline_s: float | np.ndarray = 0.0
    small_s: float | np.ndarray = 0.0
    units: float | np.ndarray = 0.0
    row_tokens: float | np.ndarray = 0.0
    steps: float | np.ndarray = 0.0
    extra_s: float | np.ndarray = 0.0
    gather_s: float | np.ndarray = 0.0
    serial_s: float | np.ndarray = 0.0
    reinit_steps: float | np.ndarray = 0.0
    reshard_s: float | np.ndarray = 0.0
    reshard_layers: float | np.ndarray = 0.0
    transfer_s: float | np.ndarray = 0.0
    host_s: float | np.ndarray = 0.0
    host_copy_s: float | np.ndarray = 0.0


@dataclass(frozen=True)
class StageCost:
    """One stage's framework terms: ``efficiency`` (what the framework achieves over the roofline, > 0: above 1
    where the GPU runs faster than its datasheet times the default fractions, :class:`oppo.sim.cost.gpu.Efficiency`,
    say; the roofline's figures are priors, never bounds),
    ``half_efficiency_tokens`` (micro-batch tokens per GPU at which a pass runs at half that), ``per_unit_s``
    (seconds per decode iteration or micro-batch), ``per_token_s`` (seconds per decode row per iteration, ``gen``
    only), ``fixed_s`` (seconds per step), ``gather_bandwidth_frac`` (achieved share of the nominal link of the
    sharded parameters' gathers, > 0; above 1 where the nominal link was set too low), ``exposed_gather_frac``
    (share of the smaller of compute and gathers that prefetch does not hide, [0, 1]) and ``exposed_host_frac``
    (share of the smaller of compute and the host's time, per_unit_s x units, that the GPU's queue does not hide,
    [0, 1]; 1: their sum), ``host_link_frac`` (achieved share of the nominal host link by an offloaded role's
    parameters, loaded once a pass or copied in before each gather, > 0); ``gen`` only:
    ``cache_reinit_s`` (seconds per step to re-initialise a freed KV cache), ``reshard_frac`` and ``transfer_frac``
    (achieved shares of the nominal links by the reshard into the engine and by its sleep mode's weight moves,
    > 0), ``reshard_layer_s`` (the reshard's software, seconds per layer resharded); ``collective_frac``, the
    achieved share of the nominal links by Megatron's collectives (``serial_s``, > 0)."""

    efficiency: float = 1.0
    half_efficiency_tokens: float = 0.0
    per_unit_s: float = 0.0
    per_token_s: float = 0.0
    fixed_s: float = 0.0
    gather_bandwidth_frac: float = 1.0
    # PyTorch FSDP issues a layer's all-gather while the previous layer computes; what stays exposed is the first
    # gather and the collectives' contention for the GPU [assumed prior; the fit moves it where gathers are timed]
    exposed_gather_frac: float = 0.1
    # the host's time per micro-batch (per_unit_s: Python, kernel launches, hooks) runs ahead of the GPU, which
    # queues the kernels: a pass costs the larger of the two plus this share of the smaller (1: their sum)
    exposed_host_frac: float = 1.0
    cache_reinit_s: float = 0.0
    reshard_frac: float = 1.0
    reshard_layer_s: float = 0.0
    transfer_frac: float = 1.0
    host_link_frac: float = 1.0
    # Megatron's collectives (serial_s: tensor-parallel all-reduces, pipeline sends, the gradients' reduction) at
    # this share of their nominal links: a term of its own, not FSDP's gather share (prefetched gathers overlapping
    # compute and collectives between a layer's matrix products are not one achieved bandwidth)
    collective_frac: float = 1.0

    def __post_init__(self) -> None:
        terms = (
            self.half_efficiency_tokens,
            self.per_unit_s,
            self.per_token_s,
            self.fixed_s,
            self.cache_reinit_s,
            self.reshard_layer_s,
        )
        links = (self.reshard_frac, self.transfer_frac, self.host_link_frac, self.collective_frac)
        if self.efficiency <= 0 or min(terms) < 0 or min(links) <= 0:
            raise ValueError("a stage needs efficiency > 0, link shares > 0 and its other terms >= 0")
        if self.gather_bandwidth_frac <= 0 or not 0 <= self.exposed_gather_frac <= 1:
            raise ValueError("a stage needs gather_bandwidth_frac > 0 and 0 <= exposed_gather_frac <= 1")
        if not 0 <= self.exposed_host_frac <= 1:
            raise ValueError("a stage needs 0 <= exposed_host_frac <= 1")

    def seconds(self, load: StageLoad):
        """Seconds of ``load`` under these terms: the one formula the simulator charges and the log fit fits."""
        compute = (load.roofline_s + self.half_efficiency_tokens * load.small_s) / self.efficiency
        host = load.units * self.per_unit_s
        if self.exposed_host_frac >= 1 or not _any(host):
            busy = compute + host
        else:  # the host runs ahead of the GPU: the larger, and what of the smaller shows
            larger, smaller = _larger_smaller(compute, host)
            busy = larger + self.exposed_host_frac * smaller
        if _any(load.gather_s) or _any(load.host_copy_s):  # prefetch: the larger of compute and gathers, and
            # what of the smaller shows; the host copies at the host link's share, the gathers at theirs
            gathers = load.gather_s / self.gather_bandwidth_frac + load.host_copy_s / self.host_link_frac
            larger, smaller = _larger_smaller(busy, gathers)
            busy = larger + self.exposed_gather_frac * smaller
        seconds = busy + load.row_tokens * self.per_token_s + load.steps * self.fixed_s + load.extra_s
        if _any(load.serial_s):  # Megatron's collectives at their link's achieved share, apart from FSDP's gathers
            seconds = seconds + load.serial_s / self.collective_frac
        if _any(load.host_s):  # the offloaded parameters, loaded before the pass starts
            seconds = seconds + load.host_s / self.host_link_frac
        moved = _any(load.reshard_s) or _any(load.reshard_layers) or _any(load.transfer_s)
        if moved or _any(load.reinit_steps):  # the rollout engine's per-step costs
            seconds = seconds + load.reinit_steps * self.cache_reinit_s + self.moves_s(load)
        return seconds

    def moves_s(self, load: StageLoad) -> float | np.ndarray:
        """Seconds of the rollout engine's weight moves of ``load``: the reshard's bytes at its links' achieved
        share and its software per layer, and sleep mode's moves at theirs."""
        reshard = load.reshard_s / self.reshard_frac + load.reshard_layers * self.reshard_layer_s
        return reshard + load.transfer_s / self.transfer_frac


def _larger_smaller(a, b):
    """The larger and the smaller of two loads, elementwise: two floats (one pass: the simulator prices hundreds of
    thousands a run) by the builtins, ~1 us less each than numpy's and a float back; else numpy's, broadcast."""
    if isinstance(a, float) and isinstance(b, float):
        return (a, b) if a >= b else (b, a)
    return np.maximum(a, b), np.minimum(a, b)


def _any(x) -> bool:
    """Whether a load term is nonzero anywhere: a float (the simulator's one pass) or an array (the fit's steps).
    np.any on a float costs ~10 us, and the simulator prices hundreds of thousands of passes."""
    return bool(x) if isinstance(x, float | int) else bool(np.any(x))


IDENTITY = StageCost()  # no framework terms: the roofline
