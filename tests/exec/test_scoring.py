"""Streamed scores equal non-streamed scores.

Chunked prefill through a KV cache and one padded forward reduce in different orders, so their results may differ
in the last bits: tolerances are stated, relative to the scale of the scores (docs/executor.md): float64 <= 1e-12,
float32 <= 1e-5.
"""

import copy

import pytest
import torch

from oppo.exec.scoring import StreamingScorer, score_once

PAD = 0


def sequences(seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for seq_id, (prompt_len, response_len) in enumerate([(3, 9), (5, 1), (4, 17), (2, 30), (6, 4)]):
        tokens = torch.randint(3, 64, (prompt_len + response_len,), generator=g).tolist()
        out.append((seq_id, tokens, prompt_len))
    return out


def stream(scorer, seqs, chunk):
    """Feed each response ``chunk`` tokens at a time, like the actor's rounds (rows end at different times)."""
    scorer.begin([(i, t[:p], p) for i, t, p in seqs])
    done = {i: p for i, _, p in seqs}
    while any(done[i] < len(t) for i, t, _ in seqs):
        new = {i: t[done[i] : done[i] + chunk] for i, t, _ in seqs if done[i] < len(t)}
        scorer.feed(new)
        done.update({i: done[i] + len(v) for i, v in new.items()})
    return scorer.outputs([i for i, _, _ in seqs])


def plain_forward(model, seqs):
    """The reference: one padded forward without any cache."""
    width = max(len(t) for _, t, _ in seqs)
    ids = torch.full((len(seqs), width), PAD)
    mask = torch.zeros_like(ids)
    for row, (_, t, _) in enumerate(seqs):
        ids[row, : len(t)], mask[row, : len(t)] = torch.tensor(t), 1
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits, mask


TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def close(got, expected, dtype):
    """Max abs difference within TOL relative to the larger of 1 and the largest magnitude."""
    assert got.dtype == expected.dtype == dtype
    scale = max(1.0, float(expected.abs().max()))
    assert float((got - expected).abs().max()) <= TOL[dtype] * scale


def test_fixtures_hold_the_dtype_their_key_names(tiny_models):
    for dtype, models in tiny_models.items():
        for model in models:
            assert {p.dtype for p in model.parameters()} == {dtype}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("chunk", [1, 7, 32])
def test_streamed_reward_equals_full(tiny_models, dtype, chunk):
    _, reward = tiny_models[dtype]
    seqs = sequences(0)
    streamed = torch.stack(stream(StreamingScorer(reward, "reward", True, PAD), seqs, chunk))
    once = torch.stack(score_once(reward, "reward", seqs, PAD))
    logits, _ = plain_forward(reward, seqs)  # the HF classifier picks the last non-pad token
    close(streamed, logits.squeeze(-1), dtype)
    close(streamed, once, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("chunk", [1, 7, 32])
def test_streamed_logprobs_and_values_equal_full(tiny_models, dtype, chunk):
    actor, reward = tiny_models[dtype]
    seqs = sequences(1)
    logits, _ = plain_forward(actor, seqs)
    logp = torch.log_softmax(logits, -1)
    for (seq_id, tokens, p), got in zip(seqs, stream(StreamingScorer(actor, "logprob", True, PAD), seqs, chunk)):
        expected = logp[seq_id, p - 1 : len(tokens) - 1].gather(1, torch.tensor(tokens[p:])[:, None]).squeeze(1)
        close(got, expected, dtype)
    values = stream(StreamingScorer(reward, "value", False, PAD), seqs, chunk)
    with torch.no_grad():
        hidden = reward.model(**dict(zip(("input_ids", "attention_mask"), _ids(seqs)))).last_hidden_state
        full_values = reward.score(hidden).squeeze(-1)
    for (seq_id, tokens, p), got in zip(seqs, values):
        close(got, full_values[seq_id, p - 1 : len(tokens) - 1], dtype)


def _ids(seqs):
    width = max(len(t) for _, t, _ in seqs)
    ids = torch.full((len(seqs), width), PAD)
    mask = torch.zeros_like(ids)
    for row, (_, t, _) in enumerate(seqs):
        ids[row, : len(t)], mask[row, : len(t)] = torch.tensor(t), 1
    return ids, mask


def test_frozen_scorer_keeps_cache_across_steps(tiny_models):
    _, reward = tiny_models[torch.float64]
    seqs = sequences(2)
    scorer = StreamingScorer(copy.deepcopy(reward), "reward", True, PAD)
    half = [(i, t[: p + (len(t) - p) // 2], p) for i, t, p in seqs]
    stream(scorer, half, 4)
    scorer.end(carried=[0, 2])  # 1, 3, 4 trained and gone
    fed = scorer.begin([(i, t[: len(h)], p) for (i, t, p), (_, h, _) in zip(seqs, half) if i in (0, 2)])
    assert fed == 0  # nothing re-prefilled for carried sequences
    rest = {i: t[len(h) :] for (i, t, _), (_, h, _) in zip(seqs, half) if i in (0, 2)}
    scorer.feed(rest)
    got = torch.stack(scorer.outputs([0, 2]))
    expected = torch.stack(score_once(reward, "reward", [seqs[0], seqs[2]], PAD))
    close(got, expected, torch.float64)
