"""Calibrate the simulator on a real training run's log, and validate it: per stage and per step.

Each logged step is replayed with the ``sync`` policy and lengths consistent with that step's logged mean / max /
min (:func:`step_lengths`), on the setup's roofline with an identity framework layer: that gives each stage's
roofline seconds per step. The framework layer (:mod:`oppo.sim.framework`) maps them to real seconds,

    stage seconds = roofline / efficiency + units x per_unit_s + fixed_s

(units: decode iterations for ``gen``, micro-batches for the others). :func:`calibrate` fits efficiency (<= 1),
per_unit_s and fixed_s (>= 0) per stage, by least squares of the relative error, on the first ``fit_frac`` of the
steps; :func:`predict_stages` applies a setup's layer as it is. Within one run the micro-batch count is constant,
so for the forward and update stages its overhead and a per-step constant cannot be told apart: the constant is
attributed to the micro-batches (``fixed_s`` 0), which is what transfers to a run with another batch size.
A logged stage that times several of ours at once (OpenRLHF's ``make_experience``, ``ppo_train``) is fitted as
one: the same terms for each of its parts, against the sum of their rooflines.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

import numpy as np

from oppo.lengths import LengthTrace
from oppo.sim.calibrate import nonnegative_lstsq
from oppo.sim.framework import ROLE_STAGES, Framework, StageCost, micro_batches
from oppo.sim.model import SimConfig, simulate
from oppo.sim.runlogs import COMPOSITES, LoggedStep, RunLog
from oppo.sim.setups import Setup

# stage -> the (role, phase) operations of a sync replay that make it
STAGE_OPS = {
    "gen": (("actor", "prefill"), ("actor", "decode")),
    "old_log_prob": (("actor", "score"),),
    "ref": (("reference", "score"),),
    "values": (("critic", "score"),),
    "reward": (("reward", "score"),),
    "update_actor": (("actor", "train_actor"),),
    "update_critic": (("critic", "train_critic"),),
}
LENGTH_SIGMA = 0.5  # spread (log scale) of the synthetic lengths between a step's logged min and max


@dataclass(frozen=True)
class Replay:
    """Per logged step: roofline seconds and units of each stage of the setup's sync step."""

    roofline: dict[str, np.ndarray]  # stage -> (steps,) seconds at efficiency 1, no overheads
    units: dict[str, np.ndarray]  # stage -> (steps,) decode iterations or micro-batches
    micro_batch_tokens: dict[str, np.ndarray]  # stage -> (steps,) tokens of one micro-batch on one GPU
    tokens: np.ndarray  # (steps,) response tokens generated


def step_lengths(step: LoggedStep, n: int, cap: int) -> np.ndarray:
    """``n`` response lengths whose mean, max and min are the logged ones (a lognormal shape between them). A log
    without the max (OpenRLHF) gives the cap where responses were clipped, else the lognormal's expected max."""
    z = np.array([statistics.NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)])
    low = step.response_min if step.response_min is not None else 1.0
    high = max(step.response_max if step.response_max is not None else _expected_max(step, z[-1], cap), low)
    x = np.exp(LENGTH_SIGMA * z)
    for _ in range(20):  # scale the middle to the logged mean, keeping the extremes at the logged min and max
        x = np.clip(x * step.response_mean / max(x.mean(), 1e-9), low, high)
        x[0], x[-1] = low, high
    return np.clip(np.rint(x), 1, cap).astype(np.int64)


def _expected_max(step: LoggedStep, z_max: float, cap: int) -> float:
    if step.clipped:
        return float(cap)
    return min(cap, step.response_mean * np.exp(LENGTH_SIGMA * z_max - LENGTH_SIGMA**2 / 2))  # lognormal mean -> max


