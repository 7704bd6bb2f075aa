"""Δ controllers for inter-step over-commitment (OPPO section 3.2).

Each controller has a ``value`` (Δ: extra prompts in flight, an int within its bounds) and
``update(mean_reward, lengths)`` called once per closed step with that step's mean reward R_t and what the step
showed of the response lengths (:class:`LengthObservation`).

The paper disagrees with itself: Eq. 4 raises Δ while the reward trend is positive, Algorithm 1 (lines 21-26)
lowers it (Δ -= sign(d)·change). ``SlopeDelta`` follows Eq. 4 and is the default; ``Alg1Delta`` is the literal
algorithm, kept so both can be compared. Both look at the reward only; ``TailDelta`` (ours) looks at the lengths.

The controllers ``--delta-controller`` offers are registered beside their classes (:func:`delta_controller`): that
registry is what the option's help, the config's check and :func:`make_delta_controller` read, so a new controller
is one decorated class with a ``from_config`` here.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

from oppo.core.registry import Registry


@dataclass(frozen=True)
class LengthObservation:
    """Response lengths a step revealed, in tokens. ``finished``: final lengths of the sequences that finished
    this step (the cap included: a capped sequence ends there); ``censored``: current lengths of the sequences
    still unfinished after it (their length is known only to exceed that)."""

    finished: tuple[int, ...]
    censored: tuple[int, ...]


class DeltaController(Protocol):
    value: int

    def update(self, mean_reward: float, lengths: LengthObservation | None = None) -> None: ...


DELTA_CONTROLLER_CLASSES: Registry[type] = Registry("delta_controller")  # name -> class with from_config(config)
C = TypeVar("C", bound=type)


def delta_controller(name: str, description: str) -> Callable[[C], C]:
    """Class decorator: offer the class as ``--delta-controller name`` (``description``: its words in ``--help``).
    The class builds itself from a config with a classmethod ``from_config(config)``."""

    def register(cls: C) -> C:
        if not callable(getattr(cls, "from_config", None)):
            raise TypeError(f"Δ controller {cls.__name__} needs a classmethod from_config(config)")
        DELTA_CONTROLLER_CLASSES.add(name, cls, description)
        return cls

    return register


def _bounds(config) -> dict[str, int]:
    """A controller's start and bounds from a config: value, low, high, window."""
    return dict(value=config.delta_init, low=config.delta_min, high=config.delta_max, window=config.delta_window)


