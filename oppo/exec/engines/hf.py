"""Batched sampling from the actor with a preallocated KV cache, a chunk of tokens at a time.

Rows are left-padded contexts (prompt + already generated prefix); a resumed sequence is re-prefilled here with
the current weights, since its old KV cache went stale when the weights changed.

Sampling draws each token from noise keyed by (row key, response position, vocabulary index), a counter-based
hash rather than one random stream for the batch (Gumbel-max: argmax of logits / T + Gumbel noise is a sample of
softmax(logits / T)). So the tokens of a sequence do not depend on how sequences are batched, chunked, carried
over or dealt to data-parallel ranks: ``sync``, ``intra`` and ``inter`` sample the same tokens for a sequence
whose logits are the same.
"""

from __future__ import annotations

import torch
from transformers import StaticCache

from oppo.exec.algos.ppo import sampled_logprobs
from oppo.exec.models.roles import cache_arg

MASK32 = 0xFFFFFFFF


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix (values in [0, 2^32) held in int64: the products stay below 2^63)."""
    x = x & MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & MASK32
    return (x >> 16) ^ x


def gumbel_noise(row_keys: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise of shape (B, V), a pure function of each row's key and response position. float64."""
    index = torch.arange(vocab, device=row_keys.device, dtype=torch.int64)
    cell = hash32(hash32(row_keys ^ hash32(positions + 0x9E3779B9))[:, None] ^ (index * 0x85EBCA6B)[None, :])
    uniform = (cell.double() + 0.5) / 2.0**32  # in (0, 1)
    return -torch.log(-torch.log(uniform))


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
    out. Used to replay traced lengths for benchmarking; it changes the sampling distribution. ``greedy``: the most
    likely token instead of a sample (held-out evaluation). ``top_k`` / ``top_p``: sample among the k most likely
    tokens / the smallest set of most likely tokens whose probability reaches p (0 and 1: no such cut). The
    behaviour log-probs stay those of the whole softmax(logits / T), the distribution the scorers and the trainer
    compute, as verl's trainer recomputes them (and vLLM returns its raw ones) whatever the rollout's top-p.
    """

    @torch.no_grad()
    def __init__(
        self,
        actor,
        rows,
        budgets,
        eos_id,
        pad_id,
        row_keys,
        temperature=1.0,
        forced=None,
        done=None,
        greedy=False,
        top_k=0,
        top_p=1.0,
    ):
        """``row_keys``: one 32-bit key per row (derived from the run's seed and the sequence's id)."""
        self.actor, self.eos_id, self.pad_id = actor, eos_id, pad_id
        self.temperature, self.greedy, self.top_k, self.top_p = temperature, greedy, top_k, top_p
        device = next(actor.parameters()).device
        self.row_keys = torch.tensor(row_keys, dtype=torch.int64, device=device) & MASK32
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
        out = actor(input_ids=ids, attention_mask=self.mask, position_ids=positions, **cache_arg(actor, self.cache))
        self.logits = _at_least_float32(out.logits[:, -1])  # (B, V)
        self.running = self.budgets > 0
        self.decoded = torch.zeros_like(self.budgets)  # tokens decoded this step per row
        self.iterations = 0
        self.new_tokens: list[list[int]] = [[] for _ in rows]

    @torch.no_grad()
    def decode(self, n: int) -> tuple[dict[int, int], list[list[int]], list[list[float]]]:
        """Up to ``n`` iterations. Returns ({row: tokens it decoded this round, EOS included} for rows that hit
        EOS, the new tokens of every row this round, and their behaviour log-probs: log pi(token) under the
        weights that sampled it, the policy's softmax(logits / T) before any forced-length masking)."""
        finished: dict[int, int] = {}
        chunk: list[list[int]] = [[] for _ in self.new_tokens]
        logprobs: list[list[float]] = [[] for _ in self.new_tokens]
        for _ in range(n):
            if not self.running.any():
                break
            token, logp = self._sample()
            live = self.running.clone()
            token = torch.where(live, token, torch.full_like(token, self.pad_id))
            self.decoded += live.long()
            tokens, logps = token.tolist(), logp.tolist()  # one device->host copy each per iteration
            for row in live.nonzero().flatten().tolist():
                t = tokens[row]
                self.new_tokens[row].append(t)
                chunk[row].append(t)
                logprobs[row].append(logps[row])
                if t == self.eos_id:
                    finished[row] = len(chunk[row])
            self.running &= (token != self.eos_id) & (self.decoded < self.budgets)
            self._advance(token, live)
        return finished, chunk, logprobs

    def _sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next token of every row (B,) and its log-prob under the policy (B,)."""
        policy = sampled_logprobs(self.logits.double(), self.temperature)  # (B, V) what the scorers score
        total = self.done_before + self.decoded  # response tokens before this one
        forced = self.forced >= 0
        logp = policy.clone() if forced.any() else policy
        logp[forced & (total + 1 < self.forced), self.eos_id] = float("-inf")
        logp = nucleus(logp, self.top_k, self.top_p)
        if self.greedy:
            token = logp.argmax(dim=-1)
        else:
            noise = gumbel_noise(self.row_keys, total, logp.shape[-1]).to(logp.device)
            token = (logp + noise).argmax(dim=-1)  # a sample of softmax(logits / T): Gumbel-max
        token = torch.where(forced & (total + 1 >= self.forced), torch.full_like(token, self.eos_id), token)
        return token, policy.gather(1, token[:, None]).squeeze(1)

    def _advance(self, token: torch.Tensor, live: torch.Tensor) -> None:
        slot = self.width + self.iterations  # the static cache writes one slot per forward
        self.iterations += 1
        self.attn[:, slot] = live.long()
        out = self.actor(
            input_ids=token[:, None],
            attention_mask=self.attn[:, : slot + 1],
            position_ids=self.position[:, None],
            **cache_arg(self.actor, self.cache),
        )
        self.position += live.long()
        self.logits = _at_least_float32(out.logits[:, -1])


def nucleus(logp: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``logp`` (B, V) with every token outside each row's top-k, then outside the top-p of what is left, set at
    -inf, as HF's warpers cut in that order: top-k keeps every token tied with the k-th, top-p the smallest set of
    most likely tokens whose renormalised mass reaches p (the most likely token always stays). Sampling from it by
    Gumbel-max draws from the renormalised cut distribution."""
    if 0 < top_k < logp.shape[-1]:
        kth = logp.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = logp.sort(dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # the mass before a token already reaches p
        logp = logp.scatter(1, order, ordered.masked_fill(drop, float("-inf")))
    return logp


def _at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits up to float32 for sampling; a float64 model keeps float64, so the behaviour log-probs
    of its samples equal the trainer's recomputed ones to float64 rounding."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))
