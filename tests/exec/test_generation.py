"""Sampling keyed by sequence: tokens do not depend on the batch, and Gumbel-max samples follow the softmax."""

import copy

import torch

from oppo.exec.generation import ChunkedDecoder, gumbel_noise, hash32


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
