"""Develop in simulation, validate on hardware: predict executor runs with the simulator and measure the error.

The one package that joins the two backends (``oppo.sim`` and ``oppo.exec`` never import each other; a lint
contract in ``pyproject.toml`` enforces it).

Protocol (:func:`fidelity`): run the executor for several policies; calibrate the simulator's cost profile on the
``sync`` run only; simulate every policy with the same schedule, the same per-sequence lengths (replayed in
admission order: the forced ones, or on a real task the ones each run generated) and the same seed, making the
run's own Δ and chunk size at every step (its step records hold them: the simulator's rewards and step times are
not the run's, so its controllers would decide otherwise); compare step times step by step.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from oppo.catalog.lengths import LengthTrace
from oppo.core.scheduler import Decisions
from oppo.exec.config import ExecConfig, load_config
from oppo.exec.models.roles import role_paths
from oppo.exec.step.runner import forced_length
from oppo.records.io import read_rows
from oppo.records.schema import StepRecord, TraceRow, TrainedSeq
from oppo.sim import SimConfig, simulate
from oppo.sim.cost.profile import fit_trace, save_profile
from oppo.sim.model.async_pipeline import AsyncConfig
from oppo.sim.setup.presets import Contention, LengthModel, Placement, Setup


def sim_setup_for(config: ExecConfig, profile: str | Path, prompt_tokens: int | None = None) -> Setup:
    """The simulator setup that mirrors an executor config on this machine, costs from ``profile``; prompts of
    ``prompt_tokens`` (default: the task's, which a run without a dataset generates exactly)."""
    colocated = config.placement == "colocated"
    placement = Placement("colocated", 1, 0) if colocated else Placement("disaggregated", 1, 1)
    on_engine = config.rollout.rollout_engine == "vllm"
    if on_engine:  # vLLM's CPU build binds its worker to the cores its engine-core process leaves (on 2 cores: one,
        # the trainer keeps the other): generation on a device of its own. The executor pins neither; on more cores
        # the trainer's threads and the worker's share them, which this does not model
        placement = dataclasses.replace(placement, actor_gpus=placement.actor_gpus + 1, rollout_gpus=1)
    checkpoints = config.model.preset in ("hf", "smollm2")  # a checkpoint's own config.json is its shape
    paths = role_paths(config.model) if checkpoints else {}
    actor = f"{paths['actor']}/config.json" if checkpoints else config.model.preset
    reward = f"{paths['reward']}/config.json" if checkpoints and config.reward_model else config.model.preset
    return Setup(
        name=f"{config.model.preset}-calibrated",
        gpu="cpu-core",
        actor=actor,
        reward=reward if config.reward_model else None,
        batch=config.schedule.batch,
        max_new_tokens=config.schedule.max_new_tokens,
        engine="vllm-cpu" if on_engine else "torch-cpu",
        cost=str(profile),
        ppo_epochs=config.ppo.epochs,
        minibatches=config.ppo.minibatches,
        placement=placement,
        contention=Contention(chunk_handoff_s=0.0, colocated_overlap_frac=0.0),
        lengths=LengthModel(prompt_tokens=prompt_tokens or config.task.prompt_tokens),
    )


def async_setup_for(config: ExecConfig, profile: str | Path) -> tuple[Setup, AsyncConfig]:
    """The simulator's mirror of an executor ``async`` run with rollout workers: one device (core) per worker
    generating and scoring with the frozen roles (reward model, reference), the trainer on its own (old
    log-probs, values, updates); step s by version s - K exactly and the run's queue bound."""
    workers = config.rollout_workers
    setup = sim_setup_for(config, profile)
    placement = Placement("colocated", workers + 1, 0, rollout_gpus=workers)
    options = AsyncConfig(queue_groups=config.queue_groups, rollout_scores=True, weights="oldest")
    return dataclasses.replace(setup, placement=placement), options


def predict_async(run_dir: Path, profile: Path, lengths: LengthTrace) -> list:
    """Simulate the ``async`` run with rollout workers recorded in ``run_dir``: (step records, trained samples)."""
    config = load_config(run_dir / "config.json")
    setup, options = async_setup_for(config, profile)
    replay = replay_lengths(config, lengths, config.schedule.batch * (config.steps + 2) + 64)
    result = simulate(SimConfig(config.schedule, setup, config.steps, config.seed, options), replay)
    return result.steps, result.trained


def replay_lengths(config: ExecConfig, lengths: LengthTrace, n: int) -> LengthTrace:
    """The forced lengths of the executor's first ``n`` sequences, in admission order."""
    cap = config.schedule.max_new_tokens
    forced = np.array([forced_length(lengths, config.seed, i, cap) for i in range(n)])
    return LengthTrace(f"{lengths.name}-replay", forced, None, ordered=True)


def generated_lengths(run_dir: Path, config: ExecConfig) -> LengthTrace:
    """The response lengths a run generated, by sequence id (row i: sequence i, as the simulator admits them): a
    trained sequence's final length where it finished; the cap for one whose last record is unfinished (a T-PPO
    segment) or that no step trained (still running, or carried, when the run ended: its length is unknown, and
    the cap keeps it from finishing earlier in the replay than it could have), and for the ids past the last
    recorded, as many as a step may admit, so that the replay never cycles back to the first rows."""
    schedule = config.schedule
    last = {}
    for row in read_rows(run_dir / "sequences.csv", TrainedSeq):  # in step order: a later row supersedes
        last[row.seq_id] = row.response_tokens if row.finished else schedule.max_new_tokens
    if not last:
        raise ValueError(f"{run_dir / 'sequences.csv'}: no sequences recorded")
    spare = (schedule.batch + schedule.delta_max) * schedule.group_size * (schedule.staleness + 2)
    lengths = np.full(max(last) + 1 + spare, schedule.max_new_tokens, dtype=np.int64)
    lengths[list(last)] = list(last.values())
    return LengthTrace(f"{run_dir.name}-generated", lengths, None, ordered=True)


def padded_prompt_tokens(trace: list[TraceRow]) -> int:
    """Prompt tokens per sequence that a ``sync`` run's actor prefilled (every prefill a batch of fresh prompts,
    left-padded to its longest: the width the passes computed, not the prompts' mean length)."""
    rows = [r for r in trace if r.role == "actor" and r.phase == "prefill"]
    if not rows:
        raise ValueError("the calibration run's trace has no actor prefill")
    return round(sum(r.num_tokens for r in rows) / sum(r.batch_size for r in rows))


def predict(
    run_dir: Path, profile: Path, lengths: LengthTrace | None = None, prompt_tokens: int | None = None
) -> list[StepRecord]:
    """Simulate the run recorded in ``run_dir`` (its config.json) with the cost ``profile``, making its recorded
    decisions: on the forced ``lengths`` the run replayed, or (None) the lengths it generated."""
    config = load_config(run_dir / "config.json")
    setup = sim_setup_for(config, profile, prompt_tokens)
    n = config.schedule.batch * config.schedule.group_size * (config.steps + 2) + 64
    replay = generated_lengths(run_dir, config) if lengths is None else replay_lengths(config, lengths, n)
    decisions = Decisions.of(read_rows(run_dir / "steps.csv", StepRecord))
    schedule = config.schedule
    if schedule.streaming:  # the scorers the executor streamed to (a rule reward's go to the reference)
        schedule = dataclasses.replace(schedule, streamed_scorers=config.streamed_roles)
    return simulate(SimConfig(schedule, setup, config.steps, config.seed), replay, decisions=decisions).steps


def step_errors(measured: list[StepRecord], predicted: list[StepRecord], skip: int = 1) -> np.ndarray:
    """|predicted - measured| / measured per step, skipping the first ``skip`` (warm-up) steps."""
    m = np.array([s.step_s for s in measured[skip:]])
    p = np.array([s.step_s for s in predicted[skip : len(measured)]])
    return np.abs(p - m) / m


def fidelity(runs: dict[str, Path], lengths: LengthTrace | None, profile_out: Path) -> dict[str, dict[str, float]]:
    """Calibrate on ``runs["sync"]``, predict every run (on the forced ``lengths``, or None: each run's generated
    ones, prompts as wide as the sync run prefilled); per policy: median step error, measured and predicted mean
    step time (steps 1..) and their speedup over sync."""
    trace = read_rows(runs["sync"] / "trace.csv", TraceRow)
    save_profile(fit_trace(trace), profile_out, str(runs["sync"]))
    prompt_tokens = None if lengths is not None else padded_prompt_tokens(trace)
    report = {}
    for policy, run in runs.items():
        measured = read_rows(run / "steps.csv", StepRecord)
        predicted = predict(run, profile_out, lengths, prompt_tokens)
        err = step_errors(measured, predicted)
        report[policy] = {
            "median_step_err": float(np.median(err)),
            "measured_step_s": float(np.mean([s.step_s for s in measured[1:]])),
            "predicted_step_s": float(np.mean([s.step_s for s in predicted[1 : len(measured)]])),
        }
    base_m, base_p = report["sync"]["measured_step_s"], report["sync"]["predicted_step_s"]
    for r in report.values():
        r["measured_speedup"], r["predicted_speedup"] = base_m / r["measured_step_s"], base_p / r["predicted_step_s"]
        r["speedup_err"] = abs(r["predicted_speedup"] - r["measured_speedup"]) / r["measured_speedup"]
    return report
