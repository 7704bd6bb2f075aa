"""How far a setup's predictions of a logged run are off: the ``fidelity.json`` report (per stage and for the step,
the medians over the validated steps and their median absolute relative error, and the stage-weighted error, in
which errors of opposite sign cannot cancel) and the per-step errors the plots and intervals take."""

from __future__ import annotations

import numpy as np

from oppo.sim.logs.fit import (
    Replay,
    async_step_seconds,
    check_placement,
    fitted_stages,
    predict_stages,
    replay,
    reshard_load,
)
from oppo.sim.logs.read import TrainingLog
from oppo.sim.setup.presets import Setup


def replay_errors(
    setup: Setup, log: TrainingLog, first: int, replayed: Replay | None = None
) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Predict every step of the log with the setup as it is (``replayed``: the log's replay on the setup, if
    made already: loads do not depend on the stage terms). Returns the ``fidelity.json`` content (medians over
    steps ``first..`` and their median absolute relative error, per stage and for the step), and the measured
    and predicted seconds per stage (with "step") of every step, for plotting."""
    check_placement(setup, log)
    steps = list(log.steps)
    stages = fitted_stages(setup, log)
    predicted = predict_stages(setup, replayed or replay(setup, steps), stages)
    measured = {stage: np.array([s.stages[stage] for s in steps]) for stage in stages}
    measured["step"] = np.array([s.stages.get("step", sum(s.stages[x] for x in stages)) for s in steps])
    predicted["step"] = sum(predicted[x] for x in stages)  # sync and colocated: stages run one after another
    summed = list(stages)
    if "reshard" in log.stages:  # inside gen: reported, not added to the step
        measured["reshard"] = np.array([s.stages["reshard"] for s in steps])
        predicted["reshard"] = np.full(len(steps), setup.framework.gen.moves_s(reshard_load(setup)))
        stages = [*stages, "reshard"]
    step_errors = _errors(measured["step"][first:], predicted["step"][first:])
    step_errors["stage_weighted_err"] = stage_weighted_err(measured, predicted, summed, first)
    report = {
        "fit_steps": first,
        "validate_steps": len(steps) - first,
        "step": step_errors,
        "stages": {stage: _errors(measured[stage][first:], predicted[stage][first:]) for stage in stages},
    }
    # the one-step-off trainer's own step: async's to predict (the fully async trainer's holds its wait for a
    # rollouter whose generation its rows do not time: not predicted)
    if not log.fully_async and all(s.async_step_s is not None for s in steps):
        measured["async_step"] = np.array([s.async_step_s for s in steps])
        predicted["async_step"] = async_step_seconds(setup, steps)
        report["async_step"] = _errors(measured["async_step"][first:], predicted["async_step"][first:])
    return report, measured, predicted


def stage_weighted_err(measured: dict, predicted: dict, stages: list[str], first: int) -> float:
    """The median over steps ``first..`` of the stages' absolute errors summed, over the measured step: errors of
    opposite sign do not cancel in it as they do in the step's own error."""
    wrong = sum(np.abs(predicted[s][first:] - measured[s][first:]) for s in stages)
    return float(np.median(wrong / np.maximum(measured["step"][first:], 1e-9)))


def _errors(measured: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    err = np.abs(predicted - measured) / np.maximum(measured, 1e-9)
    return {
        "measured_s": float(np.median(measured)),
        "predicted_s": float(np.median(predicted)),
        "median_abs_err": float(np.median(err)),
    }


def step_errors(measured: dict, predicted: dict, first: int) -> dict[str, np.ndarray]:
    """Each stage's (and the step's) absolute relative error on every step from ``first``."""
    return {
        stage: np.abs(predicted[stage][first:] - measured[stage][first:]) / np.maximum(measured[stage][first:], 1e-9)
        for stage in measured
    }
