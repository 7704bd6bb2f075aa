"""Δ controllers for inter-step over-commitment (OPPO section 3.2).

Each controller has a ``value`` (Δ: extra prompts in flight, an int within its bounds) and ``update(mean_reward)``
called once per closed step with that step's mean reward R_t.

The paper disagrees with itself: Eq. 4 raises Δ while the reward trend is positive, Algorithm 1 (lines 21-26)
lowers it (Δ -= sign(d)·change). ``SlopeDelta`` follows Eq. 4 and is the default; ``Alg1Delta`` is the literal
algorithm, kept so both can be compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def _clip(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


@dataclass
class FixedDelta:
    """Δ never changes."""

    value: int

    def update(self, mean_reward: float) -> None:
        pass


@dataclass
class SlopeDelta:
    """Paper Eq. 4: s_t = mean of (R_i - R_{i-1}) over the last ``window`` differences; Δ += inc if s_t > 0,
    else Δ -= dec; clipped to [low, high]. Δ holds until ``window`` differences exist."""

    value: int
    low: int
    high: int
    window: int
    inc: int = 1
    dec: int = 1
    rewards: list[float] = field(default_factory=list)

    def update(self, mean_reward: float) -> None:
        self.rewards.append(mean_reward)
        if len(self.rewards) <= self.window:
            return
        recent = self.rewards[-self.window - 1 :]
        slope = (recent[-1] - recent[0]) / self.window  # mean of consecutive differences telescopes
        step = self.inc if slope > 0 else -self.dec
        self.value = _clip(self.value + step, self.low, self.high)


@dataclass
class Alg1Delta:
    """Paper Algorithm 1, literal: every ``window`` (W) steps once 2W rewards exist,
    d = mean(R[-W:]) - mean(R[-2W:-W]); change = max(1, floor(Δ/4)); Δ = clip(Δ - sign(d)·change)."""

    value: int
    low: int
    high: int
    window: int
    rewards: list[float] = field(default_factory=list)

    def update(self, mean_reward: float) -> None:
        self.rewards.append(mean_reward)
        w = self.window
        if len(self.rewards) < 2 * w or len(self.rewards) % w:
            return
        d = sum(self.rewards[-w:]) / w - sum(self.rewards[-2 * w : -w]) / w
        sign = (d > 0) - (d < 0)
        change = max(1, math.floor(self.value / 4))
        self.value = _clip(self.value - sign * change, self.low, self.high)


def make_delta_controller(config) -> FixedDelta | SlopeDelta | Alg1Delta:
    """The Δ controller of a :class:`~oppo.config.ScheduleConfig` (Δ = 0 unless the policy over-commits)."""
    if not config.overcommit:
        return FixedDelta(0)
    if config.fixed_delta is not None:
        return FixedDelta(config.fixed_delta)
    bounds = dict(value=config.delta_init, low=config.delta_min, high=config.delta_max, window=config.delta_window)
    if config.delta_controller == "alg1":
        return Alg1Delta(**bounds)
    return SlopeDelta(**bounds, inc=config.delta_inc, dec=config.delta_dec)
