"""Continuous admission for asynchronous RL: which prompt group may start generating, and which B groups a step
trains, with every trained sample's lag bounded by K (AReaL's ``max_head_offpolicyness``).

A rollout engine holds up to ``concurrency`` groups and admits a new one as soon as one finishes (continuous
batching, AReaL / PipelineRL), instead of generating a step's B groups as one batch. A group admitted while the
trainer's version is v (v updates applied) generates its first token with version v and must be trained by step
v + K at the latest: its *deadline*. The trainer's step u takes B finished groups, the oldest first-token
versions first (earliest deadline first), then in the order they finished.

Why the bound holds whatever the lengths: admission keeps, for the newest deadline d = v + K, the groups not yet
taken at most B x (d - u + 1), u the next step to take (the steps u..d can train them). A step takes its B only
when what it leaves behind still satisfies that inequality for every deadline (:meth:`GroupQueue.ready`),
waiting for groups still generating otherwise; admissions only add the newest deadline. So the inequality holds
at every step for every deadline, and with d = u it says no group is ever late.

Pure bookkeeping: the clock is the backend's; ids are the backend's group ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GroupQueue:
    """Groups in flight and finished, the trainer's version and the steps taken. ``queue_groups`` (0: no bound):
    groups in flight, finished or being trained at most, as the executor's ``--queue-groups``; ``concurrency``
    (0: no bound): groups generating at once."""

    batch: int
    staleness: int
    queue_groups: int = 0
    concurrency: int = 0
    version: int = 0  # updates applied (and published)
    taken: int = 0  # steps whose groups the trainer has taken: the next step to take is ``taken``
    in_flight: dict[int, int] = field(default_factory=dict)  # group -> version of its first token
    finished: dict[int, int] = field(default_factory=dict)  # the same, in the order the groups finished
    training: int = 0  # groups taken by the step being trained

    def __post_init__(self) -> None:
        if self.batch < 1 or self.staleness < 0 or self.concurrency < 0:
            raise ValueError("a group queue needs batch >= 1, staleness >= 0 and concurrency >= 0")
        if self.queue_groups and self.queue_groups < self.batch:
            raise ValueError(f"queue_groups {self.queue_groups} cannot hold one step's {self.batch} groups")

    @property
    def untaken(self) -> int:
        return len(self.in_flight) + len(self.finished)

    def can_admit(self) -> bool:
        """Whether one more group may start now without breaking the bound, the queue or the concurrency."""
        steps_left = self.version + self.staleness - self.taken + 1  # steps that may still train it: taken..v+K
        if self.untaken + 1 > steps_left * self.batch:
            return False
        if self.queue_groups and self.untaken + self.training + 1 > self.queue_groups:
            return False
        return not self.concurrency or len(self.in_flight) < self.concurrency

    def admit(self, group: int) -> int:
        """Start ``group`` with the current version; returns that version."""
        if not self.can_admit():
            raise RuntimeError(f"group {group} admitted beyond the bound")
        self.in_flight[group] = self.version
        return self.version

    def finish(self, group: int) -> None:
        self.finished[group] = self.in_flight.pop(group)

    def _candidate(self) -> list[int]:
        """The B finished groups a step would take: oldest first-token version first, then finish order."""
        order = sorted(self.finished, key=self.finished.__getitem__)  # stable: finish order within a version
        return order[: self.batch]

    def ready(self) -> bool:
        """Whether the next step can take its B groups now: B finished, and what it leaves behind can still be
        trained in time (for every deadline d from this step on, at most B x (d - next step + 1) groups left
        with a deadline <= d; the due ones still generating make it wait)."""
        if len(self.finished) < self.batch:
            return False
        chosen = set(self._candidate())
        left = [v + self.staleness for g, v in (*self.in_flight.items(), *self.finished.items()) if g not in chosen]
        following = self.taken + 1  # the step after this one
        for d in range(self.taken, self.version + self.staleness + 1):
            if sum(deadline <= d for deadline in left) > self.batch * (d - following + 1):
                return False
        return True

    def take(self) -> list[tuple[int, int]]:
        """The next step's groups with their first-token versions (see :meth:`ready`)."""
        if not self.ready():
            raise RuntimeError(f"step {self.taken} is not ready")
        chosen = [(g, self.finished.pop(g)) for g in self._candidate()]
        self.taken += 1
        self.training = len(chosen)
        return chosen

    def publish(self) -> None:
        """The step taken last is trained: one more version."""
        self.version += 1
        self.training = 0
