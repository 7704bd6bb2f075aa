import numpy as np
import pytest

from oppo import ScheduleConfig
from oppo.core.chunking import ExploringChunk, FixedChunk, make_chunk_policy
from oppo.core.overcommit import (
    Alg1Delta,
    FixedDelta,
    LengthObservation,
    SlopeDelta,
    TailDelta,
    kaplan_meier,
    make_delta_controller,
)


def test_slope_rises_with_reward_and_decays_when_flat():
    ctl = SlopeDelta(value=2, low=0, high=4, window=2)
    for r in [0, 1, 2, 3, 4, 5]:
        ctl.update(r)
    assert ctl.value == 4  # rose by 1 per step from the 3rd reward on, clipped at 4
    for _ in range(10):
        ctl.update(5)
    assert ctl.value == 0  # flat reward: decays to the lower bound


def test_alg1_literal_example():
    ctl = Alg1Delta(value=8, low=0, high=16, window=2)
    for r in [0.0, 0.0, 1.0, 1.0]:  # d = 1 - 0 > 0 at the 4th reward
        ctl.update(r)
    assert ctl.value == 6  # 8 - max(1, floor(8/4))


def test_exploration_schedule():
    policy = ExploringChunk((128, 256, 512), period_steps=10)
    seen = []
    for step in range(13):
        chunk = policy.chunk_for(step)
        seen.append(chunk)
        policy.observe(step, chunk, {128: 3.0, 256: 1.0, 512: 2.0}[chunk] + (5 if step >= 10 and chunk == 256 else 0))
    assert seen == [128, 256, 512] + [256] * 7 + [128, 256, 512]
    assert policy.best == 512  # re-explored at step 10: 256 got slower


def test_factories_follow_policy():
    assert isinstance(make_delta_controller(ScheduleConfig(policy="sync")), FixedDelta)
    assert make_delta_controller(ScheduleConfig(policy="intra", delta="5")).value == 0
    assert isinstance(make_delta_controller(ScheduleConfig(policy="oppo")), SlopeDelta)
    assert isinstance(make_delta_controller(ScheduleConfig(policy="oppo", delta_controller="alg1")), Alg1Delta)
    assert make_delta_controller(ScheduleConfig(policy="inter", delta="3")).value == 3
    assert isinstance(make_chunk_policy(ScheduleConfig(chunk="64")), FixedChunk)
    assert isinstance(make_chunk_policy(ScheduleConfig()), ExploringChunk)


def test_kaplan_meier_without_censoring_is_the_empirical_cdf():
    lengths = np.array([5, 1, 3, 3, 9, 1, 7])
    xs, cdf = kaplan_meier(lengths, np.array([], dtype=np.int64))
    assert xs.tolist() == [1, 3, 5, 7, 9]
    np.testing.assert_allclose(cdf, [np.mean(lengths <= x) for x in xs], rtol=0, atol=1e-12)


def test_kaplan_meier_counts_censored_sequences_as_still_running():
    # 4 finished at 10; 4 still running past 20: half the mass is beyond 20, not 0 as the finished alone say
    xs, cdf = kaplan_meier(np.array([10, 10, 10, 10]), np.array([20, 20, 20, 20]))
    assert xs.tolist() == [10] and cdf.tolist() == [0.5]


def tail(value=4, low=0, high=16, batch=16):
    return TailDelta(value=value, low=low, high=high, window=5, batch=batch)


def observe(ctl, finished, censored=()):
    ctl.update(0.0, LengthObservation(tuple(finished), tuple(censored)))


def test_tail_without_a_tail_needs_no_overcommit():
    ctl = tail()
    observe(ctl, [100] * 16)  # every response has the same length: over-commit cannot end a step earlier
    assert ctl.value == 0


def test_tail_with_capped_sequences_overcommits_and_stays_bounded():
    ctl = tail(high=64, batch=64)
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(np.log(700), 1.66, 256).astype(int) + 1, 1024)  # ~40% hit the cap
    observe(ctl, lengths)
    assert 48 <= ctl.value <= 64  # to end before the cap, B of B+Δ must finish below it: Δ near B
    bounded = tail(high=20, batch=64)
    observe(bounded, lengths)
    assert bounded.value == 0  # no Δ within the bounds ends a step before the cap: over-commit would only cost


