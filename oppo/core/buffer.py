"""The FIFO rollout buffer of OPPO Algorithm 1: capacity B+Δ, carries unfinished sequences across steps.

The unit of admission is the prompt group: G samples of one prompt (G = 1 for PPO, G > 1 for GRPO-style group
sampling). Capacity counts groups; a group stays in the buffer until it is trained whole.

Each sequence's bookkeeping is kept by column, a list per field indexed by the sequence id (ids are dense: 0, 1,
2, ... in admission order): a step reads a field of hundreds of sequences at once, in C (``map`` over a list's
``__getitem__``), and admits hundreds by extending the lists; a simulated plan admits millions.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from itertools import repeat
from typing import NamedTuple


class SeqState(NamedTuple):
    """One sequence as the buffer holds it (a copy of its columns: read-only)."""

    seq_id: int
    admitted_step: int
    group_id: int  # the prompt group it samples (equal to seq_id when groups have one sample)
    generated_tokens: int  # response tokens so far, over every step it was decoded in
    finished: bool
    finish_rank: tuple[int, int, int] | None  # (step, tokens into the step, id): finish order
    first_version: int | None  # policy version (steps of updates) that generated its first token


class RolloutBuffer:
    """Sequences in admission (FIFO) order. Ids come from a per-instance counter: 0, 1, 2, ...

    Invariants: every admitted id is held, or was removed exactly once (trained), or is aborted and waiting to be
    readmitted; ``generated[i] <= max_new_tokens``.
    """

    def __init__(self, max_new_tokens: int, group_size: int = 1) -> None:
        self.max_new_tokens = max_new_tokens
        self.group_size = group_size
        self.ids: dict[int, None] = {}  # the sequences held, in admission order (dicts keep insertion order)
        self.groups: dict[int, list[int]] = {}  # group id -> its sequence ids held, FIFO
        self.admitted = 0  # sequences
        self.prompts = 0  # groups
        self._aborted: set[int] = set()  # taken out by abort, waiting to be readmitted
        # per-sequence columns, indexed by id, for every sequence ever admitted
        self.admitted_step: list[int] = []
        self.group_id: list[int] = []
        self.generated: list[int] = []  # response tokens so far
        self.finished: list[bool] = []
        self.finish_rank: list[tuple[int, int, int] | None] = []  # (step, tokens into the step, id)
        self.first_version: list[int | None] = []  # policy version that generated its first token

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def seqs(self) -> dict[int, SeqState]:
        """The sequences held, in admission order, each as a :class:`SeqState` (built on each call: for reading)."""
        return {i: self.seq(i) for i in self.ids}

    def seq(self, seq_id: int) -> SeqState:
        """One sequence's bookkeeping (held or not)."""
        columns = (self.admitted_step, self.group_id, self.generated, self.finished, self.finish_rank)
        return SeqState(seq_id, *(c[seq_id] for c in columns), self.first_version[seq_id])

    def fill(self, capacity: int, step: int) -> list[int]:
        """Admit new prompt groups until ``capacity`` groups are held (never evicts); returns the new seq ids."""
        if self.admitted_step and step < self.admitted_step[-1]:  # admitted_after relies on it
            raise ValueError(f"admission at step {step} after one at step {self.admitted_step[-1]}")
        count = max(capacity - len(self.groups), 0)
        first, size = self.admitted, self.group_size
        new = list(range(first, first + count * size))
        group_ids = range(self.prompts, self.prompts + count)
        self.groups.update(zip(group_ids, map(list, zip(*[iter(new)] * size))))  # consecutive runs of size ids
        self.ids.update(dict.fromkeys(new))
        # seq i samples group prompts + (i - first) // size
        self.group_id += [g for g in group_ids for _ in range(size)] if size > 1 else group_ids
        n = len(new)
        self.admitted_step += repeat(step, n)
        self.generated += repeat(0, n)
        self.finished += repeat(False, n)
        self.finish_rank += repeat(None, n)
        self.first_version += repeat(None, n)
        self.admitted += n
        self.prompts += count
        return new

    def admitted_after(self, step: int) -> int:
        """The first id admitted after ``step``: every lower id was admitted at or before it (admission steps never
        decrease with the id; :meth:`readmit` keeps a sequence's id and step)."""
        return bisect_right(self.admitted_step, step)

    def remaining_tokens(self, seq_id: int) -> int:
        """Response tokens this sequence may still generate (a resumed sequence does not get a fresh budget)."""
        return self.max_new_tokens - self.generated[seq_id]

    def abort(self, ids: list[int]) -> None:
        """Take sequences out, their tokens discarded (to be generated again from the prompt: :meth:`readmit`)."""
        ids = list(ids)  # a copy: ``ids`` may be a group's own member list, emptied by remove
        self.remove(ids)
        for seq_id in ids:
            self.generated[seq_id], self.finished[seq_id], self.first_version[seq_id] = 0, False, None
        self._aborted.update(ids)

    def readmit(self, ids: list[int]) -> list[int]:
        """Put aborted sequences back (one group, in order); they keep their ids and admission step."""
        for seq_id in ids:
            self._aborted.remove(seq_id)  # KeyError for one that was not aborted
            self.ids[seq_id] = None
            self.groups.setdefault(self.group_id[seq_id], []).append(seq_id)
        return list(ids)

    def remove(self, ids: list[int]) -> None:
        """Remove sequences (whole groups: a group leaves with its last sequence). Their finish ranks are dropped:
        only held sequences' are read, and a long run admits millions."""
        ids = list(ids)  # a copy: ``ids`` may be a group's own member list, emptied below
        deque(map(self.ids.pop, ids), maxlen=0)  # KeyError for one not held (deleted in C)
        deque(map(self.finish_rank.__setitem__, ids, repeat(None)), maxlen=0)
        groups = map(self.group_id.__getitem__, ids)
        if self.group_size == 1:  # a group of one leaves with its sequence (readmit keeps groups of one)
            deque(map(self.groups.__delitem__, groups), maxlen=0)
            return
        for seq_id, group in zip(ids, groups):
            members = self.groups[group]
            members.remove(seq_id)
            if not members:
                del self.groups[group]
