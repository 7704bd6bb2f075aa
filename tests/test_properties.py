"""Hypothesis invariants of the scheduling core."""

from hypothesis import given, settings
from hypothesis import strategies as st

from oppo import ScheduleConfig, Scheduler
from oppo.chunking import ExploringChunk
from oppo.overcommit import Alg1Delta, SlopeDelta
from tests.drive import finish_all, run_step

policies = st.sampled_from(["sync", "intra", "inter", "oppo", "tppo", "april", "tailbatch"])


@st.composite
def scenarios(draw):
    policy = draw(policies)
    batch = draw(st.integers(1, 6))
    group_size = 1 if policy == "tppo" else draw(st.sampled_from([1, 1, 2, 3]))
    cfg = ScheduleConfig(
        policy=policy,
        algo="ppo" if group_size == 1 else "grpo",
        group_size=group_size,
        batch=batch,
        max_new_tokens=draw(st.integers(1, 40)),
        chunk=str(draw(st.integers(1, 12))),
        check_tokens=draw(st.integers(1, 12)),
        delta=draw(st.sampled_from(["auto", "0", str(min(1, batch)), str(min(3, batch))])),
        delta_controller=draw(st.sampled_from(["slope", "alg1", "tail"])),
        delta_max=min(4, batch),
        delta_init=min(2, batch),
        delta_window=2,
        max_deferrals=draw(st.integers(1, 3)),
        window_tokens=draw(st.integers(1, 20)),
    )
    lengths = draw(st.lists(st.integers(1, 60), min_size=200, max_size=200))
    rewards = draw(st.lists(st.floats(-1, 1), min_size=6, max_size=6))
    return cfg, lengths, rewards


def simulate(cfg, lengths, rewards, plans=None):
    s = Scheduler(cfg)
    table = dict(enumerate(lengths))
    outcomes = []
    for r in rewards:
        plan, outcome, _ = run_step(s, table, reward=r)
        outcomes.append(outcome)
        if plans is not None:
            plans.append(plan)
    return s, outcomes


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_conservation_and_bounds(scenario):
    cfg, lengths, rewards = scenario
    plans = []
    s, outcomes = simulate(cfg, lengths, rewards, plans)
    trained_finished = [t.seq_id for o in outcomes for t in o.trained if t.finished]
    assert len(trained_finished) == len(set(trained_finished))  # none trained twice
    assert set(trained_finished).isdisjoint(s.buffer.seqs)
    queued = {i for group in s.long_queue for i in group}  # tailbatch: aborted, waiting for a long round
    assert queued.isdisjoint(s.buffer.seqs) and queued.isdisjoint(trained_finished)
    assert set(trained_finished) | set(s.buffer.seqs) | queued == set(range(s.buffer.admitted))  # none lost
    aborted_before: set[int] = set()
    for plan, o in zip(plans, outcomes):
        if plan.long_round:  # tailbatch long rounds: previously aborted prompts only, no over-provisioning
            assert plan.new == () and set(plan.restarted) == set(plan.active) <= aborted_before
            assert plan.delta == 0 and len({t.group_id for t in o.trained}) == cfg.batch
        else:
            assert plan.restarted == ()
        aborted_before |= set(plan.active) - {t.seq_id for t in o.trained if t.finished} - set(o.carried)
    for o in outcomes:
        if cfg.truncated:
            assert all(t.step_tokens <= cfg.window_tokens for t in o.trained)
        else:
            assert len(o.trained) == cfg.batch * cfg.group_size  # endless prompts: exactly B groups per step
            groups = {t.group_id for t in o.trained}  # a group is trained whole, its samples together
            assert len(groups) == cfg.batch
            assert [t.seq_id for t in o.trained] == [
                i
                for g in dict.fromkeys(t.group_id for t in o.trained)
                for i in range(g * cfg.group_size, (g + 1) * cfg.group_size)
            ]
        for t in o.trained:
            assert t.response_tokens <= cfg.max_new_tokens
            assert t.response_tokens <= lengths[t.seq_id]
            assert not t.finished or t.response_tokens == min(lengths[t.seq_id], cfg.max_new_tokens)
            if cfg.policy == "tailbatch":  # restarted samples are on-policy whatever they waited
                assert t.policy_lag <= t.deferrals
            else:
                assert t.policy_lag == t.deferrals  # one policy version per step; decoded from admission on
                assert cfg.truncated or t.deferrals <= cfg.max_deferrals
    for seq in s.buffer.seqs.values():
        assert seq.generated_tokens <= cfg.max_new_tokens


