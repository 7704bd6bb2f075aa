"""Calibrate the simulator on a real training run's log, and validate it: per stage and per step. This module
replays logs on the simulator to measure what the framework terms multiply; the fit itself is the top of the cost
stack (:mod:`oppo.sim.cost.fit`).

Each logged step is replayed with the ``sync`` policy and lengths consistent with that step's logged mean / max /
min (:func:`step_lengths`). A stage's seconds are a function of its load (:meth:`StageCost.seconds` of a
:class:`StageLoad`, :mod:`oppo.sim.cost.framework`), linear in each part of it but for the overlaps of compute with
the parameter gathers and with the host's time, so :func:`replay` measures each step's load of every stage on the
simulator itself, with the overlaps summed (``exposed_gather_frac`` and ``exposed_host_frac`` 1, where it is
linear too): one simulation without framework terms, then one per term with that term alone switched on; what a
term adds is its load. :func:`predict_stages` prices the loads with a setup's terms through the same
:meth:`StageCost.seconds` the simulator charges with: a calibrated setup simulates what the fit predicts.

:func:`calibrate` fits per stage, by least squares of the relative error (non-negative,
:func:`~oppo.sim.cost.fit.fit_stage`) on the first ``fit_frac`` of the steps:
- ``gen``: ``efficiency``, ``per_token_s`` and its per-step terms. No per-iteration term: a run's longest
  response sits at the cap in most steps, so iterations would be a second constant.
- forward and update stages: ``efficiency`` and ``half_efficiency_tokens`` (and the gather terms where sharded),
  one set for the forward passes and one for the training passes (:data:`~oppo.sim.cost.fit.SHARED_TERMS`).
  Within one stage of one run the micro-batch count is constant, so a per-micro-batch overhead and a per-step
  constant cannot be told apart: the constant is attributed to the micro-batches, in proportion to their roofline
  (``fixed_s`` 0), which is what transfers to a run with another batch size; a family's stages may tell it.
A fitted stage's terms are replaced whole (a term not fitted becomes 0); stages the log does not time keep the
setup's. A logged stage that times several of ours at once (OpenRLHF's ``make_experience``, ``ppo_train``) is
fitted as one: the same terms for each of its parts, against the sum of their loads.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from oppo.catalog.lengths import LengthTrace
from oppo.sim.cost.fit import (
    TRAINING_STAGES,
    Pinned,
    TimedReshard,
    concat_loads,
    fit_problems,
    kind_of,
    problem_rows,
    scale_load,
    shared_terms,
    slice_load,
    sum_loads,
    terms_fitted,
)
from oppo.sim.cost.framework import ROLE_STAGES
from oppo.sim.cost.stage import StageCost, StageLoad
from oppo.sim.logs.read import COMPOSITES, SUBSTAGES, LoggedStep, TrainingLog
from oppo.sim.model.async_pipeline import AsyncConfig
from oppo.sim.model.trainer import SimConfig, simulate
from oppo.sim.setup.presets import Setup

# stage -> the (role, phase) operations of a sync replay that make it
STAGE_OPS = {
    "gen": (("actor", "prefill"), ("actor", "decode")),
    "old_log_prob": (("actor", "score"),),
    "ref": (("reference", "score"),),
    "values": (("critic", "score"),),
    "reward": (("reward", "score"),),
    "update_actor": (("actor", "train_actor"),),
    "update_critic": (("critic", "train_critic"),),
    "weight_sync": (("actor", "sync"),),  # the push to a rollout engine on GPUs of its own
}
ROUND_OFF = 1e-9  # share of a stage's simulated seconds under which a load measured by differencing is round-off
LENGTH_SIGMA = 0.5  # spread (log scale) of the synthetic lengths between a step's logged min and max
# A load is measured by simulating with one term alone, each adding exactly its load (roofline / 0.5 - roofline,
# the gathers / 0.5 - the gathers, ...): every probe sums compute and gathers (exposed_gather_frac = 1), so the
# step's seconds stay linear in the terms while they are measured.
SERIAL = dict(exposed_gather_frac=1.0, exposed_host_frac=1.0)
BARE = StageCost(**SERIAL)
PROBES = {
    "roofline_s": StageCost(efficiency=0.5, **SERIAL),
    "small_s": StageCost(half_efficiency_tokens=1.0, **SERIAL),
    "units": StageCost(per_unit_s=1.0, **SERIAL),
    "row_tokens": StageCost(per_token_s=1.0, **SERIAL),
    "gather_s": StageCost(gather_bandwidth_frac=0.5, collective_frac=0.5, **SERIAL),  # FSDP's or Megatron's
    "host_s": StageCost(host_link_frac=0.5, **SERIAL),
}


@dataclass(frozen=True)
class Replay:
    """Per logged step, each stage's load in the setup's sync step: a :class:`StageLoad` of (steps,) arrays."""

    loads: dict[str, StageLoad]


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
    """Simulate the logged steps with ``sync`` on ``setup`` and measure every stage's load per step (the setup's
    structural framework settings hold; its stage terms are replaced by the probes). A step runs batch x group
    size sequences (GRPO's samples share their prompt)."""
    check_token_counts(setup, steps)
    trainer_steps = np.array([s.trainer_steps for s in steps], dtype=float)
    trace = replay_trace(setup, steps)
    bare = _stage_seconds(setup, BARE, trace, len(steps))
    added = {term: _stage_seconds(setup, probe, trace, len(steps)) for term, probe in PROBES.items()}
    runs = stages_run(setup)
    generating = _generating_cost(setup)
    copied = _copied_stages(setup)
    loads = {}
    for stage in STAGE_OPS:
        terms = {term: _rounded_off(added[term][stage] - bare[stage], added[term][stage]) for term in PROBES}
        extra_s = _rounded_off(bare[stage] - terms["roofline_s"] - terms["gather_s"] - terms["host_s"], bare[stage])
        terms["serial_s"] = np.zeros_like(terms["gather_s"])
        # Megatron's passes' collectives (one link probe) are serial, no gathers; the push to a rollout engine on
        # GPUs of its own stays a push (its link share fitted as the push's)
        if setup.framework.train_backend == "megatron" and stage != "weight_sync":
            terms["serial_s"], terms["gather_s"] = terms["gather_s"], terms["serial_s"]
        terms["host_copy_s"] = np.zeros_like(terms["host_s"])
        if stage in copied:  # the host link's seconds (one probe) are the shards' copies before each gather
            terms["host_copy_s"], terms["host_s"] = terms["host_s"], terms["host_copy_s"]
        # per-step terms: charged once per step by a stage that runs (generation's named ones by its engine)
        per_step = StageLoad() if stage not in runs else _step_load(generating, stage)
        once = {f: np.full(len(steps), float(getattr(per_step, f))) for f in PER_STEP}
        load = StageLoad(**terms, extra_s=extra_s, **once)
        # a row that sums several trainer steps (verl's fully async trainer) holds each stage that many times at
        # its lengths, and the weight push once
        loads[stage] = load if stage == "weight_sync" else scale_load(load, trainer_steps)
    return Replay(loads)


def _copied_stages(setup: Setup) -> set[str]:
    """The stages whose roles FSDP offloads to the host with their shards copied in before each gather
    (``offload_each_micro_batch``; Megatron's workers load theirs once a pass)."""
    fw = setup.framework
    if fw.train_backend == "megatron":
        return set()
    return {stage for stage, ops in STAGE_OPS.items() if any(role in fw.offload_each_micro_batch for role, _ in ops)}


def _rounded_off(difference: np.ndarray, total: np.ndarray) -> np.ndarray:
    """A load measured as the difference of two simulated stage times, with what is the differencing's round-off
    (under :data:`ROUND_OFF` of the stage's seconds) set to 0: a stage that moves no bytes has no gathers to fit,
    not gathers of -6e-12 s."""
    return np.where(np.abs(difference) > ROUND_OFF * np.abs(total), difference, 0.0)


def replay_trace(setup: Setup, steps: list[LoggedStep]) -> LengthTrace:
    """The lengths a replay of the logged steps runs, in order: per step, batch x group size responses consistent
    with its logged mean / max / min, and prompts of its logged mean."""
    n, cap = setup.batch * setup.group_size, setup.max_new_tokens
    response = np.concatenate([step_lengths(s, n, cap) for s in steps])
    prompt = np.repeat([max(1, round(s.prompt_mean or setup.lengths.prompt_tokens)) for s in steps], n)
    return LengthTrace("log-replay", response, prompt, ordered=True)


def async_step_seconds(
    setup: Setup, steps: list[LoggedStep], staleness: int = 1, push: str = "before_step"
) -> np.ndarray:
    """Each logged step's seconds under ``async`` on the setup's rollout/trainer split: verl's one-step-off trainer
    (``staleness`` 1) waits for batch s, pushes its weights, starts generating batch s + 1 with them and trains
    step s meanwhile (``push = "before_step"``), so a step takes the push and the longer of the two. A step is the
    time between two closes (the first: from the start), as the trainer's ``timing_s/step`` runs from one step's
    end to the next's."""
    schedule = setup.schedule(policy="async", staleness=staleness)
    rollout = AsyncConfig(weights="oldest", push=push)
    config = SimConfig(schedule, setup, steps=len(steps), seed=0, rollout=rollout)
    ends = np.array([record.end_s for record in simulate(config, replay_trace(setup, steps)).steps])
    return np.diff(ends, prepend=0.0)


MAX_SHARE = 1e3  # achieved / nominal link: the largest share a fit gives (a move the steps show costing nothing)
# the load fields a stage pays once per step
PER_STEP = ("steps", "reinit_steps", "reshard_s", "reshard_layers", "transfer_s")


def _step_load(cost, stage: str) -> StageLoad:
    """A stage's per-step load under a cost model: the framework layer's, or one per step (a profile fitted on the
    executor's records has no framework layer)."""
    return cost.step_load(stage) if hasattr(cost, "step_load") else StageLoad(steps=1.0)


TOKEN_TOLERANCE = 0.10  # a setup whose sequences per step miss the log's token totals by more is the wrong setup


def check_placement(setup: Setup, log: TrainingLog) -> None:
    """An asynchronous trainer's log (its generation on GPUs of its own) needs a setup that splits them off: each
    stage is replayed on its own GPUs, one after another (the overlap is the ``async`` policy's to simulate)."""
    if log.asynchronous and not setup.placement.rollout_gpus:
        raise ValueError(
            f"{log.source} is an asynchronous trainer's log (generation on GPUs of its own): setup {setup.name} "
            "needs [placement] rollout_gpus, the GPUs that generate (verl's rollout.n_gpus_per_node x nnodes)"
        )


def check_token_counts(setup: Setup, steps: list[LoggedStep]) -> None:
    """Where the log counts a step's tokens (verl's ``total_num_tokens``), the setup's sequences per step (batch x
    group size, per trainer step a row sums) at the logged mean prompt and response lengths must make them, to 10%
    (median over steps)."""
    logged = [s for s in steps if s.total_tokens and s.prompt_mean is not None]
    if not logged:
        return
    n = setup.batch * setup.group_size
    expected = np.array([n * s.trainer_steps * (s.prompt_mean + s.response_mean) for s in logged])
    total = np.array([s.total_tokens for s in logged])
    if abs(np.median(expected / total) - 1) > TOKEN_TOLERANCE:
        i = len(logged) // 2
        times = f" x {logged[i].trainer_steps} trainer steps" if logged[i].trainer_steps > 1 else ""
        raise ValueError(
            f"the log counts {total[i]:.0f} tokens at step {logged[i].step} (total_num_tokens) but the setup's "
            f"{n} sequences (batch {setup.batch} x group size {setup.group_size}){times} of "
            f"{logged[i].prompt_mean:.0f} + "
            f"{logged[i].response_mean:.0f} tokens make {expected[i]:.0f}: set batch and group_size as the run did"
        )


def _stage_seconds(setup: Setup, cost: StageCost, trace: LengthTrace, n_steps: int) -> dict[str, np.ndarray]:
    """Seconds of each stage per step in a sync simulation with ``cost`` as every stage's terms. An operation
    takes its GPU group's time (the longest of its GPUs: a decode round ends with the group's last row)."""
    framework = dataclasses.replace(setup.framework, **dict.fromkeys(STAGE_OPS, cost))
    probe = dataclasses.replace(setup, framework=framework)
    schedule = probe.schedule(policy="sync")  # the setup's algorithm and group size, as the run had them
    result = simulate(SimConfig(schedule, probe, steps=n_steps, seed=0), trace)
    stage_of = {op: stage for stage, ops in STAGE_OPS.items() for op in ops}
    ops: dict[tuple, float] = defaultdict(float)
    for row in result.trace:
        if (row.role, row.phase) in stage_of:
            key = (stage_of[row.role, row.phase], row.step, row.role, row.phase, row.start_s)
            ops[key] = max(ops[key], row.end_s - row.start_s)
    seconds = {stage: np.zeros(n_steps) for stage in STAGE_OPS}
    for (stage, step, *_), value in ops.items():
        seconds[stage][step] += value
    return seconds


def predict_stages(setup: Setup, replayed: Replay, stages: list[str]) -> dict[str, np.ndarray]:
    """Seconds of each logged stage per step under the setup's framework layer (a composite: its parts' sum)."""
    return {
        stage: sum(setup.framework.stage(part).seconds(replayed.loads[part]) for part in parts_timed(setup, stage))
        for stage in stages
    }


def stages_run(setup: Setup) -> set[str]:
    """Our stages a step of ``setup`` runs: generation, each role's, and ``reward`` also when a rule scores."""
    pushed = {"weight_sync"} if setup.placement.rollout_gpus else set()  # to the rollout engine's own GPUs
    return {"gen", "reward"} | pushed | {s for role in setup.roles(setup.algo) for s in ROLE_STAGES[role] if s}


def parts_timed(setup: Setup, stage: str) -> list[str]:
    """Our stages a logged stage times, among those the setup runs."""
    runs = stages_run(setup)
    return [part for part in COMPOSITES.get(stage, (stage,)) if part in runs]


def calibrate(setup: Setup, log: TrainingLog, fit_frac: float) -> tuple[Setup, int]:
    """The setup with its framework layer fitted on the first ``fit_frac`` of the log's steps; returns it and the
    number of steps fitted. The whole log is replayed (its later steps are checked against the setup too: a log
    the setup cannot replay is refused here, not only when validated)."""
    run = logged_run(setup, log, fit_frac)
    return calibrated(run), run.n_fit


def calibrated(run: LoggedRun, pinned: Pinned = frozenset()) -> Setup:
    """The run's setup with its framework layer fitted on the run's own fitted steps (:func:`fit_layer` of this run
    alone: the reward terms of its own scorer; ``pinned`` held at their defaults)."""
    setup = with_layer(run.setup, fit_layer([run], pinned=pinned))
    return dataclasses.replace(setup, name=f"{run.setup.name}-calibrated")


def _generating_cost(setup: Setup):
    """The cost model of the role that generates in a sync step: the rollout engine's own GPUs, else the actor's."""
    costs = setup.costs("sync")
    return costs.get("rollout", costs["actor"])


def reshard_load(setup: Setup) -> StageLoad:
    """One reshard into the setup's rollout engine as verl times it: its seconds at the nominal links, the layers it
    reshards, and under sleep mode the weights' wake-up (their copy back from the host, half of sleep's moves:
    verl's reshard timer holds ``wake_up``, the ``sleep`` after generation is outside it); none declared: nothing."""
    generating = _generating_cost(setup)
    if not hasattr(generating, "step_load"):
        return StageLoad()
    load = generating.step_load("gen")
    return StageLoad(
        reshard_s=load.reshard_s, reshard_layers=load.reshard_layers, transfer_s=generating.reshard_host_s()
    )


def timed_reshard(setup: Setup, steps: list[LoggedStep], software: bool = True) -> TimedReshard | None:
    """Where the log times the reshard into the rollout engine apart (verl's ``timing_s/reshard``), its terms from
    the median over steps: its bytes at the nominal links (a prior: the datasheets), sleep mode's wake-up at its
    own (``transfer_frac``'s prior), and the rest its software, per layer; a reshard faster than that is all bytes,
    at the share that makes it (the datasheets are no floor; ``software`` false: all of it bytes). None where the
    log does not time it."""
    timed = [s.stages["reshard"] for s in steps if s.stages.get("reshard", 0) > 0]
    if not timed:
        return None
    load = reshard_load(setup)
    if load.reshard_s <= 0:
        why = (
            "its rollout engine has GPUs of its own (a weight push, no reshard): colocate it"
            if setup.framework.weight_reshard
            else "it declares no resharding: set [framework] weight_reshard"
        )
        raise ValueError(f"the log times reshard but setup {setup.name} cannot pay one: {why}")
    rest = float(np.median(timed)) - load.transfer_s  # the wake-up's copy at the nominal host link
    if rest <= load.reshard_s or not software:
        return TimedReshard(frac=min(load.reshard_s / rest, MAX_SHARE) if rest > 0 else MAX_SHARE, layer_s=0.0)
    return TimedReshard(frac=1.0, layer_s=(rest - load.reshard_s) / load.reshard_layers)


def _timed(log: TrainingLog, stage: str, steps: list[LoggedStep]) -> np.ndarray:
    """The seconds of ``stage`` on the fitted ``steps``; a stage no fitted step times (0 s on each) is an error:
    its terms would have nothing to be fitted on."""
    measured = np.array([s.stages[stage] for s in steps])
    if not np.any(measured):
        raise ValueError(
            f"{log.source}: {stage} is timed 0 s on each of the {len(steps)} fitted steps: no step to fit its terms "
            "on (drop the column, or fit on more steps with --fit-frac)"
        )
    return measured


def fitted_stages(setup: Setup, log: TrainingLog) -> list[str]:
    """Stages the log times and the setup runs (a logged stage the setup lacks is an error: wrong setup); a stage
    timed inside another (:data:`oppo.sim.logs.read.SUBSTAGES`) is fitted apart."""
    stages = [s for s in log.stages if s != "step" and s not in SUBSTAGES]
    missing = [s for s in stages if not parts_timed(setup, s)]
    if missing:
        raise ValueError(f"{log.source}: the log times {', '.join(missing)} but the setup runs no such stage")
    owner: dict[str, str] = {}
    for stage in stages:  # one of our stages timed twice (alone and inside a composite) would be fitted twice
        for part in parts_timed(setup, stage):
            if part in owner:
                raise ValueError(f"{log.source}: the log times {part} in both {owner[part]} and {stage}: drop one")
            owner[part] = stage
    return stages


@dataclass(frozen=True)
class LoggedRun:
    """A run's log with its setup and its replay (every step's loads), fitted on its first ``n_fit`` steps."""

    name: str
    setup: Setup
    log: TrainingLog
    replayed: Replay
    n_fit: int


def fitted_count(n_steps: int, fit_frac: float) -> int:
    """How many of a log's first steps a calibration on ``fit_frac`` of them fits."""
    return max(1, int(n_steps * fit_frac))


def logged_run(setup: Setup, log: TrainingLog, fit_frac: float) -> LoggedRun:
    if not 0 < fit_frac < 1:
        raise ValueError(f"fit_frac must be in (0, 1), got {fit_frac}")
    n_fit = fitted_count(len(log.steps), fit_frac)
    if n_fit >= len(log.steps):
        raise ValueError(f"{log.source}: {len(log.steps)} steps leave none to validate with fit_frac {fit_frac}")
    check_placement(setup, log)
    return LoggedRun(setup.name, setup, log, replay(setup, list(log.steps)), n_fit)


def fit_layer(
    runs: list[LoggedRun], whole: bool = False, rule: bool | None = None, pinned: Pinned = frozenset()
) -> dict[str, StageCost]:
    """One set of stage terms fitted on every run's fitted steps at once (``whole``: on all their steps): a stage
    timed by several runs is one least-squares problem over all of their steps. The reward stage is one problem per
    scorer (a rule: CPU seconds per sequence; a reward model: a forward pass per micro-batch), and the layer takes
    the fit of a rule reward (``rule`` true), of a reward model (false; none: where any run has one, else the
    rule's); it has no reward terms where no run has that scorer. The stages of a family of
    :data:`~oppo.sim.cost.fit.SHARED_TERMS` are one problem, each run's rows of them one entry. ``pinned``: (kind,
    term) held at their defaults (:data:`~oppo.sim.cost.fit.Pinned`; gen's ``reshard_layer_s``: a timed reshard
    all bytes, at the links' share that makes it)."""
    problems = _problems(runs, whole)
    scorers = {scorer for scorer, _ in problems} - {""}
    wanted = "model" if rule is False or (rule is None and "model" in scorers) else "rule"
    chosen = {key: problem for (scorer, key), problem in problems.items() if scorer in ("", wanted)}
    software = ("gen", "reshard_layer_s") not in pinned
    return fit_problems(chosen, _timed_reshards(runs, whole, software), _fastest(runs), pinned)


def _fastest(runs: list[LoggedRun]) -> dict[tuple[str, ...], float]:
    """The training passes' least inverse efficiency free of the fit's prior: their roofline is at an assumed
    share of the peak (``train_flops_frac``), so an update faster than it is physical up to the GPU's measured
    matmul ceiling; the largest over the runs (none of them beyond its ceiling). Forward passes keep 1: their
    roofline is at the fitted operator profiles' rate."""
    models = [getattr(run.setup.costs()["actor"], "base", None) for run in runs]  # a records profile has no roofline
    shares = [model.train_ceiling_share for model in models if hasattr(model, "train_ceiling_share")]
    return {TRAINING_STAGES: max(shares, default=1.0)}


def _timed_reshards(runs: list[LoggedRun], whole: bool, software: bool = True) -> TimedReshard | None:
    """The reshard's terms of the runs whose logs time it (their fitted steps, or ``whole``: all), None where none
    does: one split for all, the median over runs of the software per layer (the bytes at the links), or where that
    is none, the median share (``software`` false: no software, the median share)."""
    timed = [
        t
        for run in runs
        if (t := timed_reshard(run.setup, list(run.log.steps[: None if whole else run.n_fit]), software))
    ]
    if not timed:
        return None
    layer_s = float(np.median([t.layer_s for t in timed]))
    return TimedReshard(frac=1.0 if layer_s > 0 else float(np.median([t.frac for t in timed])), layer_s=layer_s)


def _problems(runs: list[LoggedRun], whole: bool) -> dict[tuple, tuple[list[StageLoad], list[np.ndarray], set]]:
    """Every run's rows per problem, (scorer, (the stages its terms price, whether a row sums them)) -> a load and
    the measured seconds per run (its fitted steps; ``whole``: all), and the logged stages they time."""
    problems: dict[tuple, tuple[list[StageLoad], list[np.ndarray], set]] = defaultdict(lambda: ([], [], set()))
    for run in runs:
        part = slice(None) if whole else slice(0, run.n_fit)
        for key, (stages, loads, measured) in _run_problems(run, part).items():
            problems[key][0].append(concat_loads(loads))
            problems[key][1].append(np.concatenate(measured))
            problems[key][2].update(stages)
    return dict(problems)


def _run_problems(run: LoggedRun, part: slice) -> dict[tuple, tuple[list[str], list, list]]:
    """One run's rows per problem, (scorer, (the stages its terms price, whether a row sums them)) -> the logged
    stages, their loads and their measured seconds on the steps ``part``."""
    rows: dict[tuple, tuple[list[str], list, list]] = defaultdict(lambda: ([], [], []))
    steps = list(run.log.steps[part])
    for stage in fitted_stages(run.setup, run.log):
        parts = tuple(parts_timed(run.setup, stage))
        stages, loads, measured = rows[_scorer(run.setup, parts), _priced(parts)]
        stages.append(stage)
        loads.append(slice_load(sum_loads([run.replayed.loads[p] for p in parts]), part))
        measured.append(_timed(run.log, stage, steps))
    return rows


def _priced(parts: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """The problem a logged stage timing our stages ``parts`` is a row of: the stages its terms price (its family's,
    :func:`~oppo.sim.cost.fit.shared_terms`) and whether its load is their sum (a composite stage)."""
    return shared_terms(parts), len(parts) > 1


def _scorer(setup: Setup, parts: tuple[str, ...]) -> str:
    """Which scorer a problem's stages include: "rule", "model" (a reward model), or "" (no reward stage)."""
    if "reward" not in parts:
        return ""
    return "rule" if setup.reward is None else "model"


def with_layer(setup: Setup, layer: dict[str, StageCost]) -> Setup:
    return dataclasses.replace(setup, framework=dataclasses.replace(setup.framework, **layer))


def fitted_terms(runs: list[LoggedRun], pinned: Pinned = frozenset()) -> dict[str, list[str]]:
    """Per logged stage, the terms the shared fit moves (the rest keep their priors): few, so that a stage's
    within-run accuracy is not a free multiplier's. Decided as :func:`fit_layer` decides them, on its rows (the fitted
    steps)."""
    timed = _timed_reshards(runs, whole=False, software=("gen", "reshard_layer_s") not in pinned)
    out = {}
    for (_, (priced, summed)), problem in _problems(runs, whole=False).items():
        load, seconds, per_unit = problem_rows(summed, problem)
        held = frozenset(term for kind, term in pinned if kind == kind_of(priced))
        terms = terms_fitted(load, seconds, priced == ("gen",), per_unit, timed, held, host_overlap=not summed)
        out |= dict.fromkeys(problem[2], terms)
    return out
