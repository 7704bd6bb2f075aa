"""Cost models: seconds for decode, prefill, train and weight sync. They know nothing of SimPy.

One implementation, two sources of its efficiency factors:
- analytic: datasheet bandwidth and FLOP/s times default efficiencies;
- fitted: efficiencies fitted by least squares to measured operator timings (:func:`fit_roofline`), e.g. the
  real A100/H100/A40 profiles in ``oppo/data/profiles/`` (:func:`gpu_efficiencies`).

The time of a pass is ``max(bytes / achieved_bandwidth, flops / achieved_flops)`` (a roofline): decode is
bandwidth-bound (weights + KV cache read once per iteration), prefill and training compute-bound. The measured
profiles hold the linear layers only; attention is modelled analytically (KV bytes read in decode, 4·L·H FLOPs
per attended (query, key) pair in prefill and training) with the same efficiencies.

The cost stack: GPU datasheet (:mod:`oppo.gpus`) -> this engine level (with :mod:`oppo.sim.hardware`) -> the
framework layer on top of it (:mod:`oppo.sim.framework`).
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from oppo.data import profile_dir
from oppo.sim.hardware import GPU, Engine, ModelShape

PROFILE_DIR = profile_dir()  # shipped with the package (oppo/data/profiles)


class CostModel(Protocol):
    """Seconds of one operation of one role on its device group. Arrays broadcast (decode is vectorised).
    ``attended``: (query, key) pairs of the pass (see :func:`pass_attended`)."""

    def decode_s(self, batch: np.ndarray, context_tokens: np.ndarray) -> np.ndarray: ...

    def prefill_s(self, tokens: float, attended: float, rows: float = 1) -> float: ...

    def score_s(self, tokens: float, attended: float, rows: float = 1) -> float: ...

    def train_s(self, tokens: float, attended: float, rows: float = 1) -> float: ...

    def sync_s(self) -> float: ...

    def transfer_s(self) -> float: ...

    def fixed_s(self, stages: tuple[str, ...]) -> float:
        """Per-step seconds of the given framework stages (see :mod:`oppo.sim.framework`)."""
        ...


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of the datasheet: bandwidth for memory-bound passes, FLOP/s for compute-bound ones."""

    bandwidth_frac: float = 0.7
    flops_frac: float = 0.65
    train_flops_frac: float = 0.45  # training adds recomputation, optimizer and communication stalls
    layer_overhead_s: float = 5e-6  # fixed time per layer per pass (kernel launches)


ALLREDUCE_LATENCY_S = 10e-6  # [assumed] one small all-reduce between the GPUs of a node (NCCL/RCCL, one launch)


