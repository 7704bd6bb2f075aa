"""Per-step logs of real RL training runs: verl and OpenRLHF console logs, and per-step CSV / JSON-lines dumps.

A verl console log prints one line per step, ``step:N - timing/gen:18.859 - ... - response_length/mean:313.8 -
...`` (2024 names ``timing/…``, current ones ``timing_s/…``), among Ray's prefixes and the run's other output.
OpenRLHF (2025-26) prints ``✨ Global step N: {'timing/generation': 41.2, 'timing/make_experience': 9.8, ...}``,
a Python dict per step, with coarser stages: generation, the weight broadcast into vLLM, experience making (old
log-probs, reference, values and reward together), the PPO update (actor and critic together) and only the mean
response length. A metric dump (e.g. a W&B export) has one row per step whose columns are the framework's metric
names with ``/`` or ``_`` (a ``train/`` prefix is ignored). All become :class:`TrainingLog`: per step, the seconds
of each logged stage under our names and the length statistics the simulator replays. Steps that also tested or
saved a checkpoint are left out (their step time includes it).
"""

from __future__ import annotations

import ast
import csv
import gzip
import io
import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

# logged stage -> the framework's timing metrics (after "timing_s_" / "timing_") summed into it: the first group
# a row has. "gen" includes the weight resharding (verl) or broadcast (OpenRLHF) into the rollout engine.
STAGES = {
    "gen": (("gen",), ("generation", "broadcast"), ("generation",)),
    "reshard": (("reshard",),),  # verl 2025: the weights loaded into the rollout engine, inside "gen"
    "old_log_prob": (("old_log_prob",),),
    "ref": (("ref",),),
    "values": (("values",),),
    "reward": (("reward",),),
    "update_actor": (("update_actor",),),
    "update_critic": (("update_critic",),),
    "make_experience": (("make_experience",),),
    "ppo_train": (("ppo_train",),),
    # verl's asynchronous trainers: the trainer's weights pushed to the rollout GPUs (one-step-off, fully async)
    "weight_sync": (("sync_rollout_weights",), ("param_sync",)),
    "step": (("step",), ("step_total",)),
}
SUBSTAGES = {"reshard": "gen"}  # a logged stage timed inside another: fitted apart, never added to the step
# a logged stage that times several of ours at once (OpenRLHF) -> ours
COMPOSITES = {
    "make_experience": ("old_log_prob", "ref", "values", "reward"),
    "ppo_train": ("update_actor", "update_critic"),
}
EXCLUDING = ("testing", "save_checkpoint")  # a step with these timings is not a training step's time
# verl's asynchronous trainers (one-step-off, fully async: ``verl/experimental``) time ``gen`` as the trainer's wait
# for its samples, not generation; their logs carry these metrics (after ``_key``)
ASYNC_METRICS = (
    "timing_s_generate_async",
    "timing_s_sync_rollout_weights",
    "timing_s_param_sync",
    "timing_s_wait_last_valid",
    "timing_s_wait_prev_gen",
    "trainer_idle_ratio",
)
# the one-step-off trainer's wait for its samples: ``gen`` (verl/experimental, 2025-12 on), ``wait_prev_gen``
# (recipe/one_step_off_policy, 2025-07 to 2025-12)
ASYNC_WAIT = ("gen", "wait_prev_gen")
# its generation, best first: the slowest request's generate time (the agent loop's, in the row since 2025-12),
# the rollout workers' generate call (recipe era), the trainer's timer around the background task (it only sees
# generation end at its next await, between stages: an overstatement where the trainer was busy)
ASYNC_GENERATION = ("agent_loop_generate_sequences_max", "generate_sequences", "generate_async")  # as _key spells them
LENGTHS = {  # statistic -> its metric names, first found wins (verl, OpenRLHF)
    "mean": ("response_length_mean", "rollout_response_length_mean", "response_length"),
    "max": ("response_length_max",),
    "min": ("response_length_min",),
    "prompt": ("prompt_length_mean",),
    "clipped": ("response_length_clip_ratio", "rollout_truncated_rate"),  # share of responses at the cap
    "tokens": ("perf_total_num_tokens", "total_num_tokens"),  # prompt + response tokens of a step's sequences (verl)
}
PERF = {  # device metrics of the actor update, field -> metric names (verl: perf/..., older and CSV dumps without)
    "mfu": ("perf_mfu_actor", "mfu_actor"),  # model FLOPs utilisation, a fraction of the device's promised peak
    "memory_reserved_gib": ("perf_max_memory_reserved_gb", "max_memory_reserved_gb"),  # GiB (2**30 bytes)
}
STEP_KEYS = ("step", "global_step")
# verl's fully async trainer logs a row per weight version: its last trainer step, counted from 1 (the trainer
# steps a row sums are the difference from the previous row's)
TRAINER_STEP = "training_global_step"
PREFIXES = ("", "train_")  # a W&B export of OpenRLHF names its metrics train/...
STEP_LINE = re.compile(r"\bstep:(\d+) - (.*)$")
GLOBAL_STEP_LINE = re.compile(r"Global step (\d+): (\{.*\})\s*$")
METRIC = re.compile(r"^([A-Za-z0-9_/()\-.@]+):(\S+)$")


