"""How far to trust a prediction made with a calibrated setup: the interval its calibration's errors give, and the
terms of the setup that leave the span of the runs it was calibrated on.

``calibrate-log`` records what it fitted on (:class:`oppo.sim.cost.framework.Calibration`, written into
``framework.toml`` or the calibrated ``setup.toml``): with several logs, the half-width of the interval that holds
``coverage`` (80%) of the steps when each run is predicted by a layer fitted without it and its siblings
(leave-one-group-out, each run weighted alike); with one log, of its own validated steps. ``validate-log``, ``run``,
``compare``, ``sweep`` and ``plan`` on such a setup say that interval and name what extrapolates: more GPUs or
nodes than any calibration run, a model outside [half the smallest, twice the largest], another GPU, algorithm or
rollout engine reset, group sampling where no run sampled groups, a longer response cap.
"""

from __future__ import annotations

import math

import numpy as np

from oppo.sim.cost.engine import model_shape
from oppo.sim.cost.framework import Calibration
from oppo.sim.setups import Setup

COVERAGE = 0.8  # share of predicted steps an interval holds
MODEL_SPAN = 2.0  # a model this many times larger than the largest (or smaller than the smallest) extrapolates


def total_gpus(setup: Setup) -> int:
    p = setup.placement
    return p.actor_gpus + (p.reward_gpus if p.kind == "disaggregated" and setup.reward else 0)


def nodes(setup: Setup) -> int:
    return math.ceil(total_gpus(setup) / setup.cluster.gpus_per_node)


def params_b(setup: Setup) -> float:
    return model_shape(setup.actor).params / 1e9


def weighted_quantile(errors: list[np.ndarray], q: float) -> float:
    """The ``q`` quantile of the absolute errors of every run's steps, each run weighing alike whatever its steps."""
    values = np.concatenate(errors)
    weights = np.concatenate([np.full(len(e), 1 / len(e)) for e in errors])
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][np.searchsorted(cumulative, q)])


def calibration(
    setups: list[Setup], errors: dict[str, list[np.ndarray]], basis: str, coverage: float = COVERAGE
) -> Calibration:
    """The record of a calibration on ``setups`` whose predictions missed by ``errors`` (stage, with "step" -> per
    run, the absolute relative error of each predicted step)."""
    stages = tuple(stage for stage in errors if stage != "step")

    def span(values):
        return (min(values), max(values))

    return Calibration(
        runs=tuple(s.name for s in setups),
        basis=basis,
        coverage=coverage,
        step_err=weighted_quantile(errors["step"], coverage),
        stages=stages,
        stage_err=tuple(weighted_quantile(errors[stage], coverage) for stage in stages),
        gpus=span([total_gpus(s) for s in setups]),
        nodes=span([nodes(s) for s in setups]),
        params_b=span([round(params_b(s), 3) for s in setups]),
        max_new_tokens=span([s.max_new_tokens for s in setups]),
        gpu_names=tuple(sorted({s.gpu for s in setups})),
        algos=tuple(sorted({s.algo for s in setups})),
        group_sizes=tuple(sorted({s.group_size for s in setups})),
        kv_cache_resets=tuple(sorted({s.framework.kv_cache_reset for s in setups})),
    )


def extrapolations(setup: Setup) -> list[str]:
    """The terms of ``setup`` outside the span of its calibration runs, each a phrase (none: inside, or not
    calibrated)."""
    c = setup.framework.calibration
    if not c.runs:
        return []
    found = []
    gpus, node_count, size = total_gpus(setup), nodes(setup), params_b(setup)
    if not c.gpus[0] <= gpus <= c.gpus[1]:
        found.append(f"{gpus} GPUs (calibrated on {c.gpus[0]}-{c.gpus[1]})")
    if node_count > c.nodes[1]:
        found.append(f"{node_count} nodes (calibrated on at most {c.nodes[1]}: the network at its prior)")
    if not c.params_b[0] / MODEL_SPAN <= size <= c.params_b[1] * MODEL_SPAN:
        found.append(f"a {size:.2g}B-parameter model (calibrated on {c.params_b[0]:.2g}B-{c.params_b[1]:.2g}B)")
    if setup.max_new_tokens > c.max_new_tokens[1]:
        found.append(f"responses capped at {setup.max_new_tokens} tokens (calibrated up to {c.max_new_tokens[1]})")
    for what, value, seen in (
        ("GPU", setup.gpu, c.gpu_names),
        ("algorithm", setup.algo, c.algos),
        ("rollout kv_cache_reset", setup.framework.kv_cache_reset, c.kv_cache_resets),
    ):
        if value not in seen:
            found.append(f"{what} {value!r} (calibrated on {', '.join(map(repr, seen))})")
    if setup.group_size > 1 and max(c.group_sizes) == 1:
        found.append(f"group sampling (n = {setup.group_size}) where no calibration run sampled groups")
    return found


def trust_note(setup: Setup) -> str | None:
    """One line for a prediction on a calibrated setup: its interval and what extrapolates (None: uncalibrated)."""
    c = setup.framework.calibration
    if not c.runs:
        return None
    basis = "leave-one-group-out" if c.basis == "leave_one_group_out" else "its own validated steps"
    note = (
        f"note: {setup.name} predicts a step to ±{c.step_err:.0%} ({c.coverage:.0%} of steps, {basis} over "
        f"{len(c.runs)} calibration run{'s' if len(c.runs) > 1 else ''})"
    )
    outside = extrapolations(setup)
    return note + ("; extrapolates: " + "; ".join(outside) if outside else "; within the calibration span")
