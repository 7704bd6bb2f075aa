"""The FIFO rollout buffer of OPPO Algorithm 1: capacity B+Δ, carries unfinished sequences across steps.

The unit of admission is the prompt group: G samples of one prompt (G = 1 for PPO, G > 1 for GRPO-style group
sampling). Capacity counts groups; a group stays in the buffer until it is trained whole."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter

_GROUP = attrgetter("group_id")


@dataclass(slots=True)
class SeqState:
    """One sequence while it lives in the buffer (mutable bookkeeping; decisions are returned frozen)."""

    seq_id: int
    admitted_step: int
    group_id: int  # the prompt group it samples (equal to seq_id when groups have one sample)
    generated_tokens: int = 0  # response tokens so far, over every step it was decoded in
    finished: bool = False
    finish_rank: tuple[int, int, int] | None = None  # (step, tokens into the step, id): finish order
    first_version: int | None = None  # policy version (steps of updates) that generated its first token

    def deferrals(self, step: int) -> int:
        """Steps this sequence has waited beyond the one it was admitted in."""
        return step - self.admitted_step


class RolloutBuffer:
    """Sequences in admission (FIFO) order. Ids come from a per-instance counter: 0, 1, 2, ...

    Invariants: every admitted id is either in the buffer or was returned by :meth:`remove` exactly once;
    ``generated_tokens <= max_new_tokens``.
    """

    def __init__(self, max_new_tokens: int, group_size: int = 1) -> None:
        self.max_new_tokens = max_new_tokens
        self.group_size = group_size
        self.seqs: dict[int, SeqState] = {}  # dicts keep insertion order: FIFO
        self.groups: dict[int, list[int]] = {}  # group id -> its sequence ids, FIFO
        self.admitted = 0  # sequences
        self.prompts = 0  # groups
        self._aborted: dict[int, SeqState] = {}  # taken out by abort, waiting to be readmitted

    def __len__(self) -> int:
        return len(self.seqs)

    def fill(self, capacity: int, step: int) -> list[int]:
        """Admit new prompt groups until ``capacity`` groups are held (never evicts); returns the new seq ids."""
        count = max(capacity - len(self.groups), 0)
        first, size = self.admitted, self.group_size
        new = list(range(first, first + count * size))
        group_ids = range(self.prompts, self.prompts + count)
        self.groups.update(zip(group_ids, map(list, zip(*[iter(new)] * size))))  # consecutive runs of size ids
        # seq i samples group prompts + (i - first) // size; built by map (hundreds per step)
        owners = [g for g in group_ids for _ in range(size)] if size > 1 else group_ids
        self.seqs.update(zip(new, map(SeqState, new, repeat(step), owners)))
        self.admitted += len(new)
        self.prompts += count
        return new

    def remaining_tokens(self, seq_id: int) -> int:
        """Response tokens this sequence may still generate (a resumed sequence does not get a fresh budget)."""
        return self.max_new_tokens - self.seqs[seq_id].generated_tokens

    def abort(self, ids: list[int]) -> list[SeqState]:
        """Take sequences out, their tokens discarded (to be generated again from the prompt: :meth:`readmit`)."""
        removed = self.remove(ids)
        for seq in removed:
            seq.generated_tokens, seq.finished, seq.finish_rank, seq.first_version = 0, False, None, None
        self._aborted.update((s.seq_id, s) for s in removed)
        return removed

    def readmit(self, ids: list[int]) -> list[int]:
        """Put aborted sequences back (one group, in order); they keep their ids and admission step."""
        for seq_id in ids:
            seq = self._aborted.pop(seq_id)
            self.seqs[seq_id] = seq
            self.groups.setdefault(seq.group_id, []).append(seq_id)
        return list(ids)

    def remove(self, ids: list[int]) -> list[SeqState]:
        """Remove sequences (whole groups: a group leaves with its last sequence)."""
        removed = list(map(self.seqs.pop, ids))
        if self.group_size == 1:  # a group of one leaves with its sequence (readmit keeps groups of one)
            for group in map(_GROUP, removed):
                del self.groups[group]
            return removed
        for seq in removed:
            members = self.groups[seq.group_id]
            members.remove(seq.seq_id)
            if not members:
                del self.groups[seq.group_id]
        return removed
