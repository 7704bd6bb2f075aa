"""The FIFO rollout buffer of OPPO Algorithm 1: capacity B+Δ, carries unfinished sequences across steps."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SeqState:
    """One sequence while it lives in the buffer (mutable bookkeeping; decisions are returned frozen)."""

    seq_id: int
    admitted_step: int
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

    def __init__(self, max_new_tokens: int, prompt_limit: int | None = None) -> None:
        self.max_new_tokens = max_new_tokens
        self.prompt_limit = prompt_limit  # total prompts available; None = endless dataset
        self.seqs: dict[int, SeqState] = {}  # dicts keep insertion order: FIFO
        self.admitted = 0

    def __len__(self) -> int:
        return len(self.seqs)

    def fill(self, capacity: int, step: int) -> list[int]:
        """Admit new prompts until ``capacity`` sequences are held (never evicts); returns the new ids."""
        new = []
        while len(self.seqs) < capacity and (self.prompt_limit is None or self.admitted < self.prompt_limit):
            seq = SeqState(seq_id=self.admitted, admitted_step=step)
            self.seqs[seq.seq_id] = seq
            new.append(seq.seq_id)
            self.admitted += 1
        return new

    def remaining_tokens(self, seq_id: int) -> int:
        """Response tokens this sequence may still generate (a resumed sequence does not get a fresh budget)."""
        return self.max_new_tokens - self.seqs[seq_id].generated_tokens

    def remove(self, ids: list[int]) -> list[SeqState]:
        return [self.seqs.pop(i) for i in ids]
