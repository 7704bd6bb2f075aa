"""The frozen simple layer the full framework layer is compared against (``docs/simulator.md``, "A model no bigger
than its data"): on the same replayed loads, a roofline with one fitted efficiency per pass kind (generation, the
forward passes, the training passes; every physical second at its nominal figure divided by it, summed), the host's
time per micro-batch of the forward and training passes, a per-step constant for generation, and a rule reward's
CPU time per sequence. Seven terms, fitted by non-negative least squares of the relative error, no priors.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from oppo.sim.cost.fit import SHARED_TERMS, nonnegative_lstsq, slice_load, sum_loads
from oppo.sim.cost.stage import StageCost, StageLoad
from oppo.sim.logs.fit import LoggedRun, fitted_stages, parts_timed

KINDS = {"gen": ("gen",), "forward": (*SHARED_TERMS[0], "reward"), "training": SHARED_TERMS[1]}
# the loads in seconds at a nominal figure: each divided by the kind's efficiency
NOMINAL = ("roofline_s", "gather_s", "serial_s", "host_s", "host_copy_s", "reshard_s", "transfer_s")


def kind_of(stage: str) -> str | None:
    return next((kind for kind, stages in KINDS.items() if stage in stages), None)


def simple_terms(inverse: float, per_unit_s: float = 0.0, fixed_s: float = 0.0) -> StageCost:
    """The simple layer's terms as a :class:`StageCost`: every nominal second over one efficiency, summed."""
    e = 1.0 / max(inverse, 1e-12)
    return StageCost(
        efficiency=e,
        per_unit_s=per_unit_s,
        fixed_s=fixed_s,
        gather_bandwidth_frac=e,
        collective_frac=e,
        exposed_gather_frac=1.0,
        exposed_host_frac=1.0,
        host_link_frac=e,
        reshard_frac=e,
        transfer_frac=e,
    )


def _nominal(load: StageLoad, n: int) -> np.ndarray:
    return sum(np.broadcast_to(np.asarray(getattr(load, f), dtype=float), (n,)) for f in NOMINAL)


def fit_simple(runs: list[LoggedRun], whole: bool = True) -> dict[str, StageCost]:
    """The simple layer fitted on the runs' steps (``whole``: all of them; else each run's fitted steps)."""
    rows: dict[str, list] = defaultdict(list)  # kind (or "rule") -> [(load, measured)]
    for run in runs:
        part = slice(None) if whole else slice(0, run.n_fit)
        steps = list(run.log.steps[part])
        for stage in fitted_stages(run.setup, run.log):
            parts = parts_timed(run.setup, stage)
            kinds = {kind_of(p) for p in parts}
            if len(kinds) != 1 or None in kinds:
                continue  # a composite across kinds (OpenRLHF's) or a weight push: not in the comparison's runs
            load = slice_load(sum_loads([run.replayed.loads[p] for p in parts]), part)
            measured = np.array([s.stages[stage] for s in steps])
            rule = parts == ["reward"] and run.setup.reward is None
            rows["rule" if rule else kinds.pop()].append((load, measured))
    layer: dict[str, StageCost] = {}
    for kind, pairs in rows.items():
        terms = _fit_kind(kind, pairs)
        for stage in ("reward",) if kind == "rule" else KINDS[kind]:
            if stage != "reward" or kind == "rule":  # a reward model takes the forward terms where it runs one
                layer[stage] = terms
    return layer


def _fit_kind(kind: str, pairs: list) -> StageCost:
    """One kind's terms by non-negative least squares of the relative error over its rows."""
    columns, targets = [], []
    for load, measured in pairs:
        n = len(measured)
        timed = measured > 0
        m = measured[timed]
        extra = np.broadcast_to(np.asarray(load.extra_s, dtype=float), (n,))[timed]
        units = np.broadcast_to(np.asarray(load.units, dtype=float), (n,))[timed]
        if kind == "rule":
            cols = [units]
        else:
            cols = [_nominal(load, n)[timed]]
            cols.append(np.broadcast_to(np.asarray(load.steps, dtype=float), (n,))[timed] if kind == "gen" else units)
        columns.append(np.stack(cols, axis=1) / m[:, None])
        targets.append((m - extra) / m)
    x = nonnegative_lstsq(np.concatenate(columns), np.concatenate(targets))
    if kind == "rule":
        return StageCost(per_unit_s=float(x[0]))
    if kind == "gen":
        return simple_terms(float(x[0]), fixed_s=float(x[1]))
    return simple_terms(float(x[0]), per_unit_s=float(x[1]))
