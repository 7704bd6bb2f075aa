"""The options users of verl and TRL expect, each against its formula written as a loop over tokens (float64):
dual clip (verl ``clip_ratio_c``), clip-higher (``clip_ratio_low/high``, TRL ``epsilon_high``), the KL estimators
and their clamp (``kl_loss_type``), the loss aggregations (``loss_agg_mode``), the entropy bonus and Dr. GRPO's
unnormalised group advantages; then a run with each of them on."""

import csv
import math
import re

import pytest
import torch

from oppo.exec.algos.ppo import Aggregate, entropy, group_advantages, kl_estimate, policy_loss, sampled_logprobs
from oppo.exec.compute.update import actor_loss, deal, kl_use, minibatch_totals
from oppo.exec.config import ExecConfig, PPOConfig, default_schedule
from oppo.records.schema import TrainedSeq
from tests import invoke
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
    assert entropy(sampled_logprobs(logits, t)).item() == pytest.approx(-sum(q * math.log(q) for q in p), rel=1e-12)


def test_dr_grpo_advantages_are_not_divided_by_the_groups_std():
    score = torch.tensor([1.0, 0.0, 0.0, 3.0, 5.0, 7.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    got = group_advantages(score, groups, norm_by_std=False)
    assert got.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, -2.0, 0.0, 2.0], rel=1e-12)
    assert group_advantages(score, groups).tolist() != pytest.approx(got.tolist())


def train(*args):
    return invoke.train("--preset", "tiny-cpu", "--steps", "2", "--batch", "4", "--max-new-tokens", "12", *args)


