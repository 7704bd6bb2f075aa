"""The scheduling configuration shared by both backends, and the CLI generated from config dataclasses.

A config is a frozen dataclass; each field carries its help text in ``metadata["help"]`` so that the same text
is the docstring, the ``--help`` line and the stored config. ``__post_init__`` validates and raises
``ValueError``; it never rewrites a value.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oppo.data import trace_path

POLICIES = ("sync", "intra", "inter", "oppo", "tppo", "april", "tailbatch", "async")
DELTA_CONTROLLERS = ("slope", "alg1", "tail")
ALGOS = ("ppo", "grpo")
SCORERS = ("reward", "reference", "critic")


def opt(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field whose help text feeds ``--help``."""
    if isinstance(default, list | dict | set):
        raise TypeError("mutable defaults are not allowed in configs")
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass(frozen=True)
class ScheduleConfig:
    """How one PPO step is scheduled: the policy and its controllers. Token counts are response tokens."""

    policy: str = opt("oppo", f"scheduling policy: {', '.join(POLICIES)}")
    algo: str = opt(
        "ppo",
        "ppo (one sample per prompt, critic) or grpo (--group-size samples per prompt, "
        "group-relative advantages, no critic)",
    )
    group_size: int = opt(1, "G: samples per prompt; the prompt group is the unit of admission and training")
    batch: int = opt(8, "B: prompt groups trained per step (prompts, not tokens; B x G sequences)")
    max_new_tokens: int = opt(256, "cap on response tokens per sequence, over all the steps it spans")
    chunk: str = opt("auto", "streamed chunk size in tokens, or 'auto' to explore --chunk-candidates")
    chunk_candidates: tuple[int, ...] = opt((32, 64, 128), "chunk sizes tried by exploration (paper: 128,256,512)")
    explore_period_steps: int = opt(50, "exploration restarts every this many steps (paper: 50)")
    explore_trials: int = opt(1, "steps each candidate chunk is tried for during exploration")
    check_tokens: int = opt(16, "over-commit checks for B finished sequences every this many tokens")
    streamed_scorers: tuple[str, ...] = opt(("reward",), f"scorers fed chunk by chunk: subset of {SCORERS}")
    delta: str = opt("auto", "over-commit Δ in prompts, or 'auto' for the --delta-controller")
    delta_controller: str = opt(
        "slope",
        "Δ controller when --delta auto: slope (paper Eq. 4), alg1 (Alg. 1) or "
        "tail (from the observed length distribution)",
    )
    delta_init: int = opt(4, "initial Δ of the controller (prompts)")
    delta_min: int = opt(0, "lower bound on Δ (prompts)")
    delta_max: int = opt(8, "upper bound on Δ (prompts, <= batch)")
    delta_window: int = opt(5, "w (slope) or W (alg1): steps in the reward-trend window")
    delta_inc: int = opt(1, "slope controller: Δ increase when the reward trend is positive")
    delta_dec: int = opt(1, "slope controller: Δ decrease when the reward trend is not positive")
    tail_confidence: float = opt(0.9, "tail controller: probability that B finish by the length it aims at")
    tail_tolerance: float = opt(0.1, "tail controller: share of the largest tail cut it may give up for a smaller Δ")
    max_deferrals: int = opt(3, "starvation bound (>= 1): a sequence deferred this many steps is waited for")
    window_tokens: int = opt(64, "tppo: at most this many new tokens per sequence per step")
    staleness: int = opt(
        1, "async: generation runs ahead of training by at most this many policy versions (1: one-step-off)"
    )

    def __post_init__(self) -> None:
        _check_choice("policy", self.policy, POLICIES)
        _check_choice("algo", self.algo, ALGOS)
        if (self.algo == "ppo") != (self.group_size == 1):
            raise ValueError(
                f"algo {self.algo} needs group_size {'1' if self.algo == 'ppo' else '>= 2'}, got {self.group_size}"
            )
        if self.truncated and self.group_size > 1:
            raise ValueError("tppo trains segments of single sequences; it does not support group sampling")
        _check_choice("delta_controller", self.delta_controller, DELTA_CONTROLLERS)
        positive = (
            "batch",
            "group_size",
            "staleness",
            "max_new_tokens",
            "explore_period_steps",
            "explore_trials",
            "check_tokens",
            "delta_window",
            "delta_inc",
            "delta_dec",
            "window_tokens",
        )
        for name in positive:
            check_positive(name, getattr(self, name))
        if self.max_deferrals < 1 or self.delta_min < 0:
            raise ValueError("max_deferrals must be >= 1 and delta_min >= 0")
        if self.delta_min > self.delta_max:
            raise ValueError(f"delta bounds reversed: delta_min={self.delta_min} > delta_max={self.delta_max}")
        if not self.delta_min <= self.delta_init <= self.delta_max:
            raise ValueError(f"delta_init={self.delta_init} outside [{self.delta_min}, {self.delta_max}]")
        if not 0.5 <= self.tail_confidence < 1 or not 0 <= self.tail_tolerance < 1:
            raise ValueError("tail_confidence must be in [0.5, 1) and tail_tolerance in [0, 1)")
        if not self.chunk_candidates or min(self.chunk_candidates) <= 0:
            raise ValueError("chunk_candidates must be positive token counts")
        for scorer in self.streamed_scorers:
            _check_choice("streamed_scorers", scorer, SCORERS)
        if self.chunk != "auto":
            check_positive("chunk", _parse_int("chunk", self.chunk))
        if self.delta != "auto" and _parse_int("delta", self.delta) < 0:
            raise ValueError(f"delta must be >= 0 or 'auto', got {self.delta!r}")
        # Δ <= B keeps the carried finished sequences (<= Δ) trainable in the next step, which is what bounds
        # every deferral by max_deferrals.
        largest = self.delta_max if self.delta == "auto" else int(self.delta)
        if self.overcommit and largest > self.batch:
            raise ValueError(f"over-commit Δ up to {largest} exceeds batch {self.batch}; Δ must be <= B")

    # Derived settings: what the policy switches on.
    @property
    def streaming(self) -> bool:
        """Scorers prefill chunk by chunk while the actor decodes (intra-step overlap)."""
        return self.policy in ("intra", "oppo")

    @property
    def overcommit(self) -> bool:
        """B+Δ prompts in flight, train on the first B finished (inter-step overlap)."""
        return self.policy in ("inter", "oppo", "april", "tailbatch")

    @property
    def truncated(self) -> bool:
        """T-PPO: each step generates at most ``window_tokens`` per sequence."""
        return self.policy == "tppo"

    @property
    def fixed_chunk(self) -> int | None:
        return None if self.chunk == "auto" else int(self.chunk)

    @property
    def fixed_delta(self) -> int | None:
        return None if self.delta == "auto" else int(self.delta)


