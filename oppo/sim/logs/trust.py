"""How far to trust a prediction made with a calibrated setup: the interval its calibration's errors give, and the
terms of the setup that leave the span of the runs it was calibrated on.

``calibrate-log`` records what it fitted on (:class:`oppo.sim.cost.span.Calibration`, written into
``framework.toml`` or the calibrated ``setup.toml``): with several logs, the half-width of the interval that holds
``coverage`` (80%) of the steps when each run is predicted by a layer fitted without it and its siblings
(leave-one-group-out, each run weighted alike); with one log, of its own validated steps. ``validate-log``, ``run``,
``compare``, ``sweep`` and ``plan`` on such a setup say that interval and name what extrapolates: more GPUs or
nodes than any calibration run, a model outside [half the smallest, twice the largest], another GPU, algorithm,
rollout engine version (vLLM's scheduler, CUDA graphs, chunked prefill, tokens per iteration: "unknown" where a
log does not state it) or reset, training backend, a training tensor- or pipeline-parallel degree or an update
micro-batch outside the runs', group sampling where no run sampled groups, a longer response cap, a role offloaded
or weights pushed to a rollout engine of its own where no run did (their links at their priors), forward
micro-batches of a work outside [half the least, twice the most] of the runs' (the host's time per micro-batch
shows or hides). The interval and the note the commands print are :mod:`oppo.sim.logs.interval`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from oppo.core.config import ScheduleConfig
from oppo.sim.cost.engine import model_shape
from oppo.sim.cost.fit import SHARED_TERMS
from oppo.sim.cost.framework import ROLE_STAGES, SHARED_LAYER, read_layer, shared_layer
from oppo.sim.cost.span import Calibration
from oppo.sim.setup.presets import Setup

COVERAGE = 0.8  # share of predicted steps an interval holds
BASES = {  # what the interval's errors are, in words
    "leave_one_group_out": "each run predicted without its group",
    "leave_one_out": "each run predicted without itself (its siblings kept: no run had a run outside its group)",
    "within": "its own validated steps",
}
# Phrases that say how a term is priced (a stage priced by its family's terms, the reshard's software as timed), not
# an axis on which the prediction leaves the runs: the calibration runs' own errors were measured priced so.
PRICING_NOTES = ("untimed stage", "reshard software", "link prior", "borrowed terms")
MODEL_SPAN = 2.0  # a model this many times larger than the largest (or smaller than the smallest) extrapolates


@functools.cache
def shared_calibration() -> Calibration:
    """What the shared layer (``oppo/data/framework/verl-shared.toml``) was fitted on: its ``[calibration]``."""
    table = read_layer(SHARED_LAYER).get("calibration", {})
    return Calibration(**{k: tuple(v) if isinstance(v, list) else v for k, v in table.items()})


def borrows_shared_terms(setup: Setup) -> bool:
    """Whether an uncalibrated setup prices its training framework's passes with the shared layer's terms (the paper
    presets: TRL's structure, :func:`oppo.sim.cost.framework.trl_layer`)."""
    fw, layer = setup.framework, shared_layer()
    family = SHARED_TERMS[0][:1] + SHARED_TERMS[1][:1]  # a forward pass's and a training pass's terms
    return not fw.calibration.runs and all(fw.stage(stage) == layer[stage] for stage in family)


def calibration_of(setup: Setup) -> Calibration:
    """The record a prediction on ``setup`` is judged by: its own layer's, else, where it borrows the shared
    layer's terms, the shared layer's (its runs' span and errors: the paper presets extrapolate from them), else
    none."""
    c = setup.framework.calibration
    return shared_calibration() if not c.runs and borrows_shared_terms(setup) else c


def nodes(setup: Setup) -> int:
    return math.ceil(setup.total_gpus / setup.cluster.gpus_per_node)


def params_b(setup: Setup) -> float:
    return model_shape(setup.actor).params / 1e9


def weighted_quantile(errors: list[np.ndarray], q: float) -> float:
    """The ``q`` quantile of the absolute errors of every run's steps, each run weighing alike whatever its steps."""
    values = np.concatenate(errors)
    weights = np.concatenate([np.full(len(e), 1 / len(e)) for e in errors])
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order]) / weights.sum()
    # the first value whose cumulative weight reaches q (the inverse of the weighted CDF); the tolerance keeps a
    # sum of floats that should equal q exactly from landing one value late
    index = np.searchsorted(cumulative, q - 1e-9)
    return float(values[order][min(index, len(values) - 1)])


