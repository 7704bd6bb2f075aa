import numpy as np

from oppo import ScheduleConfig
from oppo.chunking import ExploringChunk, FixedChunk, make_chunk_policy
from oppo.overcommit import (
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