def test_tail_waits_for_enough_lengths():
    ctl = tail(value=3)
    observe(ctl, [5, 900], censored=[40])
    assert ctl.value == 3  # fewer than B lengths: the initial Δ holds


def test_april_overprovisions_a_fixed_delta():
    assert make_delta_controller(ScheduleConfig(policy="april", batch=16, delta_max=6)).value == 6
    assert make_delta_controller(ScheduleConfig(policy="april", batch=16, delta="3")).value == 3
    assert isinstance(make_delta_controller(ScheduleConfig(policy="oppo", delta_controller="tail")), TailDelta)


def test_tail_with_groups_waits_for_b_groups_of_samples():
    """B counts groups: B x G sample lengths are needed before the distribution is trusted."""
    ctl = TailDelta(value=3, low=0, high=16, window=5, batch=16, group_size=8)
    observe(ctl, list(range(10, 110)))  # 100 samples: more than B = 16, fewer than B x G = 128
    assert ctl.value == 3
    grpo = ScheduleConfig(policy="oppo", algo="grpo", group_size=8, batch=16, delta_max=16, delta_controller="tail")
    assert make_delta_controller(grpo).group_size == 8


def monte_carlo_ends(pool: np.ndarray, batch: int, group_size: int, deltas, confidence: float, rng, trials: int):
    """Per Δ: the ``confidence`` quantile of the step's end over ``trials`` simulated steps, and its order-statistic
    99% confidence interval. A step draws B+Δ groups of G sample lengths from ``pool``; a group completes with its
    longest sample; the step ends when the B-th group completes."""
    n_max = batch + max(deltas)
    groups = rng.choice(pool, size=(trials, n_max, group_size)).max(axis=2)  # common draws for every Δ
    k = trials * confidence + np.array([-1, 1]) * 2.576 * np.sqrt(trials * confidence * (1 - confidence))
    rank_low, rank_high = np.clip(np.floor(k).astype(int), 0, trials - 1)
    out = {}
    for delta in deltas:
        ends = np.sort(np.sort(groups[:, : batch + delta], axis=1)[:, batch - 1])
        out[delta] = (float(np.quantile(ends, confidence, method="inverted_cdf")), ends[rank_low], ends[rank_high])
    return out


@pytest.mark.parametrize("group_size", [1, 8])
def test_tail_end_and_delta_match_a_monte_carlo_of_group_completion(group_size):
    """GRPO: a step of B+Δ groups of G samples ends when the B-th group completes, each group with its slowest
    sample. The controller's end(Δ) (the ``confidence`` quantile of that end) is checked for every Δ against
    4,000 simulated steps drawn from the very lengths it observed (independent samples within a group): equal
    within the simulation's 99% interval for the quantile or 5%; and the Δ it picks is the one the simulated ends
    give by its rule, within one."""
    rng = np.random.default_rng(17)
    lengths = np.minimum(rng.lognormal(np.log(300), 0.6, 20_000).astype(int) + 1, 1024)  # capped lognormal
    batch, low, high = 16, 0, 16
    ctl = TailDelta(value=4, low=low, high=high, window=1, batch=batch, group_size=group_size)
    observe(ctl, lengths)
    xs, cdf = kaplan_meier(lengths, np.array([], dtype=np.int64))
    mc = monte_carlo_ends(lengths, batch, group_size, range(low, high + 1), ctl.confidence, rng, trials=4000)
    for delta, (quantile, ci_low, ci_high) in mc.items():
        end = ctl.end_tokens(xs, cdf, delta)
        assert ci_low <= end <= ci_high or abs(end - quantile) <= 0.05 * quantile, (delta, end, quantile)
    ends = [mc[d][0] for d in range(low, high + 1)]
    target = ends[-1] + ctl.tolerance * (ends[0] - ends[-1])
    simulated = low + next(i for i, end in enumerate(ends) if end <= target)
    assert abs(ctl.value - simulated) <= 1, (ctl.value, simulated)
