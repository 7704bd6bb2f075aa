"""Streamed scores equal non-streamed scores.

Chunked prefill through a KV cache and one padded forward reduce in different orders, so their results may differ
in the last bits: tolerances are stated, relative to the scale of the scores (docs/executor.md): float64 <= 1e-12,
float32 <= 1e-5.
"""

import copy

import pytest
import torch

from oppo.exec.algos.ppo import kl_k3, sampled_logprobs
from oppo.exec.compute import update
from oppo.exec.compute.scoring import StreamingScorer, score_once
from oppo.exec.compute.timing import Recorder
from oppo.exec.config import ExecConfig, ModelConfig, PPOConfig, default_schedule
from oppo.exec.engines.hf import ChunkedDecoder
from oppo.exec.models.roles import load_roles
from oppo.exec.step.runner import Executor

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
    for (seq_id, tokens, p), got in zip(seqs, stream(StreamingScorer(actor, "logprob", True, PAD, 1.0), seqs, chunk)):
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


# -- the sampled distribution: sampler, old log-probs, reference log-probs and the trainer agree at any temperature --
T = 0.7


def test_logprob_scorer_scores_softmax_of_logits_over_temperature(tiny_models):
    """Streamed and one-shot log-probs at T are log softmax(logits / T) of a plain forward (float64, 1e-12)."""
    actor, _ = tiny_models[torch.float64]
    seqs = sequences(3)
    logits, _ = plain_forward(actor, seqs)
    streamed = stream(StreamingScorer(actor, "logprob", True, PAD, temperature=T), seqs, 7)
    once = score_once(actor, "logprob", seqs, PAD, temperature=T)
    for (seq_id, tokens, p), got, got_once in zip(seqs, streamed, once):
        want = torch.log_softmax(logits[seq_id, p - 1 : len(tokens) - 1] / T, -1)
        torch.testing.assert_close(sampled_logprobs(logits[seq_id, p - 1 : len(tokens) - 1], T), want)
        want = want.gather(1, torch.tensor(tokens[p:])[:, None]).squeeze(1)
        close(got, want, torch.float64)
        close(got_once, want, torch.float64)
    with pytest.raises(ValueError, match="temperature"):
        StreamingScorer(actor, "logprob", True, PAD)  # log-probs of which distribution: never a silent T = 1


def first_minibatch(monkeypatch, algo):
    """One float64 step at T = 0.7 from weights equal to the reference's; the arguments of the first minibatch's
    ``policy_loss`` and (GRPO, whose KL is a loss term) ``kl_estimate`` calls, taken before any update."""
    calls = {}
    for name in ("policy_loss", "kl_estimate"):
        original = getattr(update, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls.setdefault(_name, [a.detach().clone() for a in args if isinstance(a, torch.Tensor)])
            return _original(*args, **kwargs)

        monkeypatch.setattr(update, name, spy)
    config = ExecConfig(
        schedule=default_schedule(
            policy="sync", batch=4, max_new_tokens=16, algo=algo, group_size=2 if algo == "grpo" else 1
        ),
        model=ModelConfig(dtype="float64"),
        ppo=PPOConfig(temperature=T),
        steps=1,
        seed=3,
    )
    torch.manual_seed(config.seed)
    Executor.colocated(config, load_roles(config.model), Recorder()).step()
    return calls


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_ratio_is_one_and_k3_zero_before_any_update_at_a_temperature(monkeypatch, algo):
    """Old log-probs (the actor's scorer), reference log-probs (the reference's scorer) and the trainer's new
    log-probs are of one distribution, softmax(logits / T): before the first update the ratio is 1 and GRPO's k3
    is 0 against the reference (an identical copy), both to 1e-12 in float64 (scorer and trainer run different
    forwards, so the last bits may differ)."""
    calls = first_minibatch(monkeypatch, algo)
    logp, old_lp, _, mask = calls["policy_loss"]  # (logprobs, old_logprobs, advantages, mask)
    assert mask.sum() > 0
    ratio = torch.exp(logp - old_lp)[mask.bool()]
    assert float((ratio - 1).abs().max()) <= 1e-12
    if algo == "grpo":
        logp, ref_lp = calls["kl_estimate"]  # (logprobs, ref_logprobs)
        assert float((logp - ref_lp)[mask.bool()].abs().max()) <= 1e-12
        assert float(kl_k3(logp, ref_lp, mask)) <= 1e-12


def test_the_sampler_draws_from_the_distribution_the_scorers_score(tiny_models):
    """4,000 rows of one prompt sample their first token at T = 0.7 (an actor whose LM head is scaled by 20, so
    that its distribution is peaked and T matters): the counts follow exp(the log-probs the logprob scorer gives
    at T) within 4.5 standard deviations per token (largest seen: 2.3), and not those at T = 1 (largest: 15.8)."""
    actor = copy.deepcopy(tiny_models[torch.float64][0])
    with torch.no_grad():
        actor.lm_head.weight *= 20
    prompt, n, vocab = [5, 9, 14, 3, 22], 4_000, actor.config.vocab_size
    decoder = ChunkedDecoder(actor, [prompt] * n, [1] * n, eos_id=1, pad_id=PAD, row_keys=list(range(n)), temperature=T)
    decoder.decode(1)
    counts = torch.bincount(torch.tensor([t[0] for t in decoder.new_tokens]), minlength=vocab).double()
    seqs = [(v, prompt + [v], len(prompt)) for v in range(vocab)]  # every token as a one-token response
    for temperature, follows in ((T, True), (1.0, False)):
        expected = torch.cat(score_once(actor, "logprob", seqs, PAD, temperature=temperature)).exp() * n
        z = ((counts - expected).abs() / expected.sqrt())[expected > 5]
        assert (float(z.max()) < 4.5) == follows, (temperature, float(z.max()))