def calibration(
    setups: list[Setup],
    errors: dict[str, list[np.ndarray]],
    basis: str,
    coverage: float = COVERAGE,
    groups: list | None = None,
) -> Calibration:
    """The record of a calibration on ``setups`` whose predictions missed by ``errors`` (stage, with "step" -> per
    run, the absolute relative error of each predicted step): the span of the runs, the intervals, and what widens
    the interval where a prediction extrapolates. An axis's widening is the largest median step error of the runs
    that lay outside the span of the other runs on it (each run against all the others, its siblings included).
    With ``groups`` (each run's group, :func:`oppo.sim.logs.shared.run_group`), also per run the interval the runs
    outside its group give: the figure it would have been predicted with had it been left out, which its own median
    step error falls inside or not (the coverage measured out of sample)."""
    stages = tuple(stage for stage in errors if stage != "step")
    run_err = [float(np.median(e)) for e in errors["step"]]
    held_out = ()
    if groups is not None and len(setups) > 1:
        held_out = tuple(
            weighted_quantile(others, coverage) if (others := _outside_group(errors["step"], groups, k)) else -1.0
            for k in range(len(setups))
        )
    widen: dict[str, float] = {}
    for k, setup in enumerate(setups):
        others = setups[:k] + setups[k + 1 :]
        if others:  # a run whose log does not state an engine setting differs from the others on it in nothing known
            for axis in {a for a, _ in outside_span(setup, _span(others), stated_only=True)} - set(PRICING_NOTES):
                widen[axis] = max(widen.get(axis, 0.0), run_err[k])
    return dataclasses.replace(
        _span(setups),
        basis=basis,
        coverage=coverage,
        step_err=weighted_quantile(errors["step"], coverage),
        stages=stages,
        stage_err=tuple(weighted_quantile(errors[stage], coverage) for stage in stages),
        run_step_err=tuple(run_err),
        axes=tuple(sorted(widen)),
        axis_err=tuple(widen[a] for a in sorted(widen)),
        held_out_step_err=held_out,
    )


def _outside_group(errors: list[np.ndarray], groups: list, k: int) -> list[np.ndarray]:
    """The step errors of the runs outside run ``k``'s group."""
    return [e for j, e in enumerate(errors) if groups[j] != groups[k]]


def held_out_inside(c: Calibration, step: float, widen: float = 0.0) -> list[bool] | None:
    """Per run with a held-out interval, whether its median step error falls inside the interval its other groups
    alone give (at least the widening ``widen`` a prediction's extrapolations add): the coverage out of sample. The
    calibration's own ``step`` stands for a run's where none is recorded. None: not measured (one run, or a record
    from before)."""
    if not c.held_out_step_err or c.basis == "within":
        return None
    pairs = [(e, h) for e, h in zip(c.run_step_err, c.held_out_step_err, strict=True) if h >= 0]
    return [e <= max(h, widen) for e, h in pairs] or None


