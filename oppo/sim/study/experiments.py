"""Experiments researchers run in notebooks and the CLI: policies side by side, chunk and Δ sweeps, trace replay.

Each function simulates and returns plain rows (dicts) or step records; plotting is left to :mod:`oppo.records.plots`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from oppo.catalog.lengths import LengthTrace
from oppo.catalog.shapes import role_flops_per_token
from oppo.core.config import to_dict
from oppo.records import metrics
from oppo.records.metrics import summarize
from oppo.records.schema import StepRecord
from oppo.sim.cost.engine import model_shape
from oppo.sim.model.trainer import SimConfig, SimResult, simulate
from oppo.sim.setup.presets import Setup
from oppo.sim.study.journal import Journal, digest
from oppo.sim.study.pool import IN_PROCESS, Pool, evaluate


@dataclass
class Run:
    config: SimConfig
    result: SimResult
    summary: dict


def run(
    setup: Setup,
    policy: str,
    steps: int,
    seed: int = 0,
    trace: LengthTrace | None = None,
    progress: Callable | None = None,
    **schedule,
) -> Run:
    """Simulate one policy on ``setup`` (schedule overrides as keyword arguments, e.g. ``chunk="500"``)."""
    return run_config(SimConfig(setup.schedule(policy=policy, **schedule), setup, steps, seed), trace, progress)


def run_config(config: SimConfig, trace: LengthTrace | None = None, progress: Callable | None = None) -> Run:
    """Simulate ``config``; ``progress`` is called with each finished step's record."""
    start = time.perf_counter()
    result = simulate(config, trace, progress=progress)
    return Run(config, result, summary_of(config, result, time.perf_counter() - start, trace))


def config_dict(config: SimConfig, trace: LengthTrace | None) -> dict:
    """Everything that decides a simulation's records, as its ``config.json`` stores it (``--config`` reads it
    back): schedule, the whole setup, steps, seed, and the length trace (path, model filter, digest), or None
    for the setup's own length model."""
    source = trace.source() if trace is not None else LengthTrace.NO_SOURCE
    stored = {
        "schedule": to_dict(config.schedule),
        "setup": to_dict(config.setup),
        "steps": config.steps,
        "seed": config.seed,
    }
    if not config.rollout.is_default:  # async's queue and rollout options, stored only where they are set
        stored["rollout"] = to_dict(config.rollout)
    return stored | source


def summary_of(config: SimConfig, result: SimResult, wall_s: float, trace: LengthTrace | None) -> dict:
    flops, peak = flops_and_peaks(config.setup)
    summary = summarize(
        config.schedule.policy,
        result.steps,
        result.columns(),  # the trace's columns from its operations: no rows built for a summary
        result.trained,
        config_dict(config, trace),
        wall_s,
        flops_per_token=flops,
        peak_flops=peak,
    )
    summary["time_to_reward_s"] = time_to_reward(result.steps, config.setup.reward_threshold)
    summary.update(result.stats)
    summary["note"] = "simulated; mean_reward comes from a reward-progress model (oppo.sim.workload.RewardCurve)"
    return summary


def flops_and_peaks(setup: Setup) -> tuple[dict[str, float], float | None]:
    """Forward FLOPs per token of each role (:func:`oppo.catalog.shapes.role_flops_per_token`, as the executor counts
    them) and a GPU's peak FLOP/s (None for the CPU presets, whose "GPU" is a calibrated stand-in without a
    meaningful peak)."""
    roles = ("actor", "critic", "reference", "reward")
    shapes = {role: model_shape(setup.shape(role)).hf_fields for role in roles if setup.shape(role)}
    return role_flops_per_token(shapes), None if setup.gpu == "cpu-core" else setup.gpu_datasheet().peak_flops


def time_to_reward(steps: list[StepRecord], threshold: float, window: int = 5) -> float | None:
    """Simulated seconds until the mean reward over ``window`` steps first reaches ``threshold``."""
    return metrics.time_to_reward([s.mean_reward for s in steps], [s.step_s for s in steps], threshold, window)


def compare_rows(summaries: list[dict]) -> list[dict]:
    """One row per policy with ratios to ``sync`` (or to the first policy when sync is absent), ranked by work done:
    ``samples_speedup`` (finished trained responses per second, the headline) and ``tokens_speedup`` (their
    response tokens per second). The step-time ratio is per step (``per_step_speedup``): a policy whose steps train
    fewer or partial responses (T-PPO's segments) gets a fast step without doing more work."""
    base = next((s for s in summaries if s["policy"] == "sync"), summaries[0])
    ratio = lambda a, b: round(a / b, 3) if a and b else None  # noqa: E731
    rows = []
    for s in summaries:
        ttr, base_ttr = s["time_to_reward_s"], base["time_to_reward_s"]
        rows.append(
            {
                "policy": s["policy"],
                "samples_speedup": ratio(s["samples_per_s"], base["samples_per_s"]),
                "tokens_speedup": ratio(s["tokens_per_s"], base["tokens_per_s"]),
                "samples_per_s": round(s["samples_per_s"], 3),
                "tokens_per_s": round(s["tokens_per_s"], 1),
                "per_step_s": round(s["mean_step_s"], 3),
                "p99_step_s": round(s["p99_step_s"], 3),
                "per_step_speedup": round(base["mean_step_s"] / s["mean_step_s"], 3),
                "mean_util": round(s["mean_utilization"], 3),
                "mean_deferrals": round(s["mean_deferrals"], 3),
                "mean_lag": round(s["mean_policy_lag"], 3),
                "p99_lag": round(s["p99_policy_lag"], 3),
                "deferral_hist": " ".join(f"{k}:{v:.1%}" for k, v in s["deferral_hist"].items()),
                "final_reward": round(s["final_reward"], 3),
                "time_to_reward_s": None if ttr is None else round(ttr, 1),
                "ttr_speedup": round(base_ttr / ttr, 3) if ttr and base_ttr else None,
            }
        )
    return sorted(rows, key=lambda r: -(r["samples_speedup"] or 0.0))


