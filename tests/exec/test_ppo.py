"""PPO math against naive loop implementations, across seeds."""

import math

import pytest
import torch

from oppo.exec.algos.ppo import gae, group_advantages, kl_k3, kl_shaped_rewards, masked_whiten, policy_loss, value_loss


def naive_gae(rewards, values, lengths, starts, gamma, lam, bootstrap):
    adv = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        s, e = starts[b], starts[b] + lengths[b]  # valid positions [s, e)
        running = 0.0
        for i in reversed(range(s, e)):
            if i == e - 1:
                nxt = values[b, i].item() if bootstrap[b] else 0.0
            else:
                nxt = values[b, i + 1].item()
            delta = rewards[b, i].item() + gamma * nxt - values[b, i].item()
            running = delta + (gamma * lam * running if i < e - 1 else 0.0)
            adv[b, i] = running
    return adv


def random_batch(seed, b=5, t=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=g).tolist()
    starts = [int(torch.randint(0, t - n + 1, (1,), generator=g)) for n in lengths]
    mask = torch.zeros(b, t, dtype=torch.float64)
    for row, (s, n) in enumerate(zip(starts, lengths)):
        mask[row, s : s + n] = 1
    rand = lambda: torch.randn(b, t, generator=g, dtype=torch.float64)  # noqa: E731
    return g, mask, lengths, starts, rand


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("boot", [False, True])
def test_gae_matches_loop(seed, boot):
    g, mask, lengths, starts, rand = random_batch(seed)
    rewards, values = rand() * mask, rand() * mask
    bootstrap = torch.rand(5, generator=g) < 0.5 if boot else torch.zeros(5, dtype=torch.bool)
    adv, ret = gae(rewards, values, mask, 0.97, 0.9, bootstrap if boot else None)
    expected = naive_gae(rewards, values, lengths, starts, 0.97, 0.9, bootstrap.tolist())
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, (expected + values) * mask)


@pytest.mark.parametrize("seed", range(3))
def test_kl_rewards_losses_and_whiten_match_loops(seed):
    g, mask, lengths, starts, rand = random_batch(seed)
    logp, ref, adv, old = rand(), rand(), rand(), rand()
    score = torch.randn(5, generator=g, dtype=torch.float64)
    scored = torch.tensor([True, False, True, True, False])
    rewards = kl_shaped_rewards(score, logp, ref, mask, 0.1, scored)
    for b in range(5):
        for i in range(9):
            want = -0.1 * (logp[b, i] - ref[b, i]) * mask[b, i]
            if scored[b] and i == starts[b] + lengths[b] - 1:
                want += score[b]
            assert rewards[b, i].item() == pytest.approx(want.item())
    n = mask.sum()
    loss, _ = policy_loss(logp, old, adv, mask, 0.2)
    naive = (
        sum(
            max(
                -adv[b, i] * torch.exp(logp[b, i] - old[b, i]),
                -adv[b, i] * torch.exp(logp[b, i] - old[b, i]).clamp(0.8, 1.2),
            )
            for b in range(5)
            for i in range(9)
            if mask[b, i]
        )
        / n
    )
    assert loss.item() == pytest.approx(naive.item())
    ret = rand()
    vl = value_loss(logp, old, ret, mask, 0.2)
    naive_v = (
        sum(
            0.5
            * max(
                (logp[b, i] - ret[b, i]) ** 2, (old[b, i] + (logp[b, i] - old[b, i]).clamp(-0.2, 0.2) - ret[b, i]) ** 2
            )
            for b in range(5)
            for i in range(9)
            if mask[b, i]
        )
        / n
    )
    assert vl.item() == pytest.approx(naive_v.item())
    w = masked_whiten(adv, mask)
    vals = torch.tensor([adv[b, i] for b in range(5) for i in range(9) if mask[b, i]])
    ref_w = (vals - vals.mean()) / vals.var(unbiased=True).add(1e-8).sqrt()
    torch.testing.assert_close(w[mask.bool()], ref_w)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_advantages_match_a_loop(seed):
    g = torch.Generator().manual_seed(seed)
    score = torch.randn(12, generator=g, dtype=torch.float64)
    groups = torch.tensor([5, 5, 5, 9, 9, 9, 2, 2, 2, 7, 7, 7])
    got = group_advantages(score, groups)
    for gid in groups.unique():
        rows = groups == gid
        r = score[rows]
        expected = (r - r.mean()) / (r.std() + 1e-6)  # the sample std (n - 1), as TRL's and verl's GRPO
        torch.testing.assert_close(got[rows], expected, rtol=1e-12, atol=1e-12)
    assert group_advantages(torch.ones(4, dtype=torch.float64), torch.tensor([0, 0, 1, 1])).abs().max() == 0
    lone = group_advantages(torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64), torch.tensor([0, 1, 1]))
    assert lone[0] == 0 and lone[1] == pytest.approx(-0.5 / (0.5**0.5 + 1e-6))  # a group of one: no signal


