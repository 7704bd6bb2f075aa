"""The scheduling configuration shared by both backends.

A config is a frozen dataclass; each field carries its help text in ``metadata["help"]`` so that the same text
is the docstring, the ``--help`` line (:func:`oppo.cli.add_config_args`) and the stored config
(:mod:`oppo.records.stored_config`). ``__post_init__`` validates and raises
``ValueError``; it never rewrites a value.

Each scheduling field's default lives here and nowhere else. A simulator setup or an executor preset overrides a
field by its name (:meth:`oppo.sim.setup.presets.Setup.schedule`, :data:`oppo.exec.config.PRESET_SCHEDULE`), a flag
or a stored config overrides both (:func:`oppo.cli.layered_schedule`), and every consumer reads the resolved
:class:`ScheduleConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from oppo.core.overcommit import DELTA_CONTROLLER_CLASSES
from oppo.core.policies import POLICIES, PolicySpec, policy_spec

DELTA_CONTROLLERS = DELTA_CONTROLLER_CLASSES.names  # registered in oppo.core.overcommit, in its order
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
    max_new_tokens: int = opt(1024, "cap on response tokens per sequence, over all the steps it spans")
    chunk: str = opt("auto", "streamed chunk size in tokens, or 'auto' to explore --chunk-candidates")
    chunk_candidates: tuple[int, ...] = opt((128, 256, 512), "chunk sizes tried by exploration (paper 3.1)")
    explore_period_steps: int = opt(50, "exploration restarts every this many steps (paper: 50)")
    explore_trials: int = opt(1, "steps each candidate chunk is tried for during exploration")
    check_tokens: int = opt(32, "over-commit checks for B finished sequences every this many tokens")
    streamed_scorers: tuple[str, ...] = opt(("reward",), f"scorers fed chunk by chunk: subset of {SCORERS}")
    delta: str = opt("auto", "over-commit Δ in prompts, or 'auto' for the --delta-controller")
    delta_controller: str = opt("slope", f"Δ controller when --delta auto: {DELTA_CONTROLLER_CLASSES.described()}")
    delta_init: int = opt(4, "initial Δ of the controller (prompts)")
    delta_min: int = opt(0, "lower bound on Δ (prompts)")
    delta_max: int = opt(8, "upper bound on Δ (prompts, <= batch)")
    delta_window: int = opt(5, "w (slope) or W (alg1): steps in the reward-trend window")
    delta_inc: int = opt(1, "slope controller: Δ increase when the reward trend is positive")
    delta_dec: int = opt(1, "slope controller: Δ decrease when the reward trend is not positive")
    tail_confidence: float = opt(0.9, "tail controller: probability that B finish by the length it aims at")
    tail_tolerance: float = opt(0.1, "tail controller: share of the largest tail cut it may give up for a smaller Δ")
    max_deferrals: int = opt(3, "starvation bound (>= 1): a sequence deferred this many steps is waited for")
    window_tokens: int = opt(256, "tppo: at most this many new tokens per sequence per step")
    staleness: int = opt(
        1,
        "async: generation runs ahead of training by at most this many policy versions (1: one-step-off, 0: "
        "synchronous)",
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
        if self.staleness < 0:
            raise ValueError(f"staleness must be >= 0 (0: synchronous), got {self.staleness}")
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

    # Derived settings: what the policy switches on (its spec, registered in oppo.core.policies).
    @property
    def spec(self) -> PolicySpec:
        return policy_spec(self.policy)

    @property
    def streaming(self) -> bool:
        """Scorers prefill chunk by chunk while the actor decodes (intra-step overlap)."""
        return self.spec.streaming

    @property
    def overcommit(self) -> bool:
        """B+Δ prompts in flight, train on the first B finished (inter-step overlap)."""
        return self.spec.overcommit

    @property
    def truncated(self) -> bool:
        """T-PPO: each step generates at most ``window_tokens`` per sequence."""
        return self.spec.truncated

    @property
    def asynchronous(self) -> bool:
        """Generation runs ahead of training by at most ``staleness`` policy versions."""
        return self.spec.asynchronous

    @property
    def fixed_chunk(self) -> int | None:
        return None if self.chunk == "auto" else int(self.chunk)

    @property
    def fixed_delta(self) -> int | None:
        return None if self.delta == "auto" else int(self.delta)


def schedule_from(defaults: dict[str, Any], **overrides: Any) -> ScheduleConfig:
    """A schedule from a backend's or setup's ``defaults`` with ``overrides`` on top. Default Δ bounds follow a
    smaller batch (``delta_max <= batch``, ``delta_init <= delta_max``); bounds given in ``overrides`` are kept
    as given, so a contradiction still fails validation.

    >>> defaults = {"policy": "oppo", "delta_init": 6, "delta_max": 8}
    >>> schedule = schedule_from(defaults, batch=4)  # the defaults' bounds follow the batch of 4
    >>> schedule.delta_max, schedule.delta_init
    (4, 4)
    >>> schedule_from(defaults, batch=4, delta_init=2, delta_max=6)  # given bounds are kept, and checked
    Traceback (most recent call last):
    ...
    ValueError: over-commit Δ up to 6 exceeds batch 4; Δ must be <= B
    """
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


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a (nested) config, tuples as lists."""
    return dataclasses.asdict(config)
