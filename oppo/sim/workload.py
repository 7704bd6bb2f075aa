"""What the simulated actor generates (response lengths) and how the reward responds (a progress model)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from oppo.lengths import LengthTrace
from oppo.records import TrainedSeq


@dataclass(frozen=True)
class LengthModel:
    """Response lengths: a lognormal long tail unless a trace is replayed.

    The default sigma gives p99/p50 = exp(2.326·sigma) ≈ 3.9, as in the AlpacaEval trace.
    """

    median_tokens: float = 290.0
    sigma: float = 0.585
    prompt_tokens: int = 64  # used when the trace has no prompt lengths
    drift_per_1k_steps: float = 0.0  # lengths scale by (1 + drift · step / 1000), e.g. -0.3: 30% shorter

    def __post_init__(self) -> None:
        if self.median_tokens <= 0 or self.sigma < 0 or self.prompt_tokens < 0:
            raise ValueError("length model needs median_tokens > 0, sigma >= 0, prompt_tokens >= 0")


class LengthSampler:
    """Draws (response, prompt) token counts per new sequence, deterministic given the generator."""

    def __init__(self, model: LengthModel, max_new_tokens: int, rng: np.random.Generator, trace=None) -> None:
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.rng = rng
        self.trace: LengthTrace | None = trace
        self.drawn = 0  # sequences drawn so far (position in an ordered trace)

    def sample(self, step: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        m = self.model
        if self.trace is not None:
            response, prompt = self.trace.sample(self.rng, n, start=self.drawn)
            response = response.astype(float)
        else:
            response, prompt = m.median_tokens * np.exp(m.sigma * self.rng.standard_normal(n)), None
        response = response * max(0.0, 1.0 + m.drift_per_1k_steps * step / 1000)
        # at least one token (the EOS); at most the cap
        response = np.clip(np.rint(response), 1, self.max_new_tokens).astype(np.int64)
        self.drawn += n
        if prompt is None:
            prompt = np.full(n, m.prompt_tokens, dtype=np.int64)
        return response, np.maximum(prompt, 1)


@dataclass(frozen=True)
class RewardCurve:
    """A model of reward progress, not a measurement:

    R = start + (final - start) · (1 - exp(-progress / tau_steps)) + Normal(0, noise),

    where progress counts trained steps' worth of samples: each finished trained sequence adds
    (1 - stale_cost · deferrals) / B (never below 0). T-PPO's partial segments add nothing until the sequence
    finishes. Defaults are fitted to the paper's 7B run (reward ~2.0 by step 150, ~4.1 by step 600).
    """

    start: float = 0.0
    final: float = 4.5
    tau_steps: float = 250.0
    noise: float = 0.05
    stale_cost: float = 0.1  # fraction of a sample's value lost per step it was deferred

    def __post_init__(self) -> None:
        if self.tau_steps <= 0 or self.noise < 0 or not 0 <= self.stale_cost <= 1:
            raise ValueError("reward curve needs tau_steps > 0, noise >= 0, 0 <= stale_cost <= 1")


class RewardProgress:
    def __init__(self, curve: RewardCurve, batch: int, rng: np.random.Generator) -> None:
        self.curve, self.batch, self.rng = curve, batch, rng
        self.progress = 0.0  # in steps' worth of fresh samples

    def step(self, trained: Sequence[TrainedSeq]) -> float:
        """Advance by this step's trained sequences; return the step's mean reward."""
        c = self.curve
        value = sum(max(0.0, 1.0 - c.stale_cost * t.deferrals) for t in trained if t.finished)
        self.progress += value / self.batch
        mean = c.start + (c.final - c.start) * (1.0 - math.exp(-self.progress / c.tau_steps))
        return float(mean + c.noise * self.rng.standard_normal())