def replay(setup: Setup, steps: list[LoggedStep]) -> Replay:
    """Simulate the logged steps with ``sync`` on ``setup`` (identity framework layer, no per-step costs)."""
    bare = dataclasses.replace(setup, framework=_identity(setup.framework))
    n, cap = bare.batch, bare.max_new_tokens
    response = np.concatenate([step_lengths(s, n, cap) for s in steps])
    prompt = np.repeat([max(1, round(s.prompt_mean or bare.lengths.prompt_tokens)) for s in steps], n)
    trace = LengthTrace("log-replay", response, prompt, ordered=True)
    schedule = bare.schedule(policy="sync", algo="ppo", group_size=1)
    result = simulate(SimConfig(schedule, bare, steps=len(steps), seed=0), trace)
    first_gpu = {role: name.split("-")[0] for role, name in bare.devices.items()}  # one member of each group
    roofline = {stage: np.zeros(len(steps)) for stage in STAGE_OPS}
    for row in result.trace:
        for stage, ops in STAGE_OPS.items():
            if (row.role, row.phase) in ops and row.device == first_gpu.get(row.role, row.device):
                roofline[stage][row.step] += row.end_s - row.start_s
    lengths = response.reshape(len(steps), n)
    units = _units(bare, lengths)
    gpus, minibatches = bare.placement.actor_gpus, bare.minibatches
    full = (lengths + prompt.reshape(len(steps), n)).sum(axis=1).astype(float)  # tokens of a pass over the batch
    passes = {stage: bare.ppo_epochs * minibatches if stage.startswith("update") else 1 for stage in STAGE_OPS}
    mb_tokens = {
        stage: full * passes[stage] / minibatches ** stage.startswith("update") / gpus / units[stage]
        for stage in STAGE_OPS
    }
    return Replay(roofline, units, mb_tokens, lengths.sum(axis=1).astype(float))


def _identity(framework: Framework) -> Framework:
    return dataclasses.replace(framework, **{stage: StageCost() for stage in STAGE_OPS})


def _units(setup: Setup, lengths: np.ndarray) -> dict[str, np.ndarray]:
    """Decode iterations (the longest response: every row waits for it) and micro-batches per stage."""
    fw, gpus, b = setup.framework, setup.placement.actor_gpus, setup.batch
    forward = micro_batches(b, fw.forward_micro_batch, gpus)
    update = setup.ppo_epochs * setup.minibatches * micro_batches(b / setup.minibatches, fw.train_micro_batch, gpus)
    units = {
        stage: np.full(len(lengths), float(update if stage.startswith("update") else forward)) for stage in STAGE_OPS
    }
    units["gen"] = lengths.max(axis=1).astype(float)
    return units


def predict_stages(setup: Setup, replayed: Replay, stages: list[str]) -> dict[str, np.ndarray]:
    """Seconds of each logged stage per step under the setup's framework layer (a composite: its parts' sum)."""
    return {stage: sum(_predict_part(setup, replayed, part) for part in _parts(setup, stage)) for stage in stages}


def _predict_part(setup: Setup, replayed: Replay, stage: str) -> np.ndarray:
    cost = setup.framework.stage(stage)
    small = cost.half_efficiency_tokens / np.maximum(replayed.micro_batch_tokens[stage], 1.0)
    seconds = replayed.roofline[stage] / cost.efficiency * (1 + small) + replayed.units[stage] * cost.per_unit_s
    return seconds + cost.fixed_s + (replayed.tokens * cost.per_token_s if stage == "gen" else 0.0)


def _parts(setup: Setup, stage: str) -> list[str]:
    """Our stages a logged stage times, among those the setup runs."""
    runs = {"gen"} | {s for role in setup.roles("ppo") for s in ROLE_STAGES[role] if s}
    return [part for part in COMPOSITES.get(stage, (stage,)) if part in runs]


