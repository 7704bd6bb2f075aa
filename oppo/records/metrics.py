"""Metrics derived from a run's records: busy fractions, time per stage, hidden overlap, MFU, the summary."""

from __future__ import annotations

import functools
import operator
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any

import numpy as np

from oppo.records.schema import StepRecord, TraceRow, TrainedColumns, TrainedSeq


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    block_starts, block_ends = _union(starts, ends)
    return float((block_ends - block_starts).sum())


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as disjoint blocks (starts, ends), ascending. Vectorised: sorted by
    start, an interval opens a new block when it starts after every earlier one ended."""
    if not len(starts):
        return np.zeros(0), np.zeros(0)
    order = np.argsort(starts, kind="stable")
    starts, reach = starts[order], np.maximum.accumulate(ends[order])  # reach: the latest end so far
    first = np.flatnonzero(np.concatenate([[True], starts[1:] > reach[:-1]]))  # each block's first interval
    last = np.append(first[1:], len(starts)) - 1
    return starts[first], reach[last]


@dataclass(frozen=True)
class Columns:
    """A trace as columns (numpy arrays; strings as integer codes into ``names``), for vectorised metrics."""

    step: np.ndarray
    device: np.ndarray  # codes into devices
    stage: np.ndarray  # codes into stages ("role/phase")
    start: np.ndarray
    end: np.ndarray
    tokens: np.ndarray
    devices: list[str]
    stages: list[str]

    @classmethod
    def of(cls, trace: Sequence[TraceRow]) -> Columns:
        if not trace:
            empty = np.zeros(0)
            return cls(empty, empty.astype(int), empty.astype(int), empty, empty, empty, [], [])

        def column(i: int, dtype=None):  # one C-level pass per column (faster than transposing with zip)
            values = map(operator.itemgetter(i), trace)
            return list(values) if dtype is None else np.fromiter(values, dtype=dtype, count=len(trace))

        names = [name_codes(column(k)) for k in (1, 2, 3)]  # device, role, phase
        return cls.build(column(0, np.int64), *names, column(4, float), column(5, float), column(7, float))

    @classmethod
    def build(cls, step, device, role, phase, start, end, tokens) -> Columns:
        """From one value per row: ``step`` (int64 array), ``start``, ``end``, ``tokens`` (float arrays), all of
        one length (at least one row), and ``device``, ``role``, ``phase`` each as :func:`name_codes` gives them: the
        distinct names in first-seen order and each row's index among them."""
        (devices, device_code), (roles, role_code), (phases, phase_code) = device, role, phase
        pairs, stage_code = np.unique(role_code * len(phases) + phase_code, return_inverse=True)
        stages = [f"{roles[pair // len(phases)]}/{phases[pair % len(phases)]}" for pair in pairs]
        return cls(step, device_code, stage_code, start, end, tokens, devices, stages)

    def operations(self) -> tuple[np.ndarray, np.ndarray]:
        """One index per operation (rows of one op on a group of devices share step, stage and start): the row of
        its longest member, and its member count (sorted once, read by two metrics of a summary)."""
        return self._operations

    @functools.cached_property
    def _operations(self) -> tuple[np.ndarray, np.ndarray]:
        order = np.lexsort((self.end - self.start, self.start, self.stage, self.step))
        key = np.stack([self.step[order], self.stage[order], self.start[order]], axis=1)
        new = np.concatenate([[True], (key[1:] != key[:-1]).any(axis=1)])
        last = np.append(np.flatnonzero(new)[1:], len(order)) - 1  # sorted by duration: the last is the longest
        return order[last], np.diff(np.append(np.flatnonzero(new), len(order)))


def name_codes(values: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The distinct values (first-seen order) and each value's index among them; the loops run in C."""
    names = list(dict.fromkeys(values))
    index = {name: i for i, name in enumerate(names)}
    return names, np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))


def device_count(device: str) -> int:
    """GPUs in a device name: "gpu0-6" -> 7, "gpu7" -> 1, anything else -> 1."""
    match = re.fullmatch(r"[a-z]+(\d+)-(\d+)", device)
    return int(match.group(2)) - int(match.group(1)) + 1 if match else 1


def utilization(trace: Sequence[TraceRow] | Columns, total_s: float) -> dict[str, float]:
    """Busy fraction of each device over ``total_s`` (union of its operations' intervals)."""
    cols = trace if isinstance(trace, Columns) else Columns.of(trace)
    busy = {}
    for code, device in enumerate(cols.devices):
        mine = cols.device == code
        busy[device] = _union_length(cols.start[mine], cols.end[mine]) / total_s if total_s > 0 else 0.0
    return dict(sorted(busy.items()))


def phase_breakdown(trace: Sequence[TraceRow] | Columns, steps: int) -> dict[str, float]:
    """Mean seconds per step of each "role/phase"; an operation on a group of devices counts once, for its
    longest member."""
    cols = trace if isinstance(trace, Columns) else Columns.of(trace)
    ops, _ = cols.operations()
    seconds = np.bincount(cols.stage[ops], weights=(cols.end - cols.start)[ops], minlength=len(cols.stages))
    return {
        stage: float(seconds[code]) / max(steps, 1)
        for code, stage in sorted(enumerate(cols.stages), key=lambda item: item[1])
    }