def schedule_from(defaults: dict[str, Any], **overrides: Any) -> ScheduleConfig:
    """A schedule from a backend's or setup's ``defaults`` with ``overrides`` on top. Default Δ bounds follow a
    smaller batch (``delta_max <= batch``, ``delta_init <= delta_max``); bounds given in ``overrides`` are kept
    as given, so a contradiction still fails validation."""
    defaults = dict(defaults)
    batch = overrides.get("batch", defaults.get("batch", ScheduleConfig.batch))
    delta_max = min(defaults.get("delta_max", ScheduleConfig.delta_max), batch)
    defaults["delta_max"] = delta_max
    defaults["delta_init"] = min(defaults.get("delta_init", ScheduleConfig.delta_init), delta_max)
    return ScheduleConfig(**{**defaults, **overrides})


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose from {', '.join(choices)}")


def check_positive(name: str, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def _parse_int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer or 'auto', got {text!r}") from None


# ---------------------------------------------------------------------------------------------------------
# CLI generated from config dataclasses
# ---------------------------------------------------------------------------------------------------------


def add_config_args(
    parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (), shown: dict[str, Any] | None = None
) -> None:
    """Add one ``--field-name`` option per field of ``cls``. Options left out parse to None (the config's own
    default applies); help shows the dataclass default, or ``shown[field]`` where the command uses another."""
    group = parser.add_argument_group(cls.__name__)
    hints = typing.get_type_hints(cls)
    shown = shown or {}
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        kind = hints[f.name]
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} (default: {_show(shown.get(f.name, f.default))})"
        if kind is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            metavar = f.name.upper()
            group.add_argument(flag, dest=f.name, type=_parser_for(kind), default=None, help=help_text, metavar=metavar)


def given_options(cls: type, args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of ``cls`` the user set on the command line (options left out parse to None)."""
    return {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if f.name not in skip and getattr(args, f.name, None) is not None
    }


def _show(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple | list) else str(value)


def _parser_for(kind: Any):
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        return lambda text: tuple(item(part) for part in text.split(",") if part)
    if isinstance(kind, types.UnionType):  # e.g. str | None: parse as the first concrete type
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    return kind


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a (nested) config, tuples as lists."""
    return dataclasses.asdict(config)


# ---------------------------------------------------------------------------------------------------------
# Stored configs: a run's config.json read back (``--config RUN_DIR/config.json``)
# ---------------------------------------------------------------------------------------------------------


def load_stored_config(path: str | Path) -> dict[str, Any]:
    """The JSON object of a run's ``config.json`` (a run directory is accepted too)."""
    return read_config_json(path, "config")


def read_config_json(path: str | Path, what: str) -> dict[str, Any]:
    """The JSON object of a ``config.json`` file, or of the one in a folder (a run, a checkpoint); errors name
    the file: not found (``what``), not JSON, not an object."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a JSON config ({err})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a JSON object")
    return raw


def config_from_dict(cls: type, values: dict[str, Any], where: str, **given: Any) -> Any:
    """``cls`` from a stored dict (JSON lists back to tuples) plus ``given`` fields; an unknown key is an error
    (a config written by another version must not be half-applied silently)."""
    if not isinstance(values, dict):
        raise ValueError(f"{where}: expected a table of settings")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {', '.join(unknown)}")
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    try:
        return cls(**(kwargs | given))
    except TypeError as err:
        raise ValueError(f"{where}: {err}") from None


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def sources_of(files: dict[str, str]) -> dict[str, dict[str, str]]:
    """Content digests of the input files a run read, stored beside its config (``sources``)."""
    return {name: {"path": str(path), "sha256": file_sha256(trace_path(path))} for name, path in files.items()}


def check_sources(stored: dict[str, Any], files: dict[str, str], where: str) -> None:
    """Fail if an input file of a stored run changed since: re-running it would not give the same records."""
    for name, path in files.items():
        digest = stored.get(name, {}).get("sha256") if isinstance(stored.get(name), dict) else None
        if digest is None:
            continue
        resolved = trace_path(path)
        if not resolved.is_file():
            raise FileNotFoundError(f"{where}: {name} file not found: {path}")
        if file_sha256(resolved) != digest:
            raise ValueError(f"{where}: {name} file {path} changed since the run (sha256 differs)")
