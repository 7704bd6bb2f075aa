from oppo import ScheduleConfig
from oppo.chunking import ExploringChunk, FixedChunk, make_chunk_policy
from oppo.overcommit import Alg1Delta, FixedDelta, SlopeDelta, make_delta_controller


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
