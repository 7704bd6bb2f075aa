"""Chunk-size policies for intra-step streaming (OPPO section 3.1).

A policy answers ``chunk_for(step)`` (tokens per streamed chunk) and learns from ``observe(step, chunk, step_s)``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass
class FixedChunk:
    """Always the same chunk size (tokens > 0)."""

    tokens: int

    def chunk_for(self, step: int) -> int:
        return self.tokens

    def observe(self, step: int, chunk: int, step_s: float) -> None:
        pass


class ExploringChunk:
    """Periodic exploration (paper: every 50 steps try 128, 256, 512, keep the fastest for the window).

    Steps ``[k*period, k*period + len(candidates)*trials)`` try each candidate in turn for ``trials`` steps; the
    remaining steps of the window use the candidate with the lowest mean observed step time of that exploration
    (ties go to the earlier candidate). Before the first exploration finishes, the first candidate is used.

    >>> policy = ExploringChunk((32, 64, 128), period_steps=10)
    >>> for step, seconds in zip(range(3), [3.0, 1.0, 2.0]):  # steps 0-2 try each candidate once
    ...     policy.observe(step, policy.chunk_for(step), seconds)
    >>> [policy.chunk_for(step) for step in range(12)]  # the fastest (64) until step 10 explores again
    [32, 64, 128, 64, 64, 64, 64, 64, 64, 64, 32, 64]
    """

    def __init__(self, candidates: tuple[int, ...], period_steps: int, trials: int = 1) -> None:
        if not candidates or min(candidates) <= 0 or period_steps <= 0 or trials <= 0:
            raise ValueError("exploration needs positive candidates, period and trials")
        self.candidates = tuple(candidates)
        self.period_steps = max(period_steps, len(candidates) * trials)
        self.trials = trials
        self.best = self.candidates[0]
        self._times: dict[int, list[float]] = defaultdict(list)

    def _exploring_index(self, step: int) -> int | None:
        offset = step % self.period_steps
        index = offset // self.trials
        return index if index < len(self.candidates) else None

    def chunk_for(self, step: int) -> int:
        index = self._exploring_index(step)
        return self.best if index is None else self.candidates[index]

    def observe(self, step: int, chunk: int, step_s: float) -> None:
        index = self._exploring_index(step)
        if index is None:
            return
        if step % self.period_steps == 0:
            self._times.clear()  # a new exploration window starts
        self._times[chunk].append(step_s)
        if index == len(self.candidates) - 1 and len(self._times[chunk]) == self.trials:
            means = {c: sum(self._times[c]) / len(self._times[c]) for c in self.candidates if self._times[c]}
            self.best = min(self.candidates, key=lambda c: means.get(c, float("inf")))


def make_chunk_policy(config) -> FixedChunk | ExploringChunk:
    """The chunk policy of a :class:`~oppo.core.config.ScheduleConfig`: a fixed ``--chunk``, else exploration.

    >>> from oppo.core.config import ScheduleConfig
    >>> make_chunk_policy(ScheduleConfig(chunk="64"))
    FixedChunk(tokens=64)
    >>> explore = make_chunk_policy(ScheduleConfig(chunk="auto", chunk_candidates=(128, 256), explore_period_steps=4))
    >>> [explore.chunk_for(step) for step in (0, 1)]  # a window opens trying each candidate
    [128, 256]
    >>> explore.observe(0, 128, step_s=2.0)
    >>> explore.observe(1, 256, step_s=1.0)
    >>> [explore.chunk_for(step) for step in (2, 3, 4)]  # the fastest for the rest of the window, then again
    [256, 256, 128]
    """
    if config.fixed_chunk is not None:
        return FixedChunk(config.fixed_chunk)
    return ExploringChunk(config.chunk_candidates, config.explore_period_steps, config.explore_trials)