@pytest.mark.parametrize(
    "flags",
    [
        ("--policy", "oppo", "--dual-clip", "3", "--clip-low", "0.2", "--clip-high", "0.28", "--kl-estimator", "k3",
         "--kl-in", "loss", "--kl-clamp", "10", "--loss-agg", "seq-mean-token-mean", "--entropy-coef", "0.01"),
        ("--policy", "oppo", "--algo", "grpo", "--group-size", "2", "--no-norm-adv-by-std",
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
    "kwargs, message",
    [
        ({"dual_clip": 0.5}, "dual_clip must be > 1"),
        ({"clip_high": 0.0}, "clip_high must be > 0"),
        ({"clip_low": 1.5}, "clip_low must be in (0, 1)"),
        ({"kl_estimator": "k9"}, "unknown kl_estimator 'k9'"),
        ({"loss_agg": "sum"}, "unknown loss_agg 'sum'"),
        ({"kl_in": "prompt"}, "unknown kl_in 'prompt'"),
        ({"kl_coef": 0.0, "kl_estimator": "k3"}, "kl_estimator or kl_clamp is set but kl_coef is 0"),
        ({"kl_coef": 0.0, "kl_clamp": 10.0}, "kl_estimator or kl_clamp is set but kl_coef is 0"),
    ],
)
def test_bad_peer_options_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        PPOConfig(**kwargs)
    assert PPOConfig(clip_high=1.5).clip_high == 1.5  # clip-higher may pass 1, as verl allows


def test_a_bad_peer_option_exits_2_in_one_line(tmp_path):
    res = train("--no-norm-adv-by-std", "--out", str(tmp_path / "run"))  # PPO: no group to normalise
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "--no-norm-adv-by-std changes GRPO's group advantages" in res.stderr
    assert not (tmp_path / "run").exists()


# -- the actor's loss as the trainer computes it (update.actor_loss), against a hand-written one -----------------


def minibatch(seed: int, rows: int = 6, width: int = 7, vocab: int = 5):
    """A minibatch's tensors as step_batch makes them, with the logits at the response positions (rows, T, V)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(rows, width, dtype=torch.float64)
    for r, n in enumerate(torch.randint(1, width + 1, (rows,), generator=g).tolist()):
        mask[r, :n] = 1
    mask[2] = 0  # a row with nothing in the loss (a T-PPO segment dropped whole)
    rand = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    part = {
        "targets": torch.randint(0, vocab, (rows, width), generator=g),
        "old_lp": rand(rows, width) - 1.5,
        "ref_lp": rand(rows, width) - 1.5,
        "adv": rand(rows, width) * mask,
        "mask": mask,
    }
    return rand(rows, width, vocab) * 2, part


def hand_written_loss(ppo: PPOConfig, picked, part, cap: int) -> torch.Tensor:
    """The loss of docs/executor.md's table, token by token (PPO options on, KL in the loss)."""
    logp_all = torch.log_softmax(picked / ppo.temperature, -1)
    rows = []
    for b in range(picked.shape[0]):
        terms = []
        for t in range(picked.shape[1]):
            if not part["mask"][b, t]:
                continue
            lp = logp_all[b, t, part["targets"][b, t]]
            a, ratio = part["adv"][b, t], torch.exp(lp - part["old_lp"][b, t])
            term = torch.maximum(-a * ratio, -a * ratio.clamp(1 - ppo.clip_low, 1 + ppo.clip_high))
            if a < 0:
                term = torch.minimum(term, -a * ppo.dual_clip)
            d = lp - part["ref_lp"][b, t]
            term = term + ppo.kl_coef * (torch.exp(-d) + d - 1).clamp(-ppo.kl_clamp, ppo.kl_clamp)  # k3
            term = term - ppo.entropy_coef * -(logp_all[b, t].exp() * logp_all[b, t]).sum()
            terms.append(term)
        if terms:
            rows.append(terms)
    if ppo.loss_agg == "token-mean":
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    if ppo.loss_agg == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if ppo.loss_agg == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / len(rows)
    return sum(sum(r) for r in rows) / cap


LOSS_AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def options(loss_agg: str) -> ExecConfig:
    ppo = PPOConfig(
        clip_low=0.2, clip_high=0.3, dual_clip=2.0, kl_in="loss", kl_clamp=1.5, kl_coef=0.2, entropy_coef=0.05,
        loss_agg=loss_agg, temperature=0.8,
    )  # fmt: skip
    return ExecConfig(ppo=ppo)


@pytest.mark.parametrize("loss_agg", LOSS_AGGS)
def test_the_actor_loss_and_its_gradient_are_the_hand_written_ones(loss_agg):
    config = options(loss_agg)
    picked, part = minibatch(0)
    assert kl_use(config) == ("k3", "loss")  # auto: k3 where the KL is a loss term
    mine = picked.clone().requires_grad_(True)
    theirs = picked.clone().requires_grad_(True)
    loss, token_entropy = actor_loss(config, mine, part, minibatch_totals(part, torch.arange(6)))
    want = hand_written_loss(config.ppo, theirs, part, config.schedule.max_new_tokens)
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)
    loss.backward()
    want.backward()
    torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-10, atol=1e-12)
    assert not token_entropy.requires_grad and token_entropy.shape == part["mask"].shape


@pytest.mark.parametrize("loss_agg", LOSS_AGGS)
def test_data_parallel_shares_sum_to_the_minibatchs_loss_and_gradient(loss_agg):
    """Two ranks' shares, each with the minibatch's denominators (minibatch_totals), add up to one rank's loss and
    gradient: what --dp N relies on, for every aggregation."""
    config = options(loss_agg)
    picked, part = minibatch(1)
    rows = torch.arange(6)
    totals = minibatch_totals(part, rows)
    whole = picked.clone().requires_grad_(True)
    actor_loss(config, whole, part, totals)[0].backward()
    shared = picked.clone().requires_grad_(True)
    summed = 0.0
    for share in deal(rows, part["mask"].sum(1) + 1, 2):
        loss, _ = actor_loss(config, shared[share], {k: v[share] for k, v in part.items()}, totals)
        summed = summed + loss
    summed.backward()
    assert summed.item() == pytest.approx(actor_loss(config, picked, part, totals)[0].item(), rel=1e-12)
    torch.testing.assert_close(shared.grad, whole.grad, rtol=1e-10, atol=1e-12)


def test_the_entropy_bonus_raises_the_entropy():
    config = ExecConfig(ppo=PPOConfig(entropy_coef=1.0))
    picked, part = minibatch(2)
    part["adv"] = torch.zeros_like(part["adv"])  # the bonus alone
    logits = picked.clone().requires_grad_(True)
    loss, before = actor_loss(config, logits, part, minibatch_totals(part, torch.arange(6)))
    loss.backward()
    after = actor_loss(config, (logits - 0.1 * logits.grad).detach(), part, minibatch_totals(part, torch.arange(6)))[1]
    mask = part["mask"].bool()
    assert after[mask].mean() > before[mask].mean()