def hidden_fraction(
    trace: Sequence[TraceRow],
    hidden: tuple[str, str] = ("reward", "prefill"),
    under: tuple[str, str] = ("actor", "decode"),
) -> float:
    """Share of the time of ``hidden`` (role, phase) operations that overlaps ``under`` operations, e.g. the
    reward model's prefill hidden under the actor's decode. 0 when there is no ``hidden`` work."""

    def intervals(kind: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
        rows = [(r.start_s, r.end_s) for r in trace if (r.role, r.phase) == kind]
        pairs = np.asarray(rows, dtype=float).reshape(-1, 2)
        return pairs[:, 0], pairs[:, 1]

    starts, ends = intervals(hidden)
    total = float((ends - starts).sum())
    if total <= 0:
        return 0.0
    block_starts, block_ends = _union(*intervals(under))
    if not len(block_starts):
        return 0.0
    lengths = block_ends - block_starts
    before = np.concatenate([[0.0], np.cumsum(lengths)])  # covered time of the blocks before block k

    def covered(t: np.ndarray) -> np.ndarray:
        """Time the blocks cover before each t; an interval [a, b) overlaps them for covered(b) - covered(a)."""
        k = np.searchsorted(block_starts, t, side="right") - 1  # the last block starting at or before t (-1: none)
        j = np.maximum(k, 0)
        return np.where(k >= 0, before[j] + np.clip(t - block_starts[j], 0.0, lengths[j]), 0.0)

    return float((covered(ends) - covered(starts)).sum()) / total


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
    trained = TrainedColumns.of(trained)
    counts = Counter(compress(trained.column("deferrals"), trained.column("finished")))  # in C: ~500k rows
    n = sum(counts.values())
    return {k: counts[k] / n for k in sorted(counts)} if n else {}


def summarize(
    policy: str,
    steps: Sequence[StepRecord],
    trace: Sequence[TraceRow] | Columns,
    trained: Sequence[TrainedSeq],
    config: dict[str, Any],
    wall_s: float,
    final_window: int = 5,
    flops_per_token: Mapping[str, float] | None = None,
    peak_flops: float | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` of a run. ``final_reward`` is the mean reward of the last ``final_window`` steps;
    ``flops_per_token`` (per role) and ``peak_flops`` (per device) give MFU per stage where both are known."""
    step_s = np.array([s.step_s for s in steps]) if steps else np.zeros(1)
    total_s = steps[-1].end_s - steps[0].start_s if steps else 0.0
    cols = trace if isinstance(trace, Columns) else Columns.of(trace)  # one columnar view for every metric
    util = utilization(cols, total_s)
    weights = {d: device_count(d) for d in util}
    mean_util = sum(util[d] * weights[d] for d in util) / sum(weights.values()) if util else 0.0
    trained = TrainedColumns.of(trained)  # one columnar view for every metric
    hist = deferral_histogram(trained)
    lag = np.array(trained.column("policy_lag")) if len(trained) else np.zeros(1)
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
        **work_done(trained, total_s),
        "wall_s": float(wall_s),
        "phase_s_per_step": phase_breakdown(cols, len(steps)),
        "stages": stage_throughput(cols, flops_per_token or {}, peak_flops),
        "config": config,
    }


def work_done(trained: Sequence[TrainedSeq], total_s: float) -> dict[str, float | int]:
    """Trained work per simulated (or measured) second: ``samples_per_s`` counts finished responses only (a T-PPO
    segment of an unfinished one is not a sample), ``tokens_per_s`` their response tokens, each once."""
    trained = TrainedColumns.of(trained)
    finished = trained.column("finished")
    done, tokens = sum(finished), sum(compress(trained.column("response_tokens"), finished))
    return {
        "trained_samples": done,
        "samples_per_s": done / total_s if total_s > 0 else 0.0,
        "tokens_per_s": tokens / total_s if total_s > 0 else 0.0,
    }


def stage_throughput(
    trace: Sequence[TraceRow] | Columns, flops_per_token: Mapping[str, float], peak_flops: float | None = None
) -> dict[str, dict[str, float | None]]:
    """Per "role/phase" that computes (not ``sync``, ``other``): tokens per second of its devices and, where the
    devices' peak FLOP/s is known (``peak_flops`` per device), the model FLOPs utilisation (MFU): analytic FLOPs
    (``flops_per_token[role]`` per token of a forward pass, :func:`oppo.catalog.shapes.role_flops_per_token`, three
    times that for training; attention left out) over the time and the peak. An operation on a group of devices counts
    once, for its longest member, against the group's summed peak."""
    cols = trace if isinstance(trace, Columns) else Columns.of(trace)
    ops, members = cols.operations()
    n = len(cols.stages)
    seconds = np.bincount(cols.stage[ops], weights=(cols.end - cols.start)[ops], minlength=n)
    tokens = np.bincount(cols.stage[ops], weights=cols.tokens[ops], minlength=n)
    peak_seconds = np.bincount(cols.stage[ops], weights=(cols.end - cols.start)[ops] * members, minlength=n)
    out = {}
    for code, stage in sorted(enumerate(cols.stages), key=lambda item: item[1]):
        role, phase = stage.split("/", 1)
        if phase in ("sync", "other"):
            continue
        flops = (3.0 if phase.startswith("train") else 1.0) * flops_per_token.get(role, 0.0) * tokens[code]
        peak = peak_seconds[code] * peak_flops if peak_flops else 0.0
        out[stage] = {
            "tokens_per_s": float(tokens[code] / seconds[code]) if seconds[code] > 0 else 0.0,
            "mfu": float(flops / peak) if flops and peak > 0 else None,
        }
    return out