@dataclass(frozen=True)
class RooflineCost:
    """Cost of one model replicated data-parallel on ``n_gpus`` GPUs (batch split evenly across them).

    Generation (:meth:`decode_s`) reads three more settings of the rollout engine: ``tensor_parallel`` GPUs per
    engine (weights and KV cache split over them, two all-reduces of the activations per layer per iteration over
    the GPU's intra-node link; ``n_gpus / tensor_parallel`` engines each decode their share of the batch),
    ``kv_budget_bytes`` per GPU (a batch whose KV cache does not fit runs in waves: each wave reads the weights
    again), and ``eager_decode`` (every layer launches its kernels each iteration, ``layer_overhead_s`` apiece;
    with CUDA graphs an iteration is one launch)."""

    model: ModelShape
    gpu: GPU
    n_gpus: int
    engine: Engine
    efficiency: Efficiency = Efficiency()
    link_bytes_per_s: float = 200e9  # weight sync link (NVLink-class)
    optimizer_bytes_per_param: float = 16.0  # Adam: fp32 master, m, v read + written
    tensor_parallel: int = 1
    kv_budget_bytes: float = math.inf
    eager_decode: bool = True
    allreduce_bytes_per_s: float = 0.0  # the tensor-parallel all-reduce's link (0: the GPU's intra-node link)

    def __post_init__(self) -> None:
        if self.tensor_parallel < 1 or self.n_gpus % self.tensor_parallel:
            raise ValueError(
                f"rollout tensor parallel {self.tensor_parallel} does not divide the {self.n_gpus} generating GPUs"
            )
        if self.kv_budget_bytes <= 0:
            raise ValueError("the rollout engine's KV budget must be > 0 bytes per GPU")

    @property
    def _bandwidth(self) -> float:
        return self.gpu.hbm_bytes_per_s * self.efficiency.bandwidth_frac

    @property
    def _flops(self) -> float:
        return self.gpu.peak_flops * self.efficiency.flops_frac

    def decode_s(self, batch, context_tokens):
        """One decode iteration: ``batch`` sequences each emit one token; ``context_tokens`` summed over them."""
        tp, m = self.tensor_parallel, self.model
        engines = self.n_gpus // tp
        batch = np.asarray(batch, dtype=float) / engines  # one engine's share (on its tp GPUs)
        context = np.asarray(context_tokens, dtype=float) / engines
        waves = 1.0
        if self.kv_budget_bytes < math.inf:  # KV of the engine's share over its budget: waves, each a share of it
            waves = np.maximum(1.0, np.ceil(m.kv_bytes_per_token * context / (self.kv_budget_bytes * tp)))
            batch, context = batch / waves, context / waves
        read = m.weight_bytes + m.kv_bytes_per_token * context  # the engine's; its GPUs read 1 / tp of it each
        memory_s = read / (self._bandwidth * self.engine.decode_efficiency)
        compute_s = m.forward_flops(batch, context) / self._flops
        if tp > 1:
            memory_s, compute_s = memory_s / tp, compute_s / tp
        overhead_s = self.engine.decode_step_overhead_s + self._decode_launch_s + self._allreduce_s(batch)
        return waves * (np.maximum(memory_s, compute_s) + overhead_s)

    @property
    def _decode_launch_s(self) -> float:
        """Launch and weight-gather time of one decode iteration."""
        if self.eager_decode:
            return self._pass_overhead_s
        return self._pass_overhead_s - (self.model.layers - 1) * self.efficiency.layer_overhead_s

    def _allreduce_s(self, rows):
        """Tensor parallel: two all-reduces per layer of ``rows`` activations (ring: 2 (t - 1) / t of them cross
        the link); 0 without."""
        tp, m = self.tensor_parallel, self.model
        if tp == 1:
            return 0.0
        moved = 2 * (tp - 1) / tp * rows * m.hidden * m.bytes_per_param
        link = self.allreduce_bytes_per_s or self.gpu.link_bytes_per_s
        return 2 * m.layers * (ALLREDUCE_LATENCY_S + moved / link)

    @property
    def _pass_overhead_s(self) -> float:
        gather_bw = self.engine.weight_gather_bytes_per_s
        gather_s = self.model.weight_bytes / gather_bw if gather_bw > 0 and self.n_gpus > 1 else 0.0
        return self._launch_s + gather_s

    def prefill_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        """A forward pass over ``tokens`` new tokens attending to ``attended`` (query, key) pairs in all
        (``rows`` sequences: the framework layer counts micro-batches; the roofline does not need it)."""
        if tokens <= 0:
            return 0.0
        return self._forward_s(tokens, attended) + self._pass_overhead_s

    def _forward_s(self, tokens: float, attended: float) -> float:
        m, n = self.model, self.n_gpus
        compute_s = m.forward_flops(tokens / n, attended / n) / self._flops
        return max(m.weight_bytes / self._bandwidth, compute_s) / self.engine.forward_efficiency

    @property
    def _launch_s(self) -> float:
        """Kernel launches of one pass: a fixed time per layer."""
        return self.model.layers * self.efficiency.layer_overhead_s

    def score_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        """A scoring forward pass: a prefill of the same tokens without the generation engine's weight gather
        (the parameter gathers of scoring and training passes are the framework layer's: bytes over the
        interconnect per micro-batch where it shards the parameters, :class:`oppo.sim.framework.FrameworkCost`)."""
        if tokens <= 0:
            return 0.0
        return self._forward_s(tokens, attended) + self._launch_s

    def train_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        """Forward + backward (3x forward FLOPs) and one optimizer step."""
        if tokens <= 0:
            return 0.0
        m, n = self.model, self.n_gpus
        compute_s = (
            3 * m.forward_flops(tokens / n, attended / n) / (self.gpu.peak_flops * self.efficiency.train_flops_frac)
        )
        optimizer_s = m.params * self.optimizer_bytes_per_param / n / self._bandwidth
        return compute_s + optimizer_s + 3 * self._launch_s  # gathers: the framework layer's, as in score_s

    def sync_s(self) -> float:
        """Weight sync after an update: only an engine with its own weight copy (vLLM) needs one."""
        return self.transfer_s() if self.engine.needs_weight_sync else 0.0

    def transfer_s(self) -> float:
        """Pushing the weights to other devices (a rollout engine on its own GPUs)."""
        return self.model.weight_bytes / self.link_bytes_per_s


def pass_attended(tokens: float, context: float, batch: float) -> float:
    """(query, key) pairs of a causal pass of ``tokens`` new tokens over ``batch`` equal rows that already
    cache ``context`` tokens in all: N * (C/B + N/(2B))."""
    b = max(batch, 1)
    return tokens * (context / b + tokens / (2 * b))


# ---------------------------------------------------------------------------------------------------------
# Fitting efficiencies to measurements
# ---------------------------------------------------------------------------------------------------------