def _clip(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


@dataclass
class FixedDelta:
    """Δ never changes."""

    value: int

    def update(self, mean_reward: float, lengths: LengthObservation | None = None) -> None:
        pass


@delta_controller("slope", "paper Eq. 4")
@dataclass
class SlopeDelta:
    """Paper Eq. 4: s_t = mean of (R_i - R_{i-1}) over the last ``window`` differences; Δ += inc if s_t > 0,
    else Δ -= dec; clipped to [low, high]. Δ holds until ``window`` differences exist.

    >>> ctl = SlopeDelta(value=2, low=0, high=4, window=2)
    >>> [ctl.update(r) or ctl.value for r in [0.0, 0.5, 1.0, 1.5, 2.0]]  # rising: +1 from the 3rd on, up to 4
    [2, 2, 3, 4, 4]
    >>> [ctl.update(r) or ctl.value for r in [2.0, 2.0, 2.0]]  # flat: once the window's trend is 0, Δ decays
    [4, 3, 2]
    """

    value: int
    low: int
    high: int
    window: int
    inc: int = 1
    dec: int = 1
    rewards: list[float] = field(default_factory=list)

    def update(self, mean_reward: float, lengths: LengthObservation | None = None) -> None:
        self.rewards.append(mean_reward)
        if len(self.rewards) <= self.window:
            return
        recent = self.rewards[-self.window - 1 :]
        slope = (recent[-1] - recent[0]) / self.window  # mean of consecutive differences telescopes
        step = self.inc if slope > 0 else -self.dec
        self.value = _clip(self.value + step, self.low, self.high)

    @classmethod
    def from_config(cls, config) -> SlopeDelta:
        return cls(**_bounds(config), inc=config.delta_inc, dec=config.delta_dec)


@delta_controller("alg1", "Alg. 1")
@dataclass
class Alg1Delta:
    """Paper Algorithm 1, literal: every ``window`` (W) steps once 2W rewards exist,
    d = mean(R[-W:]) - mean(R[-2W:-W]); change = max(1, floor(Δ/4)); Δ = clip(Δ - sign(d)·change).

    >>> ctl = Alg1Delta(value=8, low=0, high=16, window=2)
    >>> for reward in [0.0, 0.0, 1.0, 1.0]:  # d = 1 - 0 > 0 at the 4th reward: Δ falls by floor(8/4)
    ...     ctl.update(reward)
    >>> ctl.value
    6
    """

    value: int
    low: int
    high: int
    window: int
    rewards: list[float] = field(default_factory=list)

    def update(self, mean_reward: float, lengths: LengthObservation | None = None) -> None:
        self.rewards.append(mean_reward)
        w = self.window
        if len(self.rewards) < 2 * w or len(self.rewards) % w:
            return
        d = sum(self.rewards[-w:]) / w - sum(self.rewards[-2 * w : -w]) / w
        sign = (d > 0) - (d < 0)
        change = max(1, math.floor(self.value / 4))
        self.value = _clip(self.value - sign * change, self.low, self.high)

    @classmethod
    def from_config(cls, config) -> Alg1Delta:
        return cls(**_bounds(config))


@delta_controller("tail", "from the observed length distribution")
@dataclass
class TailDelta:
    """Δ from the observed distribution of response lengths, so that over-commit cuts the tail whatever the cap.

    Model: a step over-commits N = B+Δ fresh prompt groups of G samples each (G = ``group_size``, 1 without group
    sampling; B and Δ count groups) and ends when the B-th group completes; a group completes with its slowest
    sample. F is the distribution of one sample's length. **Assumed: the G samples of a group have independent
    lengths**, so a group completes by x with probability F_group(x) = F(x)^G (the maximum of G draws), and the
    step's end is F_group⁻¹(U₍B₎) = F⁻¹(U₍B₎^(1/G)) where U₍B₎ ~ Beta(B, N-B+1) is the B-th order statistic of N
    uniforms (exact, not an approximation). ``end(Δ)`` is that length at probability ``confidence``: the step ends
    by then with that probability. Samples of one prompt are positively correlated in practice (a hard prompt
    makes all of them long); then F_group lies between F^G and F and groups complete earlier than modelled: the
    model over-states every end(Δ), the more so for large G.

    F is estimated by Kaplan-Meier from the finished sample lengths of the last ``window`` steps and the current
    lengths of the unfinished (censored) samples, so the long sequences still running are not forgotten. Δ is the
    smallest value in [low, high] that achieves all but ``tolerance`` of the cut the largest allowed Δ would give:
    end(Δ) <= end(high) + tolerance · (end(low) - end(high)). No tail (equal lengths) gives Δ = low; a heavy
    tail or many capped sequences (an atom of F at the cap) give a large Δ. Until B·G sample lengths are known,
    and when no Δ would help by the estimate while sequences are still running (the estimate is then driven by
    the unknown lengths of the censored ones), Δ holds its value.
    """

    value: int
    low: int
    high: int
    window: int
    batch: int
    confidence: float = 0.9
    tolerance: float = 0.1
    group_size: int = 1
    finished: deque = field(default_factory=deque)

    def update(self, mean_reward: float, lengths: LengthObservation | None = None) -> None:
        if lengths is None:
            return
        self.finished.append(np.asarray(lengths.finished, dtype=np.int64))
        while len(self.finished) > self.window:
            self.finished.popleft()
        done = np.concatenate(list(self.finished))
        if len(done) < self.batch * self.group_size:  # sample lengths: B groups' worth
            return
        xs, cdf = kaplan_meier(done, np.asarray(lengths.censored, dtype=np.int64))
        ends = self.ends_tokens(xs, cdf, range(self.low, self.high + 1))
        if ends[-1] >= ends[0] and lengths.censored:
            return  # no Δ helps by this estimate, yet sequences still run (their lengths unknown): hold
        target = ends[-1] + self.tolerance * (ends[0] - ends[-1])
        self.value = self.low + next(i for i, end in enumerate(ends) if end <= target)

    @classmethod
    def from_config(cls, config) -> TailDelta:
        return cls(
            **_bounds(config),
            batch=config.batch,
            confidence=config.tail_confidence,
            tolerance=config.tail_tolerance,
            group_size=config.group_size,
        )

    def end_tokens(self, xs: np.ndarray, cdf: np.ndarray, delta: int) -> float:
        """Length by which B of B+Δ fresh groups complete with probability ``confidence``: F⁻¹(u^(1/G)), u the
        ``confidence`` quantile of Beta(B, B+Δ-B+1)."""
        return self.ends_tokens(xs, cdf, [delta])[0]

    def ends_tokens(self, xs: np.ndarray, cdf: np.ndarray, deltas) -> list[float]:
        """:meth:`end_tokens` of each Δ in ``deltas``, in one pass: ``cdf`` ascends, so the first length it reaches a
        level at is found by bisection (the levels depend on the Δs alone: computed once per controller's range)."""
        deltas = deltas if isinstance(deltas, range) else tuple(deltas)
        levels = _end_levels(self.batch, deltas, self.confidence, self.group_size)
        reached = np.searchsorted(cdf, levels, side="left")  # the first index whose cdf >= the level
        # beyond what was seen: the longest
        return xs[np.minimum(reached, len(xs) - 1)].astype(float, copy=False).tolist()


@functools.lru_cache(maxsize=256)
def _end_levels(batch: int, deltas: range | tuple[int, ...], confidence: float, group_size: int) -> np.ndarray:
    """The level F(end(Δ)) of each Δ in ``deltas`` (:class:`TailDelta`): U₍B₎^(1/G) at ``confidence``, U₍B₎ ~
    Beta(B, Δ+1), shape (len(deltas),), read-only (shared by every controller of these arguments)."""
    from scipy.special import betaincinv  # scipy.stats.beta.ppf; imported here: only this controller needs it

    us = betaincinv(batch, np.asarray(deltas, dtype=float) + 1, confidence)  # the Beta quantiles in one call
    levels = np.array([float(u) ** (1 / group_size) for u in us])  # Python's pow, as the scalar form took it
    levels.flags.writeable = False
    return levels


def kaplan_meier(finished: np.ndarray, censored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The length distribution from ``finished`` lengths and right-``censored`` ones (still running, longer than
    their current length): the distinct finished lengths ``xs`` (ascending) and F(xs) = P(length <= x).

    >>> xs, cdf = kaplan_meier(np.array([10, 10, 30, 30]), np.array([], dtype=np.int64))  # none censored
    >>> xs.tolist(), cdf.tolist()
    ([10, 30], [0.5, 1.0])
    >>> xs, cdf = kaplan_meier(np.array([10, 10]), np.array([20, 20]))  # two still running past 20: F(10) = 1/2
    >>> xs.tolist(), cdf.tolist()
    ([10], [0.5])
    """
    xs, deaths = np.unique(finished, return_counts=True)
    finished, censored = np.sort(finished), np.sort(censored)
    at_risk = (len(finished) - np.searchsorted(finished, xs)) + (len(censored) - np.searchsorted(censored, xs))
    survival = np.cumprod(1.0 - deaths / at_risk)
    return xs, 1.0 - survival


def make_delta_controller(config) -> DeltaController:
    """The Δ controller of a :class:`~oppo.core.config.ScheduleConfig`: Δ = 0 unless the policy over-commits;
    ``--delta N`` fixes it; a policy without an adaptive Δ (``april``, ``tailbatch``) over-provisions a fixed
    ``delta_max`` when Δ is auto; otherwise the registered ``--delta-controller``.

    >>> from oppo.core.config import ScheduleConfig
    >>> make_delta_controller(ScheduleConfig(policy="intra", delta="5")).value  # intra does not over-commit
    0
    >>> make_delta_controller(ScheduleConfig(policy="april", batch=16, delta_init=2, delta_max=6)).value
    6
    >>> type(make_delta_controller(ScheduleConfig(policy="oppo", delta_controller="tail"))).__name__
    'TailDelta'
    """
    if not config.overcommit:
        return FixedDelta(0)
    if config.fixed_delta is not None:
        return FixedDelta(config.fixed_delta)
    if not config.spec.adaptive_delta:  # fixed over-provisioning, no controller
        return FixedDelta(config.delta_max)
    return DELTA_CONTROLLER_CLASSES[config.delta_controller].from_config(config)