@settings(max_examples=50, deadline=None)
@given(scenarios())
def test_same_inputs_same_decisions(scenario):
    cfg, lengths, rewards = scenario
    assert simulate(cfg, lengths, rewards)[1] == simulate(cfg, lengths, rewards)[1]


@given(
    st.integers(0, 3),
    st.integers(3, 8),
    st.integers(1, 4),
    st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=40),
)
def test_slope_delta_bounded_and_directed(low, high, window, rewards):
    ctl = SlopeDelta(value=low, low=low, high=high, window=window)
    for i, r in enumerate(rewards):
        before = ctl.value
        ctl.update(r)
        assert low <= ctl.value <= high
        if i >= window:
            slope = (rewards[i] - rewards[i - window]) / window
            expected = min(high, before + 1) if slope > 0 else max(low, before - 1)
            assert ctl.value == expected
        else:
            assert ctl.value == before


@given(st.integers(0, 16), st.integers(1, 4), st.lists(st.floats(-10, 10, allow_nan=False), max_size=40))
def test_alg1_delta_bounded_and_opposite_to_trend(init, window, rewards):
    ctl = Alg1Delta(value=init, low=0, high=16, window=window)
    for r in rewards:
        before = ctl.value
        ctl.update(r)
        assert 0 <= ctl.value <= 16
        if ctl.value != before:
            recent = ctl.rewards
            d = sum(recent[-window:]) / window - sum(recent[-2 * window : -window]) / window
            assert (ctl.value < before) == (d > 0)  # Algorithm 1 lowers Δ while reward rises


@given(st.lists(st.integers(1, 512), min_size=1, max_size=4, unique=True), st.integers(1, 3), st.data())
def test_exploration_keeps_fastest(candidates, trials, data):
    policy = ExploringChunk(tuple(candidates), period_steps=20, trials=trials)
    times = {}
    for step in range(len(candidates) * trials):
        chunk = policy.chunk_for(step)
        t = data.draw(st.floats(0.1, 100))
        times.setdefault(chunk, []).append(t)
        policy.observe(step, chunk, t)
    mean = {c: sum(v) / len(v) for c, v in times.items()}
    assert set(mean) == set(candidates)
    assert policy.best == min(candidates, key=lambda c: mean[c])
    assert policy.chunk_for(len(candidates) * trials) == policy.best


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 5), st.integers(1, 30), st.integers(1, 8), st.lists(st.integers(1, 80), min_size=150, max_size=150)
)
def test_chunk_size_never_changes_what_is_trained(batch, chunk, check, lengths):
    """oppo (streaming) trains exactly what inter trains: decisions are taken at check_tokens boundaries only."""
    common = dict(batch=batch, delta=str(min(2, batch)), check_tokens=check, max_new_tokens=60)
    table = dict(enumerate(lengths))
    runs = []
    for policy, extra in (("inter", {}), ("oppo", {"chunk": str(chunk)})):
        s = Scheduler(ScheduleConfig(policy=policy, **common, **extra))
        runs.append([[(t.seq_id, t.response_tokens) for t in run_step(s, table)[1].trained] for _ in range(5)])
    assert runs[0] == runs[1]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 5), st.integers(1, 3), st.integers(1, 3), st.lists(st.integers(1, 40), min_size=120, max_size=120)
)
def test_async_lag_bounded_by_staleness(batch, staleness, group_size, lengths):
    """Pipelined generation: step t is generated by the oldest weights allowed (version t - K) while earlier
    steps train; every trained sample's lag is within K, and steps close in order."""
    algo = "ppo" if group_size == 1 else "grpo"
    cfg = ScheduleConfig(
        policy="async",
        batch=batch,
        staleness=staleness,
        algo=algo,
        group_size=group_size,
        max_new_tokens=30,
        delta_max=min(4, batch),
        delta_init=min(2, batch),
    )
    s, table, closed = Scheduler(cfg), dict(enumerate(lengths)), []
    for step in range(6):
        plan = s.plan_step(float(step), version=max(0, step - staleness))
        finish_all(s, table, plan)
        s.finish_generation()
        if step >= staleness:  # training trails generation by K steps
            closed.append(s.close_step(float(step), 0.0))
    while s._pending:
        closed.append(s.close_step(10.0, 0.0))
    assert [o.record.step for o in closed] == list(range(6))
    for o in closed:
        assert len(o.trained) == batch * group_size
        assert all(0 <= t.policy_lag <= staleness for t in o.trained)
    assert max(t.policy_lag for o in closed for t in o.trained) == staleness
