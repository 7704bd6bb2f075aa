"""The GPU layer of the cost stack: datasheet peaks (:mod:`oppo.catalog.gpus`) and the fraction of them a GPU achieves.

The links between GPUs: within a node the datasheet's, between nodes the setup's ``[cluster]`` (:class:`Cluster`).
The achieved fractions (:class:`Efficiency`) come from the datasheet times default factors, or are fitted by least
squares to measured operator timings (:func:`fit_roofline`): the real A100/H100/A40 per-layer profiles in
``oppo/data/profiles/`` (:func:`gpu_efficiencies`, ``python -m oppo.sim fit-gpus``). The engine layer
(:mod:`oppo.sim.cost.engine`) prices passes with them.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oppo.catalog.gpus import GPU, GPUS
from oppo.data import profile_dir

PROFILE_DIR = profile_dir()  # shipped with the package (oppo/data/profiles)


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of the datasheet: bandwidth for memory-bound passes, FLOP/s for compute-bound ones."""

    bandwidth_frac: float = 0.7
    flops_frac: float = 0.65
    train_flops_frac: float = 0.45  # training adds recomputation, optimizer and communication stalls
    layer_overhead_s: float = 5e-6  # fixed time per layer per pass (kernel launches)


@dataclass(frozen=True)
class Cluster:
    """How the GPUs are wired beyond one node. A collective whose GPUs sit on several nodes (a sharded pass's
    gathers, a rollout engine's tensor-parallel all-reduce) runs NCCL's rings, one channel per network card: each
    channel's ring crosses each node boundary once, over a card of its own, while the rest of its hops stay on the
    intra-node link. So the k GPUs a collective has in a node, a card each, carry it at k cards' bandwidth per GPU,
    up to the intra-node link (2 nodes of 8 H100: 8 x 50 = 400 GB/s, under NVLink's 450; 2 nodes of 4 A100: 4 x 25 =
    100 GB/s), the node where it has fewest GPUs setting the pace. The card's figure is per GPU per direction:
    ``inter_node_bytes_per_s`` (setup field); 0 takes the GPU's reference system
    (:attr:`oppo.catalog.gpus.GPU.nic_bytes_per_s`, e.g. 50 GB/s, one 400 Gb/s NDR card per H100 of a DGX H100).
    Within a node, the GPU's own link. GPUs are numbered from the first node's first GPU and nodes split them at
    multiples of ``gpus_per_node``: GPUs 3 and 4 at 4 per node sit on two nodes. The fit scales whichever link a
    collective runs on (a stage's ``gather_bandwidth_frac``, Megatron's ``collective_frac``): the figure here is a
    prior, not a floor."""

    gpus_per_node: int = 8
    inter_node_bytes_per_s: float = 0.0

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.inter_node_bytes_per_s < 0:
            raise ValueError("cluster needs gpus_per_node >= 1 and inter_node_bytes_per_s >= 0")

    def nic_bytes_per_s(self, gpu: GPU) -> float:
        """The inter-node link per GPU per direction: the setup's, else the GPU's reference system's."""
        nic = self.inter_node_bytes_per_s or gpu.nic_bytes_per_s
        if nic <= 0:
            raise ValueError(f"gpu {gpu.name!r} names no network card: set [cluster] inter_node_bytes_per_s")
        return nic

    def link_bytes_per_s(
        self, gpu: GPU, first: int, n_gpus: int, group: int = 0, stride: int = 1, members: list | None = None
    ) -> float:
        """Per-GPU bandwidth of the collectives over GPUs ``first`` .. ``first + n_gpus - 1``, ``group`` GPUs each
        (0: one collective over all of them; a rollout engine's tensor-parallel groups: its degree), or with
        ``stride`` > 1 groups of GPUs that far apart, side by side:
        the intra-node link where every group sits in one node; a group across nodes at its fewest GPUs in one node
        times a card each, up to the intra-node link (the class's rings), the slowest group setting the pace (the
        others wait); ``members``: the groups named GPU by GPU (:func:`megatron_groups`)."""
        if members is not None:
            pass
        elif stride > 1:
            members = [range(first + j, first + n_gpus, stride) for j in range(stride)]
        else:
            size = group or n_gpus
            members = [range(start, min(start + size, first + n_gpus)) for start in range(first, first + n_gpus, size)]
        cards = []  # per group across nodes: its fewest GPUs in one of them
        for gpus in members:
            per_node = Counter(g // self.gpus_per_node for g in gpus)
            if len(per_node) > 1:
                cards.append(min(per_node.values()))
        if not cards:
            return gpu.link_bytes_per_s
        return min(gpu.link_bytes_per_s, min(cards) * self.nic_bytes_per_s(gpu))


def megatron_groups(first: int, n_gpus: int, tp: int, pp: int) -> dict[str, list[range]]:
    """Megatron-LM's process groups over GPUs ``first`` .. ``first + n_gpus - 1`` in its rank order (tensor, then
    data, then pipeline parallel: ``initialize_model_parallel``'s default ``tp-cp-ep-dp-pp``, and the order of the
    older Megatron-LM it replaced): a tensor-parallel group is ``tp`` neighbours; a data-parallel group the GPUs of one
    pipeline stage's block (n / pp of them) ``tp`` apart; a pipeline group one GPU of each block, n / pp apart."""
    block = n_gpus // pp  # the GPUs of one pipeline stage: tp x dp
    return {
        "tensor": [range(s, s + tp) for s in range(first, first + n_gpus, tp)],
        "data": [range(b + j, b + block, tp) for b in range(first, first + n_gpus, block) for j in range(tp)],
        "pipeline": [range(first + j, first + n_gpus, block) for j in range(block)],
    }


def lookup(table: dict, name: str, what: str):
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; choose from {', '.join(sorted(table))}")
    return table[name]


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
    GPUs without a profile inherit one (the efficiency applies to their own datasheet figures): H200, GH200, H20,
    H800, B200, MI300X from H100 (the closest HBM datacenter part profiled), A100-40GB and A800 from A100, L40S from
    A40 (GDDR);
    where both GPUs' matmul ceilings were measured (:attr:`oppo.catalog.gpus.GPU.matmul_frac`), the FLOP/s
    fractions scaled by their ratio (:func:`derived_fit`)."""
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
        "h20": "h100",
        "h800": "h100",
        "b200": "h100",
        "mi300x": "h100",
        "a100-40gb": "a100",
        "a800": "a100",
        "l40s": "a40",
    }
    for derived, source in derived_from.items():
        fits[derived] = derived_fit(fits[source], GPUS[source], GPUS[derived])
    return fits


def derived_fit(fit: ProfileFit, source: GPU, derived: GPU) -> ProfileFit:
    """The profile ``fit`` of GPU ``source`` for a GPU without a profile of its own: its fractions of the datasheet,
    the FLOP/s ones (forward and training) times ``derived.matmul_frac / source.matmul_frac`` where both were
    measured. The Vidur profiles' FLOP/s fractions of A100 and H100 (0.658 and 0.616: per-layer products of real
    shapes, under a best-shape ceiling) stand in the ratio of their measured ceilings (87% and 80%) to 1.3%; an
    MI300X's GEMMs reach 51% of its datasheet, so the H100's fractions would price them 1.57x too fast. The
    training fraction is a prior (:class:`Efficiency`), not fitted: it is scaled alike. The bandwidth fraction and
    the per-layer time stay (not a matrix product's)."""
    if not (source.matmul_flops and derived.matmul_flops):
        return fit
    ratio = derived.matmul_frac / source.matmul_frac
    e = fit.efficiency
    scaled = dataclasses.replace(e, flops_frac=e.flops_frac * ratio, train_flops_frac=e.train_flops_frac * ratio)
    return dataclasses.replace(fit, efficiency=scaled)
