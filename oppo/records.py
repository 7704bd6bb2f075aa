"""The record schema shared by the simulator and the executor (docs/design.md section 4), and the summary
derived from it.

Files of a run directory:
- ``trace.csv``: one :class:`TraceRow` per executed operation;
- ``steps.csv``: one :class:`StepRecord` per step;
- ``sequences.csv``: one :class:`TrainedSeq` per trained sequence (source of the deferral histogram);
- ``summary.json``: :func:`summarize` of the above plus the config.

The three record types are ``NamedTuple``s: immutable like frozen dataclasses and about four times cheaper to
create (a 1000-step simulation at B = 512 on 8 GPUs makes ~800k of them).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import operator
import os
import re
import typing
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

PHASES = ("decode", "prefill", "score", "train_actor", "train_critic", "sync", "other")


class TraceRow(NamedTuple):
    """One operation on one device. Times in seconds from the run's start; tokens are counts, not ids."""

    step: int
    device: str  # e.g. "gpu0-6" (a data-parallel group of GPUs 0..6), "cpu1"
    role: str  # actor, critic, reference, reward
    phase: str  # one of PHASES
    start_s: float
    end_s: float
    batch_size: int  # sequences in the operation
    num_tokens: int  # tokens processed (decoded, prefilled or trained)
    context_tokens: int  # tokens already in the KV cache / attended to, summed over the batch


class StepRecord(NamedTuple):
    step: int
    start_s: float
    end_s: float
    step_s: float
    mean_reward: float
    delta: int  # Δ used this step (prompts over-committed)
    chunk: int  # streamed chunk size in tokens; 0 = not streamed
    finished: int  # trained sequences that are complete
    deferred: int  # sequences carried to the next step


class TrainedSeq(NamedTuple):
    step: int
    seq_id: int
    group_id: int  # its prompt group (G samples of one prompt); equal to seq_id without group sampling
    admitted_step: int
    deferrals: int  # steps it waited beyond its admission step
    response_tokens: int  # response length so far (final length when finished)
    step_tokens: int  # tokens decoded during the step it was trained in
    finished: bool  # False only for T-PPO segments of unfinished sequences
    policy_lag: int  # policy versions between the weights that generated its first token and the trained ones


# ---------------------------------------------------------------------------------------------------------
# CSV / JSON
# ---------------------------------------------------------------------------------------------------------


def field_names(cls: type) -> list[str]:
    """Columns of a record type: a NamedTuple (the high-volume records) or a dataclass."""
    return list(cls._fields) if hasattr(cls, "_fields") else [f.name for f in dataclasses.fields(cls)]


def write_rows(path: str | Path, rows: Iterable[Any], cls: type) -> None:
    """Write dataclass rows to CSV atomically (a temporary file renamed into place: never a half file).

    Values are written as Python prints them (floats: shortest repr, exact round trip; bools: True/False). The
    rows become tuples in C (``attrgetter``) and the csv module formats them in C: ~1 s per million rows."""
    path = Path(path)
    names = field_names(cls)
    values = operator.attrgetter(*names)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(names)
        writer.writerows(map(values, rows))
    os.replace(tmp, path)


def read_rows(path: str | Path, cls: type) -> list[Any]:
    """Read a CSV written by :func:`write_rows` back into dataclass rows."""
    hints = typing.get_type_hints(cls)
    kinds = {name: hints[name].__name__ for name in field_names(cls)}
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = set(kinds) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        return [cls(**{k: _parse(kinds[k], row[k]) for k in kinds}) for row in reader]


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=_jsonable) + "\n")
    os.replace(tmp, path)


def _parse(kind: Any, text: str) -> Any:
    kind = str(kind)
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        return text in ("1", "True", "true")
    return text


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.integer | np.floating):
        return value.item()
    if isinstance(value, tuple | set):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# ---------------------------------------------------------------------------------------------------------