def test_kl_k3_is_zero_at_the_reference_and_positive_elsewhere():
    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    mask = torch.ones_like(logp)
    assert kl_k3(logp, logp, mask) == 0
    assert kl_k3(logp, logp - 0.3, mask) > 0 and kl_k3(logp, logp + 0.3, mask) > 0


def test_kl_k3_is_the_formula_and_its_argument_order_matters():
    """k3(logp, ref) = exp(ref - logp) - (ref - logp) - 1 per token, masked mean. The policy's log-prob first:
    k3(log 0.5, log 0.1) = 0.2 + log 5 - 1 = 0.8094; the arguments swapped, k3(log 0.1, log 0.5) = 5 - log 5 - 1 =
    2.3906."""
    p = torch.tensor([[0.5, 0.1, 0.3, 0.9, 0.02]], dtype=torch.float64)
    q = torch.tensor([[0.1, 0.5, 0.3, 0.05, 0.6]], dtype=torch.float64)
    logp, ref = p.log(), q.log()
    one = torch.ones_like(logp)
    assert kl_k3(logp[:, :1], ref[:, :1], one[:, :1]).item() == pytest.approx(0.2 + math.log(5) - 1, rel=1e-12)
    assert kl_k3(ref[:, :1], logp[:, :1], one[:, :1]).item() == pytest.approx(5 - math.log(5) - 1, rel=1e-12)
    for mask in (one, torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0]], dtype=torch.float64)):
        for a, b in ((logp, ref), (ref, logp)):
            per_token = [math.exp(y - x) - (y - x) - 1 for x, y in zip(a[0].tolist(), b[0].tolist())]
            want = sum(k * m for k, m in zip(per_token, mask[0].tolist())) / mask.sum().item()
            assert kl_k3(a, b, mask).item() == pytest.approx(want, rel=1e-12)
        assert kl_k3(logp, ref, mask).item() != pytest.approx(kl_k3(ref, logp, mask).item(), rel=0.1)
    assert kl_k3(logp, ref, one, total=10.0).item() == pytest.approx(kl_k3(logp, ref, one).item() * 5 / 10)


def test_kl_k3_over_the_policys_samples_estimates_kl_policy_to_reference():
    """Tokens sampled from the policy pi: mean k3(log pi(x), log ref(x)) is an unbiased estimate of
    KL(pi || ref) = sum pi log(pi / ref). With the arguments swapped it estimates E_pi[pi / ref] - 1 - KL, another
    number: the test tells the two orders apart by what they estimate."""
    g = torch.Generator().manual_seed(0)
    pi = torch.softmax(torch.randn(12, generator=g, dtype=torch.float64), 0)
    ref = torch.softmax(torch.randn(12, generator=g, dtype=torch.float64), 0)
    x = torch.multinomial(pi, 200_000, replacement=True, generator=g)[None, :]  # (1, N) tokens from pi
    logp, ref_lp, mask = pi.log()[x], ref.log()[x], torch.ones(x.shape, dtype=torch.float64)
    kl = float((pi * (pi / ref).log()).sum())
    swapped = float((pi * pi / ref).sum()) - 1 - kl
    d = ref_lp - logp
    stderr = float((d.exp() - d - 1).std()) / x.shape[1] ** 0.5  # of the k3 mean
    stderr_swapped = float(((-d).exp() + d - 1).std()) / x.shape[1] ** 0.5
    assert abs(kl_k3(logp, ref_lp, mask).item() - kl) < 4 * stderr
    assert abs(kl_k3(ref_lp, logp, mask).item() - swapped) < 4 * stderr_swapped
    assert abs(swapped - kl) > 40 * max(stderr, stderr_swapped)  # far apart: a swap cannot pass the first check


def test_whitening_divides_by_n_minus_1_as_verl_and_trl():
    # verl (core_algos.masked_whiten) and TRL whiten with the unbiased variance: [3, 5] -> -+1/sqrt(2), not -+1
    x = torch.tensor([[3.0, 5.0, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    w = masked_whiten(x, mask)
    torch.testing.assert_close(w, torch.tensor([[-(0.5**0.5), 0.5**0.5, 0.0]], dtype=torch.float64), rtol=0, atol=1e-8)
    one = masked_whiten(
        torch.tensor([[7.0, 1.0]], dtype=torch.float64), torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    )
    assert one.tolist() == [[0.0, 0.0]]  # a single token's advantage stays defined (verl raises on it)