@dataclass(frozen=True)
class LoggedStep:
    step: int
    stages: dict[str, float]  # logged stage name -> seconds, the stages the log has
    response_mean: float
    response_max: float | None  # None: not logged (OpenRLHF)
    response_min: float | None
    prompt_mean: float | None
    clipped: float | None = None  # share of responses that hit the length cap, where logged
    total_tokens: float | None = None  # prompt + response tokens of every sequence of the step, where logged
    mfu: float | None = None  # the actor update's MFU as verl computes it (perf/mfu/actor), where logged
    memory_reserved_bytes: float | None = None  # the peak GPU memory PyTorch reserved (perf/max_memory_reserved_gb)
    trainer_wait_s: float | None = None  # an asynchronous trainer's wait for its samples (its ``timing_s/gen``)
    # an asynchronous trainer's step (``timing_s/step``: its wait, weight sync and stages, generation beside them):
    # no sum of stages, predicted by the ``async`` policy
    async_step_s: float | None = None
    # the trainer steps the row's timings and token count sum (verl's fully async trainer: the steps between two
    # weight versions, trigger_parameter_sync_step); the weight push is made once a row; lengths are their means
    trainer_steps: int = 1


@dataclass(frozen=True)
class TrainingLog:
    """A real training run's log (``source``: its path): its training steps, in step order."""

    source: str
    steps: tuple[LoggedStep, ...]
    asynchronous: bool = False  # an asynchronous trainer's log: generation runs beside the steps, on GPUs of its own
    fully_async: bool = False  # verl's fully async trainer: a row sums trigger_parameter_sync_step trainer steps

    @property
    def stages(self) -> list[str]:
        """The stages every step logged, in :data:`STAGES` order."""
        common = set.intersection(*(set(s.stages) for s in self.steps))
        return [s for s in STAGES if s in common]


