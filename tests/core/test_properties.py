"""Hypothesis invariants of the scheduling core (and of the simulator's async pipeline, which drives it)."""

import dataclasses
from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from oppo import ScheduleConfig, Scheduler
from oppo.catalog.lengths import LengthTrace
from oppo.core.chunking import ExploringChunk
from oppo.core.overcommit import Alg1Delta, SlopeDelta
from oppo.sim import SimConfig, load_setup
from oppo.sim import simulate as sim_run
from oppo.sim.setup.presets import Placement
from tests.drive import run_step

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


@dataclass(frozen=True)
class FixedCost:
    """Every operation a fixed time: one decode iteration ``decode_s``, a forward pass 0.5 s, a training pass
    ``train_s``; nothing else."""

    decode_s_: float
    train_s_: float

    def decode_s(self, batch, context_tokens):
        return np.full(np.shape(batch), self.decode_s_)

    def prefill_s(self, tokens, attended, rows=1):
        return 0.5 if tokens > 0 else 0.0

    score_s = prefill_s

    def train_s(self, tokens, attended, rows=1):
        return self.train_s_

    def fixed_s(self, stages):
        return 0.0

    def update_host_s(self):
        return 0.0

    def sync_s(self):
        return 0.0

    transfer_s = sync_s


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(0, 3),  # K = 0: synchronous, every lag 0
    st.integers(1, 2),
    st.floats(0.001, 1.0),
    st.floats(0.01, 5.0),
    st.lists(st.integers(1, 40), min_size=64, max_size=64),
)
def test_async_lag_is_the_lag_the_simulation_ran(batch, staleness, group_size, decode_s, train_s, lengths):
    """``async`` in the simulator (generation on gpu0, training on gpu1): each trained sample's recorded policy
    lag is measured back from the simulated timeline, as the updates its step trains on top of minus the updates
    that had finished when its generation began, and is within K. When generating K steps takes less than one
    update, generation runs the full K ahead and the lag reaches K."""
    setup = dataclasses.replace(load_setup("tiny-cpu"), placement=Placement("disaggregated", 2, 1))
    schedule = setup.schedule(
        policy="async",
        staleness=staleness,
        batch=batch,
        algo="ppo" if group_size == 1 else "grpo",
        group_size=group_size,
        max_new_tokens=40,
        delta_max=min(4, batch),
        delta_init=min(2, batch),
    )
    trace = LengthTrace("drawn", np.array(lengths), np.full(len(lengths), 4))
    costs = {role: FixedCost(decode_s, train_s) for role in setup.devices_for("async")}
    result = sim_run(SimConfig(schedule, setup, steps=6, seed=0), trace, costs=costs)
    gen_start = {}  # step -> when its generation began on the rollout device
    for row in result.trace:
        if row.device == "gpu0":
            gen_start[row.step] = min(row.start_s, gen_start.get(row.step, row.start_s))
    updated = [s.end_s for s in result.steps]  # step s's update (policy version s + 1) ends when it closes
    assert [s.step for s in result.steps] == list(range(6)) and sorted(updated) == updated
    lags = []
    for t in result.trained:
        versions = sum(end <= gen_start[t.admitted_step] for end in updated)  # weights that generated it
        lags.append(t.step - versions)  # trained on top of t.step updates (steps train in order)
        assert t.policy_lag == lags[-1]
    assert len(lags) == 6 * batch * group_size and 0 <= min(lags) and max(lags) <= staleness
    generation_s, update_s = 0.5 + 40 * decode_s, 4 * train_s  # at most; at least (actor, 2 epochs x 2 minibatches)
    if staleness * generation_s < update_s:
        assert max(lags) == staleness