# Derived metrics
# ---------------------------------------------------------------------------------------------------------


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (overlapping operations on a device count once)."""
    return sum(end - start for start, end in _union(list(intervals)))


def device_count(device: str) -> int:
    """GPUs in a device name: "gpu0-6" -> 7, "gpu7" -> 1, anything else -> 1."""
    match = re.fullmatch(r"[a-z]+(\d+)-(\d+)", device)
    return int(match.group(2)) - int(match.group(1)) + 1 if match else 1


def utilization(trace: Sequence[TraceRow], total_s: float) -> dict[str, float]:
    """Busy fraction of each device over ``total_s`` (union of its operations' intervals)."""
    by_device: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in trace:
        by_device[row.device].append((row.start_s, row.end_s))
    if total_s <= 0:
        return {d: 0.0 for d in sorted(by_device)}
    return {d: float(busy_seconds(iv) / total_s) for d, iv in sorted(by_device.items())}


def phase_breakdown(trace: Sequence[TraceRow], steps: int) -> dict[str, float]:
    """Mean seconds per step of each "role/phase"; an operation on a group of devices counts once, for its
    longest member."""
    longest: dict[tuple[int, str, str, float], float] = defaultdict(float)
    for row in trace:
        key = (row.step, row.role, row.phase, row.start_s)
        longest[key] = max(longest[key], row.end_s - row.start_s)
    totals: dict[str, float] = defaultdict(float)
    for (_, role, phase, _), seconds in longest.items():
        totals[f"{role}/{phase}"] += seconds
    return {k: v / max(steps, 1) for k, v in sorted(totals.items())}


def hidden_fraction(
    trace: Sequence[TraceRow],
    hidden: tuple[str, str] = ("reward", "prefill"),
    under: tuple[str, str] = ("actor", "decode"),
) -> float:
    """Share of the time of ``hidden`` (role, phase) operations that overlaps ``under`` operations, e.g. the
    reward model's prefill hidden under the actor's decode. 0 when there is no ``hidden`` work."""
    busy_under = _union([(r.start_s, r.end_s) for r in trace if (r.role, r.phase) == under])
    total = overlapped = 0.0
    for row in trace:
        if (row.role, row.phase) != hidden:
            continue
        total += row.end_s - row.start_s
        overlapped += sum(max(0.0, min(row.end_s, e) - max(row.start_s, s)) for s, e in busy_under)
    return overlapped / total if total > 0 else 0.0


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def time_to_reward(
    rewards: Sequence[float], step_seconds: Sequence[float], threshold: float, window: int = 5
) -> float | None:
    """Seconds of steps until the mean reward over ``window`` consecutive steps first reaches ``threshold``."""
    for i in range(window - 1, len(rewards)):
        if sum(rewards[i - window + 1 : i + 1]) / window >= threshold:
            return float(sum(step_seconds[: i + 1]))
    return None


def deferral_histogram(trained: Sequence[TrainedSeq]) -> dict[int, float]:
    """Deferral count -> fraction of trained finished sequences (paper Table 2)."""
    counts = Counter(t.deferrals for t in trained if t.finished)
    n = sum(counts.values())
    return {k: counts[k] / n for k in sorted(counts)} if n else {}


def summarize(
    policy: str,
    steps: Sequence[StepRecord],
    trace: Sequence[TraceRow],
    trained: Sequence[TrainedSeq],
    config: dict[str, Any],
    wall_s: float,
    final_window: int = 5,
) -> dict[str, Any]:
    """The ``summary.json`` of a run. ``final_reward`` is the mean reward of the last ``final_window`` steps."""
    step_s = np.array([s.step_s for s in steps]) if steps else np.zeros(1)
    total_s = steps[-1].end_s - steps[0].start_s if steps else 0.0
    util = utilization(trace, total_s)
    weights = {d: device_count(d) for d in util}
    mean_util = sum(util[d] * weights[d] for d in util) / sum(weights.values()) if util else 0.0
    hist = deferral_histogram(trained)
    lag = np.array([t.policy_lag for t in trained]) if trained else np.zeros(1)
    rewards = [s.mean_reward for s in steps[-final_window:]]
    return {
        "policy": policy,
        "steps": len(steps),
        "batch": config.get("schedule", {}).get("batch"),
        "mean_step_s": float(step_s.mean()),
        "p50_step_s": float(np.percentile(step_s, 50)),
        "p99_step_s": float(np.percentile(step_s, 99)),
        "total_s": float(total_s),
        "utilization": util,
        "mean_utilization": float(mean_util),
        "deferral_hist": {str(k): v for k, v in hist.items()},
        "mean_deferrals": float(sum(k * v for k, v in hist.items())),
        "mean_policy_lag": float(lag.mean()),
        "p99_policy_lag": float(np.percentile(lag, 99)),
        "final_reward": float(np.mean(rewards)) if rewards else float("nan"),
        "wall_s": float(wall_s),
        "config": config,
    }


def write_run(
    out: str | Path,
    steps: Sequence[StepRecord],
    trace: Sequence[TraceRow],
    trained: Sequence[TrainedSeq],
    summary: dict[str, Any],
) -> None:
    """Write the run's four files to ``out`` (created if needed)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / "steps.csv", steps, StepRecord)
    write_rows(out / "trace.csv", trace, TraceRow)
    write_rows(out / "sequences.csv", trained, TrainedSeq)
    write_json(out / "summary.json", summary)