def compare(
    setup: Setup, policies: Iterable[str], steps: int, seed: int = 0, trace: LengthTrace | None = None, **schedule
) -> list[dict]:
    """Each policy on the same setup, costs, lengths and seed: one :func:`compare_rows` row per policy."""
    return compare_rows([run(setup, p, steps, seed, trace, **schedule).summary for p in policies])


def sweep(
    setup: Setup,
    knob: str,
    values: Iterable,
    policy: str,
    steps: int,
    seed: int = 0,
    trace: LengthTrace | None = None,
    **schedule,
) -> list[dict]:
    """Mean step time (and utilisation, reward) for each fixed value of ``knob`` ("chunk" or "delta")."""
    return sweep_config(SimConfig(setup.schedule(policy=policy, **schedule), setup, steps, seed), knob, values, trace)


def sweep_config(
    base: SimConfig,
    knob: str,
    values: Iterable,
    trace: LengthTrace | None = None,
    pool: Pool = IN_PROCESS,
    journal: Journal | None = None,
) -> list[dict]:
    """:func:`sweep` from a whole config: ``knob`` set to each value in turn (simulated where ``pool`` says; with a
    ``journal``, each result recorded as it comes back and those it holds not simulated again)."""
    values = list(values)
    configs = [dataclasses.replace(base, schedule=dataclasses.replace(base.schedule, **{knob: str(v)})) for v in values]
    items = [(c, trace) for c in configs]
    summaries = evaluate_sims(_sweep_point, items, pool, f"sweep {knob}", journal, "sweep")
    return [
        {
            knob: value,
            "policy": summary["policy"],
            "mean_step_s": round(summary["mean_step_s"], 3),
            "mean_util": round(summary["mean_utilization"], 3),
            "final_reward": round(summary["final_reward"], 3),
        }
        for value, summary in zip(values, summaries)
    ]


SWEEP_KEYS = ("policy", "mean_step_s", "mean_utilization", "final_reward")  # what a sweep's row reads of a summary


def _sweep_point(item: tuple[SimConfig, LengthTrace | None]) -> dict:
    """What a sweep's row reads of one simulation's summary, as plain values (a pool's unit of work)."""
    summary = run_config(*item).summary
    return {key: plain_value(summary[key]) for key in SWEEP_KEYS}


def plain_value(value):
    """A summary's scalar as Python's (numpy's float64 as float): the same value, simulated or read back from a
    journal."""
    return value.item() if isinstance(value, np.generic) else value


def evaluate_sims(
    fn: Callable, items: list, pool: Pool, desc: str, journal: Journal | None = None, what: str = ""
) -> list:
    """``[fn(item) for item in items]`` over (config, trace) items, where ``pool`` says; through ``journal`` where
    one is given (results keyed by ``what`` and each simulation's config: :mod:`oppo.sim.study.journal`)."""
    if journal is None:
        return evaluate(fn, items, pool, desc=desc)
    keys, labels = sim_keys(what, items)
    return journal.evaluate(fn, items, keys, labels, pool, desc)


def sim_keys(what: str, items: list) -> tuple[list[str], list[str]]:
    """Each (config, trace) item's journal key (the digest of ``what`` and the config as ``config.json`` stores it,
    the trace's content digest included) and a label naming it for a reader."""
    sources: dict[int, dict] = {}  # a trace's source, digested once (it reads the trace's file)
    keys, labels = [], []
    for config, trace in items:
        if trace is not None and id(trace) not in sources:
            sources[id(trace)] = trace.source()
        source = sources[id(trace)] if trace is not None else LengthTrace.NO_SOURCE
        keys.append(digest({"what": what, "config": config_dict(config, None) | source}))
        s = config.schedule
        knobs = "".join(f" {k}={getattr(s, k)}" for k in ("chunk", "delta", "delta_max", "staleness"))
        labels.append(f"{s.policy}{knobs} steps={config.steps} seed={config.seed}")
    return keys, labels


def summarize_config(item: tuple[SimConfig, LengthTrace | None]) -> dict:
    """The summary of one simulation, its step records under ``_steps`` (a pool's unit of work: picklable in
    and out)."""
    config, trace = item
    r = run_config(config, trace)
    return r.summary | {"_steps": r.result.steps}


def delta_study(setup: Setup, deltas: Iterable, steps: int, seed: int = 0, trace=None) -> dict[str, list[StepRecord]]:
    """Step records of ``oppo`` with each fixed Δ and with the dynamic controller ("auto")."""
    return {f"Δ={d}": run(setup, "oppo", steps, seed, trace, delta=str(d)).result.steps for d in deltas}


def trace_speedups(setup: Setup, traces: dict[str, LengthTrace], steps: int, seed: int = 0) -> list[dict]:
    """sync vs oppo mean step time for each length trace."""
    rows = []
    for name, trace in traces.items():
        sync = run(setup, "sync", steps, seed, trace).summary
        oppo = run(setup, "oppo", steps, seed, trace).summary
        rows.append(
            {
                "trace": name,
                "sync_step_s": round(sync["mean_step_s"], 2),
                "oppo_step_s": round(oppo["mean_step_s"], 2),
                "speedup": round(sync["mean_step_s"] / oppo["mean_step_s"], 3),
                "oppo_mean_deferrals": round(oppo["mean_deferrals"], 3),
            }
        )
    return rows
