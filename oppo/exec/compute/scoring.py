"""Scorers that prefill sequences chunk by chunk with their own KV cache (intra-step overlap).

A scorer feeds each sequence's tokens as they arrive and keeps the hidden states its output needs; the output
is computed at the end from those hidden states, so streamed and one-shot scoring run the same math:

- ``reward``: score head on the hidden state of each sequence's last real token (reward on EOS);
- ``value``: score head at every position from the last prompt token on: V(s) before each response token;
- ``logprob``: log-probs of the sampled distribution, softmax(logits / T) (:func:`oppo.exec.algos.ppo.sampled_logprobs`,
  T the sampling temperature), at the same positions, gathered at the next (response) token. The logits are the
  model's own (:func:`oppo.exec.models.roles.head_outputs`: the LM head and what the family applies after it, such as
  Gemma-2's soft-capping), as the sampler and the trainer get them from the model's forward.

Rows of a batch receive different numbers of tokens per chunk: the chunk is right-padded and the 2-D attention
mask (past + current) marks the holes, with explicit ``position_ids``; the model's own sequence-classification
forward is not used with a cache because it would score the last non-pad token of the current chunk only.
Frozen scorers (``keep_cache``) keep each unfinished sequence's KV cache across steps, compacted; the critic
changes every step and re-prefills.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from oppo.exec.algos.ppo import sampled_logprobs
from oppo.exec.models.roles import backbone, cache_arg, head_outputs

KINDS = ("reward", "value", "logprob")


@dataclass
class _Row:
    tokens: list[int]  # every token fed so far
    prompt_len: int
    hidden: list[torch.Tensor] = field(default_factory=list)  # (n, H) pieces from position prompt_len - 1 on
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer (heads, n, head_dim), between steps


class StreamingScorer:
    def __init__(self, model, kind: str, keep_cache: bool, pad_id: int, temperature: float | None = None) -> None:
        """``temperature``: the sampling temperature the ``logprob`` kind scores at (required there, unused by the
        others)."""
        if kind not in KINDS:
            raise ValueError(f"unknown scorer kind {kind!r}")
        if kind == "logprob" and temperature is None:
            raise ValueError("a logprob scorer needs the sampling temperature its log-probs are of")
        self.model, self.kind, self.keep_cache, self.pad_id = model, kind, keep_cache, pad_id
        self.temperature = temperature
        self.device = next(model.parameters()).device
        self.rows: dict[int, _Row] = {}
        self.batch: list[int] = []

    # -- a step -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def begin(self, seqs: list[tuple[int, list[int], int]]) -> int:
        """Start a step with ``(seq_id, context tokens, prompt length)`` rows; feeds what each row's cache lacks
        (everything for a new row, nothing for a carried one). Returns the tokens fed."""
        pending = []
        for seq_id, context, prompt_len in seqs:
            row = self.rows.get(seq_id) if self.keep_cache else None
            if row is None or row.tokens != context[: len(row.tokens)]:
                row = _Row(tokens=[], prompt_len=prompt_len)
            self.rows[seq_id] = row
            pending.append(context[len(row.tokens) :])
        self.batch = [s for s, _, _ in seqs]
        self._build_cache()
        return self._forward(pending)

    @torch.no_grad()
    def feed(self, new_tokens: dict[int, list[int]]) -> int:
        """Prefill a chunk: ``new_tokens`` per sequence of the batch (missing = none). Returns tokens fed."""
        return self._forward([new_tokens.get(s, []) for s in self.batch])

    @property
    def cached_tokens(self) -> int:
        """Tokens cached for the sequences of this step's batch."""
        return sum(len(self.rows[s].tokens) for s in self.batch)

    def end(self, carried: list[int]) -> None:
        """Close the step: keep the compacted KV cache of ``carried`` sequences, forget the others."""
        layers = self.cache.layers if self.batch else []
        for b, seq_id in enumerate(self.batch):
            if seq_id in carried and self.keep_cache:
                valid = self.mask[b].bool()
                self.rows[seq_id].kv = [(lay.keys[b][:, valid], lay.values[b][:, valid]) for lay in layers]
            elif seq_id not in carried:
                self.rows.pop(seq_id, None)
        if not self.keep_cache:
            self.rows = {}
        self.batch, self.cache, self.mask = [], None, None

    # -- outputs ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def outputs(self, seq_ids: list[int]) -> list[torch.Tensor]:
        """Per sequence: reward () scalar; value / logprob (response_len,)."""
        head = functools.partial(head_outputs, self.model)  # the head and what the model applies after it
        out = []
        for seq_id in seq_ids:
            row = self.rows[seq_id]
            hidden = torch.cat(row.hidden)  # positions prompt_len - 1 ... len - 1. Shape (R + 1, H)
            if self.kind == "reward":
                out.append(head(hidden[-1]).squeeze(-1).to(_out_dtype(hidden)))
            elif self.kind == "value":
                out.append(head(hidden[:-1]).squeeze(-1).to(_out_dtype(hidden)))
            else:
                logp = sampled_logprobs(head(hidden[:-1]).to(_out_dtype(hidden)), self.temperature)  # (R, V)
                targets = torch.tensor(row.tokens[row.prompt_len :], device=logp.device)
                out.append(logp.gather(1, targets[:, None]).squeeze(1))
        return out

    # -- internals --------------------------------------------------------------------------------------
    def _build_cache(self) -> None:
        """A batch cache from the rows' compacted caches, left-padded to the longest. Mask shape (B, T)."""
        lengths = [len(self.rows[s].tokens) if self.rows[s].kv else 0 for s in self.batch]
        width = max(lengths, default=0)
        self.mask = torch.zeros(len(self.batch), width, dtype=torch.long, device=self.device)
        if width == 0:
            self.cache = DynamicCache()
            return
        sample = next(self.rows[s].kv for s in self.batch if self.rows[s].kv)
        data = []
        for layer, (k0, v0) in enumerate(sample):
            keys = k0.new_zeros(len(self.batch), k0.shape[0], width, k0.shape[2])
            values = v0.new_zeros(len(self.batch), v0.shape[0], width, v0.shape[2])
            for b, seq_id in enumerate(self.batch):
                kv = self.rows[seq_id].kv
                if kv:
                    n = kv[layer][0].shape[1]
                    keys[b, :, width - n :], values[b, :, width - n :] = kv[layer]
            data.append((keys, values))
        for b, n in enumerate(lengths):
            self.mask[b, width - n :] = 1 if n else 0
            self.rows[self.batch[b]].kv = None  # now lives in the batch cache
        self.cache = DynamicCache(ddp_cache_data=data)

    def _forward(self, chunk: list[list[int]]) -> int:
        width = max((len(c) for c in chunk), default=0)
        if width == 0:
            return 0
        b = len(chunk)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        cmask = torch.zeros(b, width, dtype=torch.long)
        start = torch.tensor([len(self.rows[s].tokens) for s in self.batch])
        for i, tokens in enumerate(chunk):
            ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            cmask[i, : len(tokens)] = 1
        positions = start[:, None] + torch.arange(width)[None, :]  # (B, C)
        attn = torch.cat([self.mask, cmask.to(self.device)], dim=1)  # past + current. (B, T + C)
        body = backbone(self.model)
        out = body(
            input_ids=ids.to(self.device),
            attention_mask=attn,
            position_ids=positions.to(self.device),
            use_cache=True,
            **cache_arg(body, self.cache),
        )
        hidden = out.last_hidden_state  # (B, C, H)
        for i, (seq_id, tokens) in enumerate(zip(self.batch, chunk)):
            row = self.rows[seq_id]
            first = max(0, row.prompt_len - 1 - len(row.tokens))  # keep positions >= prompt_len - 1
            if first < len(tokens):
                row.hidden.append(hidden[i, first : len(tokens)])
            row.tokens.extend(tokens)
        self.mask = attn
        return int(cmask.sum())