def _span(setups: list[Setup]) -> Calibration:
    """The span of ``setups`` (no errors): the values or (min, max) a calibration records."""

    def span(values):
        return (min(values), max(values))

    return Calibration(
        runs=tuple(s.name for s in setups),
        gpus=span([s.total_gpus for s in setups]),
        nodes=span([nodes(s) for s in setups]),
        params_b=span([round(params_b(s), 3) for s in setups]),
        max_new_tokens=span([s.max_new_tokens for s in setups]),
        gpu_names=tuple(sorted({s.priced_as for s in setups})),
        algos=tuple(sorted({s.algo for s in setups})),
        group_sizes=tuple(sorted({s.group_size for s in setups})),
        kv_cache_resets=_seen(setups, "rollout kv_cache_reset"),
        engines=tuple(sorted({s.engine for s in setups})),
        engine_schedulers=_seen(setups, "engine (scheduler)"),
        engine_cuda_graphs=_seen(setups, "engine (CUDA graphs)"),
        engine_chunked_prefill=_seen(setups, "engine (chunked prefill)"),
        engine_batched_tokens=_seen(setups, "engine (max_num_batched_tokens)"),
        rollout_tensor_parallel=span([s.framework.rollout_tensor_parallel for s in setups]),
        weight_reshards=tuple(sorted({s.framework.weight_reshard for s in setups})),
        sharded=tuple(sorted({s.framework.sharded for s in setups})),
        train_backends=tuple(sorted({s.framework.train_backend for s in setups})),
        train_tensor_parallel=span([s.framework.train_tensor_parallel for s in setups]),
        train_pipeline_parallel=span([s.framework.train_pipeline_parallel for s in setups]),
        train_micro_batch=span([s.framework.train_micro_batch for s in setups]),
        offloads=tuple(sorted({",".join(offloaded(s)) or "none" for s in setups})),
        weight_pushes=tuple(sorted({bool(s.placement.rollout_gpus) for s in setups})),
        forward_gflop=span([round(forward_gflop(s), 3) for s in setups]),
    )


# the rollout engine's settings a calibration's span keeps, by axis: the Calibration field holding the runs' values
ENGINE_AXES = {
    "engine (scheduler)": "engine_schedulers",
    "engine (CUDA graphs)": "engine_cuda_graphs",
    "engine (chunked prefill)": "engine_chunked_prefill",
    "engine (max_num_batched_tokens)": "engine_batched_tokens",
    "rollout kv_cache_reset": "kv_cache_resets",
}
UNKNOWN = "unknown"


def engine_record(setup: Setup) -> dict[str, str]:
    """The rollout engine as the setup's log shows it, by axis of :data:`ENGINE_AXES`: each value as text, "unknown"
    where the log does not state it (``rollout_scheduler``, ``chunked_prefill``: "unknown"; ``max_num_batched_tokens``:
    0; ``decode_cuda_graphs``, ``kv_cache_reset``: named in ``engine_unstated``, priced at the value given)."""
    fw = setup.framework
    unstated = set(fw.engine_unstated)
    graphs = "CUDA graphs" if fw.decode_cuda_graphs else "eager"
    return {
        "engine (scheduler)": fw.rollout_scheduler,
        "engine (CUDA graphs)": UNKNOWN if "decode_cuda_graphs" in unstated else graphs,
        "engine (chunked prefill)": fw.chunked_prefill,
        "engine (max_num_batched_tokens)": str(fw.max_num_batched_tokens) if fw.max_num_batched_tokens else UNKNOWN,
        "rollout kv_cache_reset": UNKNOWN if "kv_cache_reset" in unstated else fw.kv_cache_reset,
    }


def _seen(setups: list[Setup], axis: str) -> tuple[str, ...]:
    return tuple(sorted({engine_record(s)[axis] for s in setups}))


def _engine_outside(setup: Setup, c: Calibration, stated_only: bool) -> list[tuple[str, str]]:
    """The rollout engine's settings of ``setup`` that no calibration run showed: a stated value no run's log stated,
    or (unless ``stated_only``: a run against the others, where an unknown is no known difference) an unknown where
    every run's log stated it."""
    found = []
    for axis, value in engine_record(setup).items():
        seen = getattr(c, ENGINE_AXES[axis])
        if not seen or value in seen or (stated_only and value == UNKNOWN):
            continue
        found.append((axis, f"{axis} {value!r} (calibrated on {', '.join(map(repr, seen))})"))
    return found


def offloaded(setup: Setup) -> list[str]:
    """The setup's offloaded roles, ``:each`` marking those copied in at every micro-batch (FSDP's CPU offload),
    and ``role:optimizer`` each trainer whose optimizer state is on the host."""
    fw = setup.framework
    params = [f"{role}:each" if role in fw.offload_each_micro_batch else role for role in fw.offload]
    return sorted([*params, *(f"{role}:optimizer" for role in fw.optimizer_offload)])


