"""Per-step logs of real RL training runs: verl console logs, and per-step CSV / JSON-lines metric dumps.

A verl console log prints one line per step, ``step:N - timing/gen:18.859 - ... - response_length/mean:313.8 -
...`` (2024 names ``timing/…``, current ones ``timing_s/…``), among Ray's prefixes and the run's other output; a
metric dump (e.g. a W&B export) has one row per step whose columns are the framework's metric names with ``/`` or
``_``. Both become :class:`RunLog`: per step, the seconds of each stage under our names and the length statistics
the simulator replays. Steps that also tested or saved a checkpoint are left out (their step time includes it).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

# our stage -> the framework's timing metric (after "timing_s_" / "timing_"); "gen" includes weight resharding
STAGES = {
    "gen": "gen",
    "old_log_prob": "old_log_prob",
    "ref": "ref",
    "values": "values",
    "reward": "reward",
    "update_actor": "update_actor",
    "update_critic": "update_critic",
    "step": "step",
}
EXCLUDING = ("testing", "save_checkpoint")  # a step with these timings is not a training step's time
LENGTHS = ("response_length_mean", "response_length_max", "response_length_min", "prompt_length_mean")
STEP_LINE = re.compile(r"\bstep:(\d+) - (.*)$")
METRIC = re.compile(r"^([A-Za-z0-9_/()\-.@]+):(\S+)$")


@dataclass(frozen=True)
class LoggedStep:
    step: int
    stages: dict[str, float]  # our stage name -> seconds, the stages the log has
    response_mean: float
    response_max: float
    response_min: float | None
    prompt_mean: float | None


@dataclass(frozen=True)
class RunLog:
    source: str
    steps: tuple[LoggedStep, ...]

    @property
    def stages(self) -> list[str]:
        """The stages every step logged, in :data:`STAGES` order."""
        common = set.intersection(*(set(s.stages) for s in self.steps))
        return [s for s in STAGES if s in common]


def load_run_log(path: str | Path) -> RunLog:
    """A verl console log (plain or .gz), or a per-step CSV / JSON-lines dump. Raises ``ValueError`` naming the
    file and the problem (binary junk, no steps, no timing columns, negative or non-numeric values)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"log not found: {path}")
    text = _read_text(path)
    name = path.name.removesuffix(".gz")
    if name.endswith(".csv"):
        rows = _csv_rows(path, text)
    elif name.endswith((".jsonl", ".json")):
        rows = _jsonl_rows(path, text)
    else:
        rows = _console_rows(text)
    return _run_log(path, rows)


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise ValueError(f"{path}: not a readable gzip file ({err})") from None
    text = raw.decode("utf-8", errors="replace")
    if not text or text.count("\ufffd") + text.count("\x00") > 0.01 * len(text):
        raise ValueError(f"{path}: not a text log (binary content)")
    return text


def _key(name: str) -> str:
    """A metric name in one spelling: ``timing_s/gen`` and ``timing_s_gen`` both become ``timing_s_gen``."""
    return re.sub(r"[/\-.]", "_", name.strip()).lower()


def _console_rows(text: str) -> list[dict[str, str]]:
    """Metrics of every ``step:N - name:value - ...`` line; lines of one step are merged (verl prints test
    scores on a line of their own)."""
    steps: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        match = STEP_LINE.search(line)
        if not match:
            continue
        metrics = {}
        for part in match.group(2).split(" - "):
            kv = METRIC.match(part.strip())
            if kv:
                metrics[_key(kv.group(1))] = kv.group(2)
        if metrics:
            steps.setdefault(int(match.group(1)), {"step": match.group(1)}).update(metrics)
    return list(steps.values())


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


def _timing(row: dict[str, str], stage: str) -> str | None:
    for prefix in ("timing_s_", "timing_"):
        if prefix + stage in row:
            return row[prefix + stage]
    return None


def _run_log(path: Path, rows: list[dict[str, str]]) -> RunLog:
    if not rows:
        raise ValueError(f"{path}: no steps found (expected 'step:N - timing_s/gen:...' lines or a step column)")
    if not any(_timing(row, s) is not None for row in rows for s in STAGES):
        raise ValueError(f"{path}: no timing columns (expected timing_s/gen, timing/gen, ... per step)")
    steps = []
    for row in rows:
        if any(_timing(row, s) not in (None, "") for s in EXCLUDING):
            continue
        stages = {stage: _number(path, row, _timing(row, metric), f"timing {metric}")
                  for stage, metric in STAGES.items() if _timing(row, metric) not in (None, "")}  # fmt: skip
        if not stages:  # e.g. a line of test scores only
            continue
        missing = [k for k in ("response_length_mean", "response_length_max") if row.get(k) in (None, "")]
        if missing:
            raise ValueError(f"{path}: step {row.get('step')}: missing {', '.join(missing)}")
        lengths = {k: _number(path, row, row[k], k) if row.get(k) not in (None, "") else None for k in LENGTHS}
        steps.append(LoggedStep(int(_number(path, row, row.get("step", str(len(steps))), "step")), stages,
                                lengths["response_length_mean"], lengths["response_length_max"],
                                lengths["response_length_min"], lengths["prompt_length_mean"]))  # fmt: skip
    if not steps:
        raise ValueError(f"{path}: no training step with timings (all excluded: testing or checkpoint steps)")
    return RunLog(str(path), tuple(sorted(steps, key=lambda s: s.step)))


def _number(path: Path, row: dict, text: str | None, what: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: step {row.get('step', '?')}: non-numeric {what} {text!r}") from None
    if value < 0 or math.isnan(value) or math.isinf(value):
        raise ValueError(f"{path}: step {row.get('step', '?')}: {what} must be a non-negative number, got {text!r}")
    return value
