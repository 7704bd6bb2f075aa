"""Batched sampling from the actor with a preallocated KV cache, a chunk of tokens at a time.

Rows are left-padded contexts (prompt + already generated prefix); a resumed sequence is re-prefilled here with
the current weights, since its old KV cache went stale when the weights changed. Every decode iteration samples
one token for every row, stopped rows included (their token is discarded), so the random stream does not depend
on how the step is cut into chunks: ``sync`` and ``intra`` sample identical tokens from the same seed.
"""

from __future__ import annotations

import torch
from transformers import StaticCache


def left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and mask. Shapes (B, T)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
    return ids.to(device), mask.to(device)


class ChunkedDecoder:
    """Decodes ``rows`` (token lists) until each stops: EOS, or its ``budgets`` of new tokens this step.

    ``forced``: per row, the response length at which EOS is forced (None = natural); before it, EOS is masked
    out. Used to replay traced lengths for benchmarking; it changes the sampling distribution.
    """

    @torch.no_grad()
    def __init__(self, actor, rows, budgets, eos_id, pad_id, generator, temperature=1.0, forced=None, done=None):
        self.actor, self.eos_id, self.pad_id = actor, eos_id, pad_id
        self.generator, self.temperature = generator, temperature
        device = next(actor.parameters()).device
        self.budgets = torch.tensor(budgets, device=device)
        self.forced = torch.tensor([-1 if f is None else f for f in (forced or [None] * len(rows))], device=device)
        self.done_before = torch.tensor(done or [0] * len(rows), device=device)  # response tokens so far
        ids, self.mask = left_pad(rows, pad_id, device)
        width = ids.shape[1]
        capacity = width + int(max(budgets, default=0)) + 1  # context + every token this step may decode
        self.cache = StaticCache(config=actor.config, max_cache_len=capacity)
        self.attn = torch.zeros(len(rows), capacity, dtype=torch.long, device=device)
        self.attn[:, :width] = self.mask
        self.width = width
        self.position = self.mask.sum(1)  # next position id per row. Shape (B,)
        positions = (self.mask.cumsum(1) - 1).clamp(min=0)
        out = actor(input_ids=ids, attention_mask=self.mask, position_ids=positions, past_key_values=self.cache)
        self.logits = out.logits[:, -1].float()  # (B, V)
        self.running = self.budgets > 0
        self.decoded = torch.zeros_like(self.budgets)  # tokens decoded this step per row
        self.iterations = 0
        self.new_tokens: list[list[int]] = [[] for _ in rows]

    @torch.no_grad()
    def decode(self, n: int) -> tuple[dict[int, int], list[list[int]]]:
        """Up to ``n`` iterations. Returns ({row: tokens it decoded this round, EOS included} for rows that hit
        EOS, and the new tokens of every row this round)."""
        finished: dict[int, int] = {}
        chunk: list[list[int]] = [[] for _ in self.new_tokens]
        for _ in range(n):
            if not self.running.any():
                break
            token = self._sample()
            live = self.running.clone()
            token = torch.where(live, token, torch.full_like(token, self.pad_id))
            self.decoded += live.long()
            tokens = token.tolist()  # one device->host copy per iteration
            for row in live.nonzero().flatten().tolist():
                t = tokens[row]
                self.new_tokens[row].append(t)
                chunk[row].append(t)
                if t == self.eos_id:
                    finished[row] = len(chunk[row])
            self.running &= (token != self.eos_id) & (self.decoded < self.budgets)
            self._advance(token, live)
        return finished, chunk

    def _sample(self) -> torch.Tensor:
        logits = self.logits / self.temperature
        total = self.done_before + self.decoded  # response tokens before this one
        forced = self.forced >= 0
        logits[forced & (total + 1 < self.forced), self.eos_id] = float("-inf")
        probs = torch.softmax(logits, dim=-1)
        token = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
        return torch.where(forced & (total + 1 >= self.forced), torch.full_like(token, self.eos_id), token)

    def _advance(self, token: torch.Tensor, live: torch.Tensor) -> None:
        slot = self.width + self.iterations  # the static cache writes one slot per forward
        self.iterations += 1
        self.attn[:, slot] = live.long()
        out = self.actor(
            input_ids=token[:, None],
            attention_mask=self.attn[:, : slot + 1],
            position_ids=self.position[:, None],
            past_key_values=self.cache,
        )
        self.position += live.long()
        self.logits = out.logits[:, -1].float()