def load_run_log(path: str | Path) -> TrainingLog:
    """A verl console log (plain or .gz), or a per-step CSV / JSON-lines dump. Raises ``ValueError`` naming the
    file and the problem (binary junk, no steps, no timing columns, negative or non-numeric values)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"log not found: {path}")
    text = read_log_text(path)
    name = path.name.removesuffix(".gz")
    if name.endswith(".csv"):
        rows = _csv_rows(path, text)
    elif name.endswith((".jsonl", ".json")):
        rows = _jsonl_rows(path, text)
    else:
        rows = _console_rows(path, text)
    return _run_log(path, rows)


def read_log_text(path: Path) -> str:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise ValueError(f"{path}: not a readable gzip file ({err})") from None
    if not raw.strip():
        raise ValueError(f"{path}: empty file (no steps logged)")
    text = raw.decode("utf-8", errors="replace")
    if text.count("\ufffd") + text.count("\x00") > 0.01 * len(text):
        raise ValueError(f"{path}: not a text log (binary content)")
    return text


def _key(name: str) -> str:
    """A metric name in one spelling: ``timing_s/gen`` and ``timing_s_gen`` both become ``timing_s_gen``."""
    return re.sub(r"[/\-.]", "_", name.strip()).lower()


def _console_rows(path: Path, text: str) -> list[dict[str, str]]:
    """Metrics of every verl ``step:N - name:value - ...`` line and every OpenRLHF ``Global step N: {...}`` line;
    lines of one step are merged (verl prints test scores on a line of their own)."""
    steps: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        match = STEP_LINE.search(line) or GLOBAL_STEP_LINE.search(line)
        if not match:
            continue
        metrics = _dict_metrics(match.group(2)) if match.re is GLOBAL_STEP_LINE else _dash_metrics(match.group(2))
        if metrics:
            try:
                step = int(match.group(1))
            except ValueError:  # thousands of digits: past Python's limit on converting them
                raise ValueError(f"{path}: a step number of {len(match.group(1))} digits") from None
            steps.setdefault(step, {"step": match.group(1)}).update(metrics)
    return list(steps.values())


def _dash_metrics(text: str) -> dict[str, str]:
    metrics = {}
    for part in text.split(" - "):
        kv = METRIC.match(part.strip())
        if kv:
            metrics[_key(kv.group(1))] = kv.group(2)
    return metrics


def _dict_metrics(text: str) -> dict[str, str]:
    """The numbers of a printed Python dict (a line cut short or holding other objects gives none)."""
    try:
        values = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return {}
    if not isinstance(values, dict):
        return {}
    return {_key(str(k)): str(v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _csv_rows(path: Path, text: str) -> list[dict[str, str]]:
    try:
        rows = list(csv.DictReader(io.StringIO(text)))
    except csv.Error as err:
        raise ValueError(f"{path}: not a readable CSV ({err})") from None
    return [{_key(k): v for k, v in row.items() if k is not None} for row in rows]


def _jsonl_rows(path: Path, text: str) -> list[dict[str, str]]:
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {i}: not JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {i}: expected an object of metrics")
        rows.append({_key(k): str(v) for k, v in row.items()})
    return rows


def _value(row: dict[str, str], *names: str) -> tuple[str, str] | None:
    """(name, text) of the first of ``names`` the row has a value for (any of :data:`PREFIXES` before it)."""
    for name in names:
        for prefix in PREFIXES:
            if row.get(prefix + name) not in (None, ""):
                return prefix + name, row[prefix + name]
    return None


def _timing(path: Path, row: dict[str, str], stage: str) -> float | None:
    """Seconds of a logged stage: the sum of the first of its metric groups the row has in full."""
    for group in STAGES.get(stage, ((stage,),)):
        found = [_value(row, f"timing_s_{m}", f"timing_{m}") for m in group]
        if all(found):
            return sum(_number(path, row, text, name) for name, text in found)
    return None


def _run_log(path: Path, rows: list[dict[str, str]]) -> TrainingLog:
    if not rows:
        raise ValueError(
            f"{path}: no steps found (expected 'step:N - timing_s/gen:...' or 'Global step N: {{...}}' "
            "lines, or a step column)"
        )
    timed = [
        {stage: t for stage in (*STAGES, *EXCLUDING) if (t := _timing(path, row, stage)) is not None} for row in rows
    ]
    if not any(timed):
        raise ValueError(f"{path}: no timing columns (expected timing_s/gen, timing/gen, timing/generation, ...)")
    steps = []
    asynchronous = any(_asynchronous(row) for row in rows)
    fully_async = any(k.startswith("fully_async_") for row in rows for k in row)
    counts = _trainer_steps(path, rows) if fully_async else [1] * len(rows)
    for row, times, count in zip(rows, timed, counts):
        stages = {stage: t for stage, t in times.items() if stage in STAGES}
        wait, async_step = _asynchronous_stages(path, row, stages, fully_async) if asynchronous else (None, None)
        if not stages or any(s in times for s in EXCLUDING):  # test scores only, or a step that also tested
            continue
        if fully_async and count is None and set(stages) <= {"weight_sync"}:  # verl's last sync, after no step
            continue
        lengths, perf = _metrics(path, row, LENGTHS), _metrics(path, row, PERF)
        if lengths["mean"] is None:
            raise ValueError(f"{path}: step {row.get('step')}: missing the mean response length (response_length/mean)")
        step = _value(row, *STEP_KEYS)
        reserved = perf["memory_reserved_gib"]
        steps.append(
            LoggedStep(
                int(_number(path, row, step[1], "step")) if step else len(steps),
                stages,
                lengths["mean"],
                lengths["max"],
                lengths["min"],
                lengths["prompt"],
                clipped=lengths["clipped"],
                total_tokens=lengths["tokens"],
                mfu=perf["mfu"],
                memory_reserved_bytes=None if reserved is None else reserved * 2**30,
                trainer_wait_s=wait,
                async_step_s=async_step,
                trainer_steps=_counted(path, row, count, stages),
            )
        )
    if not steps:
        raise ValueError(f"{path}: no training step with timings (all excluded: testing or checkpoint steps)")
    if asynchronous:
        steps = _without_unrun_old_log_prob(steps)
    return TrainingLog(str(path), tuple(sorted(steps, key=lambda s: s.step)), asynchronous, fully_async)


def _asynchronous(row: dict[str, str]) -> bool:
    return any(m in row for m in ASYNC_METRICS) or any(k.startswith("fully_async_") for k in row)


def _asynchronous_stages(
    path: Path, row: dict[str, str], stages: dict[str, float], fully_async: bool
) -> tuple[float | None, float | None]:
    """An asynchronous trainer's step, in place: its ``gen`` (or ``wait_prev_gen``) is the trainer's wait,
    generation the first of :data:`ASYNC_GENERATION` the row has, and its ``step`` holds the wait and the overlap,
    so it is no sum of stages: taken out of them (the stages' sum is compared with theirs, the step with the
    ``async`` policy's). The fully async trainer's rows time no generation: its rollouter generates sample by
    sample across weight versions, and what reaches the row (``fully_async/processing_time/*``) is a sample's
    latency, not a batch's generation. Returns (the wait, the step), None where not logged."""
    stages.pop("gen", None)
    step = stages.pop("step", None)
    wait = next((t for name in ASYNC_WAIT if (t := _timing(path, row, name)) is not None), None)
    generated = next((t for name in ASYNC_GENERATION if (t := _timing(path, row, name)) is not None), None)
    if generated is not None and not fully_async:
        stages["gen"] = generated
    return wait, step


def _trainer_steps(path: Path, rows: list[dict[str, str]]) -> list[int | None]:
    """verl's fully async trainer: per row, the trainer steps it sums. Row v (its weight version) holds the trainer
    steps after (v - 1) x T up to its ``training/global_step`` (the last, counted from 1), T being
    trigger_parameter_sync_step, fresh or resumed (a resumed trainer starts at version x T + 1): its count is
    the global step - (v - 1) x T, whatever rows are missing; the last row of a run, synced early, counts fewer.
    T is the global step over the version that most rows show. None for a row without a global step or version."""
    found = [(_row_version(path, row), _value(row, TRAINER_STEP)) for row in rows]
    marks = [
        (v, _number(path, row, g[1], "training/global_step")) if v and g else None
        for row, (v, g) in zip(rows, found, strict=True)
    ]
    ratios = [last / v for v, last in filter(None, marks) if float(last / v).is_integer()]
    if not ratios:
        return [None] * len(rows)
    trigger = max(set(ratios), key=ratios.count)
    return [None if mark is None else round(mark[1] - (mark[0] - 1) * trigger) for mark in marks]


def _row_version(path: Path, row: dict[str, str]) -> float:
    found = _value(row, *STEP_KEYS)
    return _number(path, row, found[1], "step") if found else 0.0


UNRUN_S = 1e-3  # an old_log_prob timed under this on every step ran no forward pass


def _without_unrun_old_log_prob(steps: list[LoggedStep]) -> list[LoggedStep]:
    """An asynchronous trainer's steps without their ``old_log_prob`` where it is timed under :data:`UNRUN_S` on
    every one: it ran no pass to fit (verl's fully async trainer with ``use_rollout_log_probs``, its default, takes
    the rollout's log-probs as the old ones and times the copy at ~1e-5 s)."""
    if any(s.stages.get("old_log_prob", 0.0) >= UNRUN_S for s in steps):
        return steps
    return [replace(s, stages={k: v for k, v in s.stages.items() if k != "old_log_prob"}) for s in steps]


def _counted(path: Path, row: dict[str, str], count: int | None, stages: dict[str, float]) -> int:
    """A timed row's trainer steps (at least 1); a fully async row that does not say how many is refused."""
    if count is None and stages:
        raise ValueError(
            f"{path}: step {row.get('step', '?')}: verl's fully async trainer's row sums several trainer steps' "
            "timings but has no training/global_step to count them"
        )
    if count is not None and count < 1:
        raise ValueError(f"{path}: step {row.get('step', '?')}: training/global_step does not increase")
    return count or 1


def _metrics(path: Path, row: dict[str, str], table: dict[str, tuple[str, ...]]) -> dict[str, float | None]:
    """The value of each statistic of ``table`` (statistic -> its metric names) in the row, None where not logged."""
    return {
        stat: _number(path, row, found[1], found[0]) if (found := _value(row, *names)) else None
        for stat, names in table.items()
    }


def _number(path: Path, row: dict, text: str | None, what: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: step {row.get('step', '?')}: non-numeric {what} {text!r}") from None
    if value < 0 or math.isnan(value) or math.isinf(value):
        raise ValueError(f"{path}: step {row.get('step', '?')}: {what} must be a non-negative number, got {text!r}")
    return value