def forward_gflop(setup: Setup) -> float:
    """The work of one scoring forward micro-batch on one GPU, 2 x parameters x its rows x (prompt + response cap)
    tokens (over the training tensor-parallel degree), in GFLOP: small, a pass waits on the host's time per
    micro-batch (a 0.5B model's); large, that time hides behind compute (a 7B model's). A measure of scale for the
    calibration span, not the roofline's count (the parameters as held, a tied embedding once)."""
    fw = setup.framework
    rows = fw.forward_micro_batch or math.ceil(setup.batch * setup.group_size / setup.total_gpus)
    tokens = max(setup.lengths.prompt_tokens + setup.max_new_tokens, 0 if fw.packed else fw.pad_to_tokens)
    return 2 * model_shape(setup.actor).params * rows * tokens / fw.train_tensor_parallel / 1e9


def _family_extrapolations(setup: Setup, c: Calibration) -> list[str]:
    """The setup's stages that no calibration run timed, priced by the terms their family (``SHARED_TERMS``) was
    fitted on through its other stages: a critic's passes predicted from runs without one, say."""
    runs = {stage for role in setup.roles(setup.algo) for stage in ROLE_STAGES[role] if stage}
    found = []
    for family in SHARED_TERMS:
        timed = [stage for stage in family if stage in c.stages]
        untimed = [stage for stage in family if stage in runs and stage not in c.stages]
        if timed and untimed:
            found.append(
                f"{', '.join(untimed)} priced by the terms fitted on {', '.join(timed)} (no calibration run timed it)"
            )
    return found


def _reshard_extrapolations(setup: Setup, c: Calibration) -> list[str]:
    """The reshard's software per layer, fitted where a calibration run timed the reshard, charged to a setup
    that reshards: it transfers as a time per layer, whatever the setup's GPU, links or verl version (one run timed
    it, on one machine)."""
    layer_s = setup.framework.gen.reshard_layer_s
    resharded = setup.framework.weight_reshard and not setup.placement.rollout_gpus
    if not (resharded and layer_s > 0 and "reshard" in c.stages):
        return []
    return [f"the reshard's software, {layer_s:.3g} s a layer, as the calibration runs that timed it paid it"]


def as_run(setup: Setup, schedule: ScheduleConfig | None) -> Setup:
    """``setup`` as a prediction runs it: the batch, response cap, algorithm and group size of its ``schedule`` (the
    flags and stored config over the setup's own) and the GPUs its policy sets aside for generation, which the span
    is checked against."""
    if schedule is None:
        return setup
    sized = {k: getattr(schedule, k) for k in ("batch", "max_new_tokens", "algo", "group_size")}
    rollout = setup.placement.rollout_for(schedule.policy)  # async splits the actor's GPUs where none are set aside
    return dataclasses.replace(setup, placement=dataclasses.replace(setup.placement, rollout_gpus=rollout), **sized)


def extrapolations(setup: Setup, schedule: ScheduleConfig | None = None) -> list[str]:
    """The terms of ``setup`` run with ``schedule`` (None: the setup's own) outside the span of its calibration
    runs, each a phrase (none: inside, or not calibrated)."""
    c = calibration_of(setup)
    return [phrase for _, phrase in outside_span(as_run(setup, schedule), c)] if c.runs else []


