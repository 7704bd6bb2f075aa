"""The options users of verl and TRL expect, each against its formula written as a loop over tokens (float64):
dual clip (verl ``clip_ratio_c``), clip-higher (``clip_ratio_low/high``, TRL ``epsilon_high``), the KL estimators
and their clamp (``kl_loss_type``), the loss aggregations (``loss_agg_mode``), the entropy bonus and Dr. GRPO's
unnormalised group advantages; then a run with each of them on."""

import csv
import math
import subprocess
import sys

import pytest
import torch

from oppo.exec.ppo import Aggregate, entropy, group_advantages, kl_estimate, policy_loss
from tests.exec.test_ppo import random_batch


def tokens(mask):
    return [(b, i) for b in range(mask.shape[0]) for i in range(mask.shape[1]) if mask[b, i]]


@pytest.mark.parametrize("seed", range(3))
def test_dual_clip_and_clip_higher_are_their_formulas(seed):
    _, mask, _, _, rand = random_batch(seed)
    logp, old, adv = rand(), rand(), rand() * 2  # ratios from e^-4 to e^4: every branch is taken
    low, high, c = 0.2, 0.28, 3.0
    loss, _ = policy_loss(logp, old, adv, mask, low, clip_high=high, dual_clip=c)
    per_token, dual_clipped = [], 0
    for b, i in tokens(mask):
        r, a = math.exp(logp[b, i] - old[b, i]), adv[b, i].item()
        surrogate = max(-a * r, -a * min(max(r, 1 - low), 1 + high))
        dual_clipped += a < 0 and -a * c < surrogate
        per_token.append(min(surrogate, -a * c) if a < 0 else surrogate)
    assert loss.item() == pytest.approx(sum(per_token) / len(per_token), rel=1e-12)
    assert dual_clipped  # the case exercises the dual clip
    symmetric, _ = policy_loss(logp, old, adv, mask, low)
    assert loss.item() != pytest.approx(symmetric.item(), rel=1e-6)  # the options change the loss


@pytest.mark.parametrize(
    "estimator, formula",
    [
        ("k1", lambda d: d),
        ("k2", lambda d: 0.5 * d * d),
        ("k3", lambda d: math.exp(-d) + d - 1),
        ("abs", lambda d: abs(d)),
    ],
)
def test_kl_estimators_and_clamp_are_their_formulas(estimator, formula):
    logp = torch.tensor([[-1.0, -0.2, -3.0, -14.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -0.2, -0.5, -0.1]], dtype=torch.float64)
    got = kl_estimate(logp, ref, estimator)
    want = [formula(a - b) for a, b in zip(logp[0].tolist(), ref[0].tolist())]
    assert got[0].tolist() == pytest.approx(want, rel=1e-12)
    clamped = kl_estimate(logp, ref, estimator, clamp=10.0)
    assert clamped[0].tolist() == pytest.approx([min(max(w, -10.0), 10.0) for w in want], rel=1e-12)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_estimate(logp, ref, "k4")


def naive_aggregate(x, mask, mode, norm):
    rows = [[x[b, i].item() for i in range(x.shape[1]) if mask[b, i]] for b in range(x.shape[0])]
    rows = [r for r in rows if r]
    if mode == "token-mean":
        return sum(map(sum, rows)) / sum(map(len, rows))
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if mode == "seq-mean-token-sum":
        return sum(map(sum, rows)) / len(rows)
    return sum(map(sum, rows)) / norm  # seq-mean-token-sum-norm: verl's sum over rows / a constant


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_loss_aggregations_are_their_formulas_and_sum_over_shares(mode):
    _, mask, _, _, rand = random_batch(4, b=7, t=9)
    mask[3] = 0  # a row with no token in the loss: no row of the mean
    x = rand()
    whole = Aggregate(mode, norm=32.0)(x, mask).item()
    assert whole == pytest.approx(naive_aggregate(x, mask, mode, 32.0), rel=1e-12)
    # two data-parallel shares with the minibatch's denominators sum to the whole
    totals = {"tokens": float(mask.sum()), "rows": float((mask.sum(1) > 0).sum()), "norm": 32.0}
    shares = [torch.tensor([0, 2, 5]), torch.tensor([1, 3, 4, 6])]
    summed = sum(Aggregate(mode, **totals)(x[s], mask[s]).item() for s in shares)
    assert summed == pytest.approx(whole, rel=1e-12)


def test_unknown_aggregation_is_refused():
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        Aggregate("sum")


def test_entropy_is_the_sampled_distributions():
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5]], dtype=torch.float64)
    t = 0.7
    p = torch.softmax(logits / t, -1)[0].tolist()
    assert entropy(logits, t).item() == pytest.approx(-sum(q * math.log(q) for q in p), rel=1e-12)


def test_dr_grpo_advantages_are_not_divided_by_the_groups_std():
    score = torch.tensor([1.0, 0.0, 0.0, 3.0, 5.0, 7.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    got = group_advantages(score, groups, norm_by_std=False)
    assert got.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, -2.0, 0.0, 2.0], rel=1e-12)
    assert group_advantages(score, groups).tolist() != pytest.approx(got.tolist())


def train(*args):
    cmd = [sys.executable, "-m", "oppo.exec.train", "--preset", "tiny-cpu", "--steps", "2", "--batch", "4"]
    return subprocess.run([*cmd, "--max-new-tokens", "12", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "flags",
    [
        ("--mode", "oppo", "--dual-clip", "3", "--clip-low", "0.2", "--clip-high", "0.28", "--kl-estimator", "k3",
         "--kl-in", "loss", "--kl-clamp", "10", "--loss-agg", "seq-mean-token-mean", "--entropy-coef", "0.01"),
        ("--mode", "oppo", "--algo", "grpo", "--group-size", "2", "--no-norm-adv-by-std",
         "--loss-agg", "seq-mean-token-sum-norm", "--kl-in", "reward", "--kl-estimator", "k2"),  # Dr. GRPO
    ],
    ids=["ppo-verl-style", "dr-grpo"],
)  # fmt: skip
def test_a_run_with_the_peer_options_trains_and_logs_entropy(tmp_path, flags):
    res = train(*flags, "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert len(rows) == 2 and all(0 < float(r["entropy"]) <= math.log(64) for r in rows)  # vocabulary of 64


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--dual-clip", "0.5"), "dual_clip must be > 1"),
        (("--clip-high", "1.5"), "clip_high must be in (0, 1)"),
        (("--kl-estimator", "k9"), "unknown kl_estimator 'k9'"),
        (("--loss-agg", "sum"), "unknown loss_agg 'sum'"),
        (("--kl-in", "prompt"), "unknown kl_in 'prompt'"),
    ],
)
def test_bad_peer_options_exit_2_in_one_line(tmp_path, flags, message):
    res = train(*flags, "--out", str(tmp_path / "run"))
    assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
