"""Sampling keyed by sequence: tokens do not depend on the batch, and Gumbel-max samples follow the softmax."""

import copy

import torch

from oppo.exec.engines.hf import ChunkedDecoder, gumbel_noise, hash32, nucleus


def test_hash_stays_in_32_bits_and_spreads():
    x = hash32(torch.arange(100_000, dtype=torch.int64))
    assert int(x.min()) >= 0 and int(x.max()) < 2**32
    assert len(torch.unique(x)) > 99_990  # (almost) no collisions on consecutive inputs


def test_gumbel_max_samples_follow_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5], dtype=torch.float64)
    n = 40_000
    noise = gumbel_noise(torch.arange(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64), len(logits))
    counts = torch.bincount((logits + noise).argmax(-1), minlength=len(logits)).double()
    expected = torch.softmax(logits, 0) * n
    assert float(((counts - expected).abs() / expected.sqrt()).max()) < 4.5  # within 4.5 standard deviations


def test_tokens_do_not_depend_on_the_batch(tiny_models):
    actor, _ = tiny_models[torch.float64]
    actor = copy.deepcopy(actor)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 64, (n,), generator=g).tolist() for n in (5, 8, 3, 6)]
    keys = [11, 22, 33, 44]

    def decode(order):
        decoder = ChunkedDecoder(
            actor, [rows[i] for i in order], [12] * len(order), eos_id=1, pad_id=0, row_keys=[keys[i] for i in order]
        )
        decoder.decode(12)
        return {i: decoder.new_tokens[r] for r, i in enumerate(order)}

    alone = {i: decode([i])[i] for i in range(4)}
    assert decode([0, 1, 2, 3]) == alone  # one batch, one row per batch: the same tokens
    assert decode([3, 1]) == {3: alone[3], 1: alone[1]}  # another composition and order


def test_top_k_and_top_p_sample_the_renormalised_cut_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5], dtype=torch.float64)  # softmax .563 .207 .076 .028 .126
    logp = torch.log_softmax(logits, 0)
    probs = logp.exp()
    n = 40_000
    noise = gumbel_noise(torch.arange(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64), len(logits))
    for top_k, top_p, kept in ((2, 1.0, [0, 1]), (0, 0.7, [0, 1]), (0, 0.8, [0, 1, 4]), (3, 0.5, [0]), (0, 1.0, None)):
        cut = nucleus(logp.expand(n, -1), top_k, top_p)
        kept = kept if kept is not None else list(range(len(logits)))
        assert torch.isfinite(cut[0]).nonzero().flatten().tolist() == sorted(kept)
        counts = torch.bincount((cut + noise).argmax(-1), minlength=len(logits)).double()
        expected = torch.zeros_like(probs)
        expected[kept] = probs[kept] / probs[kept].sum() * n
        assert counts[expected == 0].sum() == 0
        seen = expected > 0
        assert float(((counts - expected)[seen].abs() / expected[seen].sqrt()).max()) < 4.5


def test_top_k_keeps_the_tokens_tied_with_the_kth():
    logp = torch.log_softmax(torch.tensor([[1.0, 2.0, 1.0, 0.0, 1.0]], dtype=torch.float64), -1)
    assert torch.isfinite(nucleus(logp, 2, 1.0)).flatten().tolist() == [True, True, True, False, True]


def test_top_k_1_decodes_the_greedy_tokens_and_keeps_the_full_softmax_log_probs(tiny_models):
    actor, _ = tiny_models[torch.float64]
    rows = [[5, 9, 4], [7, 3, 3, 8, 6]]

    def decode(**kwargs):
        decoder = ChunkedDecoder(actor, rows, [10, 10], eos_id=1, pad_id=0, row_keys=[1, 2], **kwargs)
        return decoder.decode(10)[1:]

    greedy_tokens, greedy_logps = decode(greedy=True)
    top1_tokens, top1_logps = decode(top_k=1)
    assert top1_tokens == greedy_tokens
    assert top1_logps == greedy_logps  # log pi of the token under the whole softmax, not 0 under the cut one
    assert all(lp < 0 for row in top1_logps for lp in row)