def outside_span(setup: Setup, c: Calibration, stated_only: bool = False) -> list[tuple[str, str]]:
    """Each term of ``setup`` outside the span ``c`` records, as (its axis, a phrase naming it); with
    ``stated_only``, an engine setting the setup's log does not state is none (a calibration run against the
    others)."""
    found = []
    gpus, node_count, size = setup.total_gpus, nodes(setup), params_b(setup)
    if not c.gpus[0] <= gpus <= c.gpus[1]:
        found.append(("GPU count", f"{gpus} GPUs (calibrated on {c.gpus[0]}-{c.gpus[1]})"))
    if node_count > c.nodes[1]:
        network = (
            "the network cards at their datasheet figure, a ring channel over each (an assumed model no calibration "
            "run checks), times the gathers' share fitted within nodes"
        )
        found.append(("node count", f"{node_count} nodes (calibrated on at most {c.nodes[1]}: {network})"))
    if not c.params_b[0] / MODEL_SPAN <= size <= c.params_b[1] * MODEL_SPAN:
        span = f"{c.params_b[0]:.2g}B-{c.params_b[1]:.2g}B"
        found.append(("model size", f"a {size:.2g}B-parameter model (calibrated on {span})"))
    if setup.max_new_tokens > c.max_new_tokens[1]:
        cap = f"responses capped at {setup.max_new_tokens} tokens (calibrated up to {c.max_new_tokens[1]})"
        found.append(("response cap", cap))
    tp = setup.framework.rollout_tensor_parallel
    if c.rollout_tensor_parallel and not c.rollout_tensor_parallel[0] <= tp <= c.rollout_tensor_parallel[1]:
        span = c.rollout_tensor_parallel
        found.append(("rollout tensor parallel", f"rollout tensor parallel {tp} (calibrated on {span[0]}-{span[1]})"))
    for what, value, span in (
        ("training tensor parallel", setup.framework.train_tensor_parallel, c.train_tensor_parallel),
        ("training pipeline parallel", setup.framework.train_pipeline_parallel, c.train_pipeline_parallel),
        ("update micro-batches of", setup.framework.train_micro_batch, c.train_micro_batch),
    ):
        if span and not span[0] <= value <= span[1]:
            found.append((what.removesuffix(" of"), f"{what} {value} (calibrated on {span[0]}-{span[1]})"))
    for what, value, seen in (
        ("GPU", setup.priced_as, c.gpu_names),
        ("algorithm", setup.algo, c.algos),
        ("engine", setup.engine, c.engines),
        ("weight_reshard", setup.framework.weight_reshard, c.weight_reshards),
        ("sharded", setup.framework.sharded, c.sharded),
        ("train_backend", setup.framework.train_backend, c.train_backends),
    ):
        if seen and value not in seen:
            found.append((what, f"{what} {value!r} (calibrated on {', '.join(map(repr, seen))})"))
    found += _engine_outside(setup, c, stated_only)
    roles = [role for role in offloaded(setup) if not any(role in runs.split(",") for runs in c.offloads)]
    if c.offloads and roles:
        named = ", ".join(
            role.replace(":each", " (copied in at every micro-batch)").replace(":optimizer", "'s optimizer state")
            for role in roles
        )
        found.append(
            ("offload", f"{named} offloaded to the host (no calibration run offloaded it so: its link at its prior)")
        )
    if c.weight_pushes and setup.placement.rollout_gpus and True not in c.weight_pushes:
        found.append(
            (
                "weight push",
                "weights pushed to rollout GPUs of their own (no calibration run pushed: the push's link at its prior)",
            )
        )
    work = forward_gflop(setup)
    if c.forward_gflop and not c.forward_gflop[0] / MODEL_SPAN <= work <= c.forward_gflop[1] * MODEL_SPAN:
        lo, hi = c.forward_gflop
        found.append(
            (
                "forward micro-batch work",
                f"forward micro-batches of {work:.3g} GFLOP a GPU (calibrated on {lo:.3g}-{hi:.3g}: where the host's "
                "time per micro-batch shows or hides)",
            )
        )
    if borrows_shared_terms(setup):
        found.append(
            (
                "borrowed terms",
                "scoring and update priced with the terms the shared layer fitted on verl runs (HF models under FSDP, "
                "vLLM generation), here under another framework's structure; generation by its engine's declared "
                "terms, which no calibration run checks",
            )
        )
    if not setup.reads_its_link:
        spec = setup.gpu_spec
        found.append(
            (
                "link prior",
                f"the link read back from a {spec.link_read_from} run's passes "
                f"({spec.link_bytes_per_s / 1e9:.0f} GB/s) not taken for {setup.framework.train_backend}'s "
                f"collectives, no second signal agreeing: the prior's {spec.prior_link_bytes_per_s / 1e9:.0f} GB/s",
            )
        )
    found += [("untimed stage", p) for p in _family_extrapolations(setup, c)]
    found += [("reshard software", p) for p in _reshard_extrapolations(setup, c)]
    if setup.group_size > max(c.group_sizes):
        if max(c.group_sizes) == 1:
            found.append(
                ("group size", f"group sampling (n = {setup.group_size}) where no calibration run sampled groups")
            )
        else:
            found.append(("group size", f"groups of {setup.group_size} (calibrated up to {max(c.group_sizes)})"))
    return found