def fit_roofline(bytes_read, flops, seconds, max_bandwidth: float = np.inf, rounds: int = 20):
    """Least squares of ``seconds ≈ c + max(a·bytes, b·flops)``; returns (c, a, b): fixed seconds per pass,
    1/bandwidth and 1/FLOP/s.

    Alternates: assign each row to the term that dominates under the current fit, then solve the linear least
    squares ``seconds ≈ c + a·bytes·[memory] + b·flops·[compute]``. Rows are weighted by 1/seconds² so that
    the fit minimises relative error. Starts from the lowest-intensity third as memory-bound. Within one model
    shape the fixed term and the bytes term are collinear; ``max_bandwidth`` (the datasheet) bounds the fitted
    bandwidth so that the split stays physical (otherwise on-chip cache hits read as > 100% of HBM).
    """
    intensity = flops / bytes_read
    memory = intensity <= np.quantile(intensity, 1 / 3)
    w = 1.0 / np.maximum(seconds, 1e-12)
    c = a = b = 0.0
    for _ in range(rounds):
        design = np.stack([np.ones_like(seconds), bytes_read * memory, flops * ~memory], axis=1)
        (c, a, b), *_ = np.linalg.lstsq(design * w[:, None], seconds * w, rcond=None)
        if a < 1 / max_bandwidth:  # refit the rest with the bandwidth at its bound
            a = 1 / max_bandwidth
            rest = seconds - a * bytes_read * memory
            (c, b), *_ = np.linalg.lstsq(design[:, [0, 2]] * w[:, None], rest * w, rcond=None)
        c = max(c, 0.0)
        new = a * bytes_read >= b * flops
        if (new == memory).all():
            break
        memory = new
    return float(c), float(a), float(b)


@dataclass(frozen=True)
class ProfileFit:
    gpu: str
    efficiency: Efficiency
    rows: int
    heldout_median_abs_err: float  # relative, on 20% held-out rows
    heldout_p90_abs_err: float


def fit_gpu_profile(gpu: GPU, rows: list[dict[str, str]], seed: int = 0) -> ProfileFit:
    """Fit one GPU's bandwidth and FLOP/s efficiencies to its per-layer linear-operator timings."""
    h = np.array([float(r["n_embd"]) for r in rows])
    m = np.array([float(r["n_expanded_embd"]) for r in rows])
    heads, kv = (np.array([float(r[k]) for r in rows]) for k in ("n_head", "n_kv_head"))
    gated = np.array([r["use_gated_mlp"] == "True" for r in rows])
    tp = np.array([float(r["tensor_parallel"]) for r in rows])
    tokens = np.array([float(r["num_tokens"]) for r in rows])
    seconds = np.array([float(r["layer_ms"]) for r in rows]) / 1e3
    params = (h * (h + 2 * kv * h / heads) + h * h + np.where(gated, 3, 2) * h * m) / tp
    bytes_read, flops = 2 * params, 2 * params * tokens  # bf16 weights; 2 FLOPs per multiply-add
    test = np.random.default_rng(seed).random(len(rows)) < 0.2  # held out
    c, a, b = fit_roofline(bytes_read[~test], flops[~test], seconds[~test], max_bandwidth=gpu.hbm_bytes_per_s)
    predicted = c + np.maximum(a * bytes_read[test], b * flops[test])
    err = np.abs(predicted - seconds[test]) / seconds[test]
    eff = Efficiency(bandwidth_frac=1 / a / gpu.hbm_bytes_per_s, flops_frac=1 / b / gpu.peak_flops, layer_overhead_s=c)
    return ProfileFit(gpu.name, eff, int((~test).sum()), float(np.median(err)), float(np.quantile(err, 0.9)))


@functools.cache
def gpu_efficiencies(path: str | None = None) -> dict[str, ProfileFit]:
    """Fitted efficiencies per GPU from ``oppo/data/profiles/vidur_layer_ms.csv`` (tensor-parallel degree 1 rows).
    GPUs without a profile inherit one (the efficiency applies to their own datasheet figures): H200, GH200,
    B200, MI300X from H100 (the closest HBM datacenter part profiled), A100-40GB from A100, L40S from A40 (GDDR)."""
    from oppo.sim.hardware import GPUS

    path = Path(path) if path else PROFILE_DIR / "vidur_layer_ms.csv"
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    fits = {}
    rows = [r for r in rows if r["tensor_parallel"] == "1"]  # our roles are data-parallel replicas
    for name in sorted({r["gpu"] for r in rows}):
        fits[name] = fit_gpu_profile(GPUS[name], [r for r in rows if r["gpu"] == name])
    derived_from = {
        "h200": "h100",
        "gh200": "h100",
        "b200": "h100",
        "mi300x": "h100",
        "a100-40gb": "a100",
        "l40s": "a40",
    }
    for derived, source in derived_from.items():
        fits[derived] = fits[source]
    return fits