def fit_stage(roofline: np.ndarray, mb_tokens: np.ndarray, measured: np.ndarray, tokens: np.ndarray | None = None):
    """Fit one stage, efficiency <= 1 and every term >= 0, minimising the relative error:
    - forward and update stages: measured ≈ roofline / eff · (1 + half / micro-batch tokens);
    - ``gen`` (``tokens`` given): measured ≈ roofline / eff + tokens · per_token_s + fixed_s. No per-iteration
      term: a run's longest response sits at the cap in most steps, so iterations would be a second constant.
    Written as measured - roofline ≈ a·roofline + (h·roofline / mb_tokens | d·tokens + c), a, h, c, d >= 0."""
    if tokens is None:
        columns = [roofline, roofline / np.maximum(mb_tokens, 1.0)]
    else:
        columns = [roofline, tokens, np.ones_like(tokens)]
    x = np.stack(columns, axis=1) / measured[:, None]
    a, *rest = nonnegative_lstsq(x, (measured - roofline) / measured)
    inverse = 1.0 + a  # 1 / efficiency
    if tokens is None:
        return StageCost(efficiency=float(1.0 / inverse), half_efficiency_tokens=float(rest[0] / inverse))
    return StageCost(efficiency=float(1.0 / inverse), per_token_s=float(rest[0]), fixed_s=float(rest[1]))


def calibrate(setup: Setup, log: RunLog, fit_frac: float) -> tuple[Setup, int]:
    """The setup with its framework layer fitted on the first ``fit_frac`` of the log's steps; returns it and the
    number of steps fitted."""
    if not 0 < fit_frac < 1:
        raise ValueError(f"fit_frac must be in (0, 1), got {fit_frac}")
    steps = list(log.steps)
    n_fit = max(1, int(len(steps) * fit_frac))
    if n_fit >= len(steps):
        raise ValueError(f"{log.source}: {len(steps)} steps leave none to validate with fit_frac {fit_frac}")
    replayed = replay(setup, steps[:n_fit])
    fitted = {}
    for stage in _fitted_stages(setup, log):
        measured = np.array([s.stages[stage] for s in steps[:n_fit]])
        parts = _parts(setup, stage)  # a composite's parts share one micro-batch size: one set of terms
        roofline = sum(replayed.roofline[part] for part in parts)
        tokens = replayed.tokens if stage == "gen" else None
        cost = fit_stage(roofline, replayed.micro_batch_tokens[parts[0]], measured, tokens)
        fitted |= dict.fromkeys(parts, cost)
    framework = dataclasses.replace(setup.framework, **fitted)
    return dataclasses.replace(setup, framework=framework, name=f"{setup.name}-calibrated"), n_fit


def _fitted_stages(setup: Setup, log: RunLog) -> list[str]:
    """Stages the log times and the setup runs (a logged stage the setup lacks is an error: wrong setup)."""
    stages = [s for s in log.stages if s != "step"]
    missing = [s for s in stages if not _parts(setup, s)]
    if missing:
        raise ValueError(f"{log.source}: the log times {', '.join(missing)} but the setup runs no such stage")
    return stages


def fidelity(setup: Setup, log: RunLog, first: int) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Predict every step of the log with the setup as it is. Returns the ``fidelity.json`` content (medians over
    steps ``first..`` and their median absolute relative error, per stage and for the step), and the measured
    and predicted seconds per stage (with "step") of every step, for plotting."""
    steps = list(log.steps)
    stages = _fitted_stages(setup, log)
    predicted = predict_stages(setup, replay(setup, steps), stages)
    measured = {stage: np.array([s.stages[stage] for s in steps]) for stage in stages}
    measured["step"] = np.array([s.stages.get("step", sum(s.stages[x] for x in stages)) for s in steps])
    predicted["step"] = sum(predicted[x] for x in stages)  # sync and colocated: stages run one after another
    report = {
        "fit_steps": first,
        "validate_steps": len(steps) - first,
        "step": _errors(measured["step"][first:], predicted["step"][first:]),
        "stages": {stage: _errors(measured[stage][first:], predicted[stage][first:]) for stage in stages},
    }
    return report, measured, predicted


def _errors(measured: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    err = np.abs(predicted - measured) / np.maximum(measured, 1e-9)
    return {
        "measured_s": float(np.median(measured)),
        "predicted_s": float(np.median(predicted)),
        "median_abs_err": float(np.median(err)),
    }
