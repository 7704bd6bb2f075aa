"""Several logs, one framework layer: the layer fitted across runs and how well it predicts each of them, within
(its validated steps), leave-one-run-out and leave-one-group-out (a run predicted from a layer fitted without it,
and without its siblings too), for ``calibrate-log`` with several ``--log`` (:mod:`oppo.sim.logs.fit` replays and fits
each log)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from oppo.sim.cost.fit import Pinned
from oppo.sim.cost.stage import StageCost
from oppo.sim.logs.fit import LoggedRun, fit_layer, parts_timed, with_layer
from oppo.sim.logs.report import replay_errors, step_errors
from oppo.sim.setup.presets import Setup


def shared_fidelity(
    runs: list[LoggedRun], pinned: Pinned = frozenset()
) -> tuple[dict[str, StageCost], dict, dict[str, list[np.ndarray]], str]:
    """The layer fitted on every run's fitted steps, and per run: ``within`` (that layer, with the reward terms of
    the run's scorer, on the run's validated steps), ``leave_one_out`` (the layer fitted on all steps of the other
    runs, on every step of this one; a stage no other run times, or a reward no other run scores alike, keeps the
    run's setup's own terms: marked ``not_fitted``) and ``leave_one_group_out`` (the same without the run's
    siblings too: :func:`run_group`); and the per-step errors of the predictions the interval is made of, per stage,
    one array per run, and which they are: leave-one-group-out where every run has a run outside its group, else
    leave-one-out. Every layer here holds ``pinned`` at their defaults (the bundled layer:
    :data:`~oppo.sim.cost.fit.FOLDED`)."""
    if len({run.name for run in runs}) < len(runs):
        raise ValueError("each --log needs a setup of its own name (two runs share one)")
    layer = fit_layer(runs, pinned=pinned)
    by_scorer = {rule: fit_layer(runs, rule=rule, pinned=pinned) for rule in {run.setup.reward is None for run in runs}}
    report, errors = {}, {"leave_one_out": defaultdict(list), "leave_one_group_out": defaultdict(list)}
    for run in runs:
        rule = run.setup.reward is None  # the reward terms of its own scorer
        within = replay_errors(with_layer(run.setup, by_scorer[rule]), run.log, run.n_fit, run.replayed)[0]
        entry = {"within": within}
        others = [r for r in runs if r is not run]
        strangers = [r for r in others if run_group(r.setup) != run_group(run.setup)]
        for key, rest in (("leave_one_out", others), ("leave_one_group_out", strangers)):
            if rest:
                entry[key], run_errors = _transferred(run, rest, rule, pinned)
                for stage, values in run_errors.items():
                    errors[key][stage].append(values)
        report[run.name] = entry
    every = all("leave_one_group_out" in entry for entry in report.values())
    basis = "leave_one_group_out" if every else "leave_one_out"
    return layer, report, dict(errors[basis]), basis


def run_group(setup: Setup) -> tuple:
    """Runs that are siblings (one model on one device under one framework version, e.g. two response caps of one
    recipe, or one job under FSDP and under Megatron on one box): the model, the device the run is priced as (its
    read-back name carries the peak it read, 307 or 311 TFLOP/s for one A100 box), and the rollout engine's declared
    per-step costs (the framework version's mark)."""
    fw = setup.framework
    return setup.actor, setup.priced_as, fw.kv_cache_reset, fw.weight_reshard


def _transferred(
    run: LoggedRun, others: list[LoggedRun], rule: bool, pinned: Pinned
) -> tuple[dict, dict[str, np.ndarray]]:
    """The run's every step predicted with the layer fitted on all steps of ``others`` (``pinned`` held): the report
    and each stage's (and the step's) absolute relative error per step."""
    transferred = fit_layer(others, whole=True, rule=rule, pinned=pinned)
    report, measured, predicted = replay_errors(with_layer(run.setup, transferred), run.log, 0, run.replayed)
    parts = {stage: parts_timed(run.setup, stage) for stage in report["stages"]}
    report["not_fitted"] = [stage for stage, ps in parts.items() if not all(p in transferred for p in ps)]
    report["runs"] = [r.name for r in others]
    return report, step_errors(measured, predicted, 0)


def summary(report: dict) -> dict:
    """Median and worst over runs of the step's and the stage-weighted errors, per kind of prediction."""
    out = {}
    for kind in ("within", "leave_one_out", "leave_one_group_out"):
        entries = [entry[kind] for entry in report.values() if kind in entry]
        if entries:
            out[kind] = {
                measure: {"median": float(np.median(values)), "worst": float(np.max(values))}
                for measure, values in (
                    ("step", [e["step"]["median_abs_err"] for e in entries]),
                    ("stage_weighted", [e["step"]["stage_weighted_err"] for e in entries]),
                )
            }
    return out