def test_where_the_kl_goes():
    """PPO with the KL in the loss pays none in the reward; GRPO with the KL in the reward takes each sample's
    summed KL estimate off its score before the group statistics."""
    from oppo.exec.compute.update import grpo_targets, ppo_targets

    g = torch.Generator().manual_seed(3)
    rows, width = 4, 5
    mask = torch.ones(rows, width)
    lp = lambda: [torch.randn(width, generator=g, dtype=torch.float64) - 1 for _ in range(rows)]  # noqa: E731
    scores = {"old_logprobs": lp(), "ref_logprobs": lp(), "values": lp(), "score": torch.randn(rows, generator=g)}
    trained = [TrainedSeq(0, i, i // 2, 0, 0, width, width, True, 0) for i in range(rows)]
    in_loss = ppo_targets(ExecConfig(ppo=PPOConfig(kl_in="loss")), trained, scores, mask)
    no_kl = ppo_targets(ExecConfig(ppo=PPOConfig(kl_coef=0.0)), trained, scores, mask)
    torch.testing.assert_close(in_loss["adv"], no_kl["adv"], rtol=0, atol=0)
    assert "ref_lp" in in_loss and "ref_lp" not in no_kl
    grpo = lambda **kw: ExecConfig(schedule=default_schedule(algo="grpo", group_size=2), ppo=PPOConfig(**kw))  # noqa: E731
    in_reward = grpo_targets(grpo(kl_in="reward", kl_estimator="k2", kl_coef=0.3), trained, scores, mask)
    old, ref = torch.stack(scores["old_logprobs"]), torch.stack(scores["ref_logprobs"])
    penalised = scores["score"].double() - 0.3 * (0.5 * (old - ref) ** 2).sum(1)
    want = group_advantages(penalised, torch.tensor([0, 0, 1, 1]))
    torch.testing.assert_close(in_reward["adv"][:, 0], want, rtol=1e-12, atol=1e-12)
    in_loss_grpo = grpo_targets(grpo(), trained, scores, mask)
    assert not torch.allclose(in_loss_grpo["adv"], in_reward["adv"])


def test_mask_truncated_leaves_the_samples_cut_at_the_cap_out_of_the_loss_but_in_their_groups():
    from oppo.exec.compute.update import cut_at_cap, step_batch
    from oppo.exec.step.runner import SeqData

    cap, eos = 4, 1
    responses = [[7, 8, 1], [7, 8, 9, 10], [7, 8, 9, 1], [9, 9, 9, 9]]  # the 2nd and 4th hit the cap without EOS
    data = {i: SeqData(prompt=[5, 6], response=r) for i, r in enumerate(responses)}
    trained = [TrainedSeq(0, i, i // 2, 0, 0, len(r), len(r), True, 0) for i, r in enumerate(responses)]
    zeros = [torch.zeros(len(r), dtype=torch.float64) for r in responses]
    scores = {"old_logprobs": zeros, "ref_logprobs": zeros, "score": torch.tensor([1.0, 0.0, 0.0, 1.0])}
    assert cut_at_cap(trained, data, cap, eos).tolist() == [False, True, False, True]

    def batch(mask_truncated: bool):
        schedule = default_schedule(algo="grpo", group_size=2, batch=2, max_new_tokens=cap)
        config = ExecConfig(schedule=schedule, ppo=PPOConfig(mask_truncated=mask_truncated))
        return step_batch(config, trained, data, scores, pad_id=0, eos_id=eos)

    kept, masked = batch(False), batch(True)
    assert masked["mask"][[1, 3]].sum() == 0  # out of the loss
    assert torch.equal(masked["mask"][[0, 2]], kept["mask"][[0, 2]])
    assert torch.equal(masked["adv"], kept["adv"])  # the group statistics still count their rewards
    assert kept["adv"][0, 0] > 0 > kept["adv"][1, 0]