def _out_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def score_once(
    model, kind: str, seqs: list[tuple[int, list[int], int]], pad_id: int, temperature: float | None = None
) -> list[torch.Tensor]:
    """Non-streamed scoring: the whole sequences in one pass (the ``sync`` path)."""
    scorer = StreamingScorer(model, kind, keep_cache=False, pad_id=pad_id, temperature=temperature)
    scorer.begin(seqs)
    outputs = scorer.outputs([s for s, _, _ in seqs])
    scorer.end([])
    return outputs


@dataclass(frozen=True)
class Done:
    """A result already computed (the local counterpart of a remote future)."""

    value: object

    def get(self):
        return self.value


ROLE_KINDS = {"reward": "reward", "reference": "logprob", "critic": "value"}  # what each scorer role computes


class LocalScorer:
    """A scorer role in this process, timed on a recorder. The same methods as a remote role
    (:class:`.RemoteScorer`, which wraps one of these in its worker), so the training loop
    does not know where a role runs."""

    @classmethod
    def for_role(
        cls, role: str, model, pad_id: int, recorder, device: str, temperature: float | None = None
    ) -> LocalScorer:
        """Frozen roles (reward, reference) keep carried sequences' caches across steps; the critic changes
        every step and re-prefills. ``temperature``: the sampling temperature (required for the reference: its
        log-probs are of the distribution the actor samples from)."""
        return cls(role, model, ROLE_KINDS[role], role != "critic", pad_id, recorder, device, temperature)

    def __init__(
        self,
        role: str,
        model,
        kind: str,
        keep_cache: bool,
        pad_id: int,
        recorder,
        device: str,
        temperature: float | None = None,
    ):
        self.role, self.model, self.kind, self.pad_id = role, model, kind, pad_id
        self.rec, self.device, self.temperature = recorder, device, temperature
        self.streamer = StreamingScorer(model, kind, keep_cache, pad_id, temperature)

    def begin(self, step: int, seqs) -> None:
        with self.rec.op(step, self.device, self.role, "prefill", batch=len(seqs)) as info:
            info["tokens"] = self.streamer.begin(seqs)
            info["context"] = self.streamer.cached_tokens - info["tokens"]

    def feed(self, step: int, new_tokens: dict[int, list[int]]) -> None:
        with self.rec.op(step, self.device, self.role, "prefill", batch=len(new_tokens)) as info:
            info["context"] = self.streamer.cached_tokens
            info["tokens"] = self.streamer.feed(new_tokens)

    def outputs(self, step: int, seq_ids: list[int]) -> Done:
        with self.rec.op(step, self.device, self.role, "score", batch=len(seq_ids)):
            return Done(self.streamer.outputs(seq_ids))

    def score(self, step: int, seqs) -> Done:
        tokens = sum(len(s[1]) for s in seqs)
        with self.rec.op(step, self.device, self.role, "score", batch=len(seqs), tokens=tokens):
            return Done(score_once(self.model, self.kind, seqs, self.pad_id, self.temperature))

    def end(self, carried: list[int]) -> None:
        self.streamer.end(carried)

    def collect(self) -> list:
        """Trace rows recorded elsewhere (none: local rows go straight to the recorder)."""
        return []
