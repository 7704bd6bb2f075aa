"""Scripted scenarios with exact expected decisions."""

import pytest

from oppo import ScheduleConfig, Scheduler
from oppo.core.scheduler import Decisions
from tests.drive import finish_all, run_step


def ids(outcome):
    return [t.seq_id for t in outcome.trained]


def test_sync_trains_all_b_after_the_longest():
    s = Scheduler(ScheduleConfig(policy="sync", batch=3, max_new_tokens=50, check_tokens=4))
    plan, out, rounds = run_step(s, {0: 9, 1: 2, 2: 5})
    assert plan.delta == 0 and plan.chunk == 0 and not plan.streaming
    assert ids(out) == [1, 2, 0]  # finish order
    assert rounds == 1  # no mid-generation decision: one round until every budget is spent
    assert out.carried == () and out.record.finished == 3


def test_overcommit_b4_delta2_scenario():
    """B=4, Δ=2, cap 10, check every 2 tokens: lengths decide who trains and who is carried."""
    cfg = ScheduleConfig(policy="inter", batch=4, delta="2", max_new_tokens=10, check_tokens=2)
    s = Scheduler(cfg)
    lengths = {0: 12, 1: 9, 2: 8, 3: 4, 4: 5, 5: 1, 6: 2, 7: 1, 8: 3, 9: 12}
    plan, out, _ = run_step(s, lengths)
    assert plan.active == (0, 1, 2, 3, 4, 5) and plan.new == plan.active
    # after 8 tokens: 5 (1), 3 (4), 4 (5), 2 (8) finished -> B reached; 0 and 1 carried with 8 tokens each
    assert ids(out) == [5, 3, 4, 2]
    assert out.carried == (0, 1)
    assert {i: s.buffer.seqs[i].generated_tokens for i in out.carried} == {0: 8, 1: 8}

    plan, out, _ = run_step(s, lengths)
    assert plan.resumed == (0, 1) and plan.new == (6, 7, 8, 9)
    assert plan.budgets[0] == 2 and plan.budgets[1] == 2  # remaining budget, not a fresh one
    # one round of 2 tokens: after 1 token 1 (EOS at 9) and 7 finish, after 2 tokens 0 (cap 10) and 6;
    # equal times are broken by admission order. 8 and 9 are carried.
    assert ids(out) == [1, 7, 0, 6]
    assert [t.deferrals for t in out.trained] == [1, 0, 1, 0]
    assert [t.response_tokens for t in out.trained] == [9, 1, 10, 2]
    assert out.carried == (8, 9)


def test_extra_finished_sequences_are_kept_and_trained_first():
    s = Scheduler(ScheduleConfig(policy="inter", batch=2, delta="2", max_new_tokens=20, check_tokens=5))
    _, out, _ = run_step(s, {0: 3, 1: 2, 2: 4, 3: 20})
    assert ids(out) == [1, 0]  # 2 also finished in the same round but only B=2 are trained
    assert out.carried == (2, 3)
    plan, out, _ = run_step(s, {2: 4, 3: 20, 4: 1, 5: 1})
    assert plan.ready == (2,) and plan.resumed == (3,)
    assert ids(out) == [2, 4]


def test_starved_sequence_is_waited_for_and_trained_first():
    cfg = ScheduleConfig(policy="inter", batch=2, delta="1", max_new_tokens=100, check_tokens=5, max_deferrals=1)
    s = Scheduler(cfg)
    lengths = {0: 30, 1: 2, 2: 3, 3: 1, 4: 1, 5: 1}
    _, out, _ = run_step(s, lengths)
    assert ids(out) == [1, 2] and out.carried == (0,)
    plan, out, rounds = run_step(s, lengths)
    assert plan.resumed == (0,)
    assert rounds == 5  # waits for 0 (25 more tokens) although 3 and 4 finished in the first round
    assert ids(out) == [0, 3] and out.trained[0].deferrals == 1
    assert out.carried == (4,)


def test_tppo_window_pauses_and_trains_segments():
    cfg = ScheduleConfig(policy="tppo", batch=2, max_new_tokens=20, window_tokens=4, check_tokens=4)
    s = Scheduler(cfg)
    lengths = {0: 10, 1: 3, 2: 2}
    _, out, _ = run_step(s, lengths)
    assert [(t.seq_id, t.step_tokens, t.finished) for t in out.trained] == [(0, 4, False), (1, 3, True)]
    assert out.carried == (0,)
    plan, out, _ = run_step(s, lengths)
    assert plan.active == (0, 2) and plan.budgets == {0: 4, 2: 4}
    assert [(t.seq_id, t.step_tokens, t.finished) for t in out.trained] == [(0, 4, False), (2, 2, True)]
    _, out, _ = run_step(s, {**lengths, 3: 1})
    assert [(t.seq_id, t.response_tokens, t.finished) for t in out.trained] == [(0, 10, True), (3, 1, True)]


def test_streaming_uses_chunk_as_round():
    s = Scheduler(ScheduleConfig(policy="intra", batch=2, chunk="3", max_new_tokens=8))
    plan, out, rounds = run_step(s, {0: 8, 1: 1})
    assert plan.streaming and plan.chunk == 3 and plan.round_tokens == 3
    assert rounds == 3  # 3 + 3 + 2: the last round shrinks to the remaining budget


def test_protocol_errors():
    s = Scheduler(ScheduleConfig(policy="sync", batch=2, max_new_tokens=8))
    with pytest.raises(RuntimeError):
        s.report_round(0.0, 1, {})
    s.plan_step(0.0)
    with pytest.raises(RuntimeError):
        s.plan_step(0.0)
    with pytest.raises(ValueError, match="not running"):
        s.report_round(0.0, 1, {7: 1})
    with pytest.raises(ValueError, match="finished after"):
        s.report_round(0.0, 2, {0: 3})


def test_overcommit_checks_between_chunk_boundaries():
    """oppo: B finished is checked every check_tokens; a chunk streams every chunk tokens, and at the end."""
    cfg = ScheduleConfig(policy="oppo", batch=2, delta="1", chunk="8", check_tokens=2, max_new_tokens=40)
    s = Scheduler(cfg)
    s.plan_step(0.0)
    streamed, rounds = [], 0
    lengths = {0: 3, 1: 11, 2: 30}
    decoded = dict.fromkeys(lengths, 0)
    while not s.generation_done:
        n = s.next_round_tokens()
        finished = {}
        for i in s.running():
            if lengths[i] - decoded[i] <= n:
                finished[i] = lengths[i] - decoded[i]
            decoded[i] += min(n, lengths[i] - decoded[i])
        s.report_round(0.0, n, finished)
        rounds += 1
        streamed.append(s.stream_now)
    # 0 ends at 3, 1 at 11: B=2 reached in the round ending at token 12, not at the chunk boundary 16
    assert rounds == 6
    assert streamed == [False, False, False, True, False, True]  # chunk at 8, then the partial chunk at the end


def test_april_fixed_overprovisioning_resumes_unfinished_first():
    """APRIL: N' = B + delta_max prompts every step, stop at B finished, unfinished ones resume with their tokens."""
    s = Scheduler(ScheduleConfig(policy="april", batch=2, delta_max=2, delta_init=2, max_new_tokens=30, check_tokens=2))
    lengths = {0: 9, 1: 1, 2: 2, 3: 20, 4: 3, 5: 2, 6: 9, 7: 9}
    plan, out, _ = run_step(s, lengths)
    assert plan.delta == 2 and plan.active == (0, 1, 2, 3)
    assert ids(out) == [1, 2] and out.carried == (0, 3)  # checked at 2 tokens: 1 and 2 done
    plan, out, _ = run_step(s, lengths)
    assert plan.resumed == (0, 3) and plan.new == (4, 5) and plan.delta == 2  # Δ never adapts
    assert plan.budgets[0] == 28  # the cap minus the 2 tokens it already has
    assert ids(out) == [5, 4] and [t.policy_lag for t in out.trained] == [0, 0]


def test_tailbatch_aborts_long_prompts_and_runs_them_in_a_long_round():
    """RollPacker tail batching: short rounds over-provision and keep the first B; aborted prompts queue until a
    full batch of them runs alone, without over-provisioning, to the end."""
    s = Scheduler(
        ScheduleConfig(policy="tailbatch", batch=2, delta_max=2, delta_init=2, max_new_tokens=50, check_tokens=2)
    )
    lengths = {0: 30, 1: 1, 2: 2, 3: 40, 4: 1, 5: 25, 6: 2, 7: 2, 8: 1, 9: 1, 10: 1}
    plan, out, _ = run_step(s, lengths)
    assert plan.active == (0, 1, 2, 3) and ids(out) == [1, 2] and out.carried == ()
    assert list(s.long_queue) == [[0], [3]]  # aborted, their tokens discarded
    plan, out, _ = run_step(s, lengths)  # the queue holds B prompts: a long round of them, from scratch
    assert plan.long_round and plan.restarted == (0, 3) and plan.new == () and plan.delta == 0
    assert plan.budgets[0] == 50 and plan.prefix_tokens[0] == 0  # a fresh, on-policy sample
    assert ids(out) == [0, 3] and [t.response_tokens for t in out.trained] == [30, 40]
    assert [t.deferrals for t in out.trained] == [1, 1] and [t.policy_lag for t in out.trained] == [0, 0]
    plan, out, _ = run_step(s, lengths)  # short rounds again
    assert not plan.long_round and plan.new == (4, 5, 6, 7) and plan.delta == 2
    assert ids(out) == [4, 6] and out.carried == (7,) and list(s.long_queue) == [[5]]
    plan, _, _ = run_step(s, lengths)
    assert plan.ready == (7,)  # completed in the short round beyond B: trained next, not aborted


def test_tailbatch_long_round_leaves_completed_groups_for_the_next_short_round():
    s = Scheduler(
        ScheduleConfig(policy="tailbatch", batch=2, delta_max=2, delta_init=2, max_new_tokens=50, check_tokens=2)
    )
    lengths = {0: 1, 1: 1, 2: 1, 3: 30, 4: 1, 5: 30, 6: 1, 7: 1, 8: 1, 9: 1}
    _, out, _ = run_step(s, lengths)
    assert ids(out) == [0, 1] and out.carried == (2,) and list(s.long_queue) == [[3]]
    plan, out, _ = run_step(s, lengths)
    assert plan.ready == (2,) and ids(out) == [2, 4] and out.carried == (6,) and list(s.long_queue) == [[3], [5]]
    plan, out, _ = run_step(s, lengths)  # long round: the aborted prompts alone; 6 (complete) waits
    assert plan.long_round and plan.active == (3, 5) and plan.ready == () and ids(out) == [3, 5]
    assert out.carried == (6,)
    plan, out, _ = run_step(s, lengths)
    assert not plan.long_round and plan.ready == (6,) and ids(out)[0] == 6


def test_a_scheduler_following_a_record_makes_its_decisions_not_its_controllers():
    """Replaying a run: each step's Δ (the prompts over B admitted) and chunk are the record's, though the rewards
    here rise every step (the slope controller would raise Δ) and the chunk controller would explore 2 then 4."""
    cfg = ScheduleConfig(
        policy="oppo",
        batch=3,
        max_new_tokens=12,
        check_tokens=2,
        chunk_candidates=(2, 4),
        delta_init=1,
        delta_max=3,
        delta_window=1,
    )
    recorded = Decisions(deltas=(0, 3, 1, 2, 0), chunks=(4, 2, 2, 4, 4))
    s = Scheduler(cfg)
    s.follow(recorded)
    lengths = {i: 1 + (5 * i) % 11 for i in range(40)}
    plans = [run_step(s, lengths, reward=float(step))[0] for step in range(7)]
    assert [p.delta for p in plans] == [0, 3, 1, 2, 0, 0, 0]  # the record, then its last value held
    assert [p.chunk for p in plans] == [4, 2, 2, 4, 4, 4, 4]
    assert [len(p.new) for p in plans[:2]] == [3, 6]  # B + Δ in flight: step 0 carries nothing (Δ = 0)
    free = Scheduler(cfg)
    assert [run_step(free, lengths, reward=float(step))[0].delta for step in range(3)] == [1, 1, 2]  # its own
    with pytest.raises(ValueError, match="one Δ and one chunk size per step"):
        Decisions(deltas=(1, 2), chunks=(4,))


def test_a_pipelined_replay_makes_each_planned_steps_own_decision():
    """async plans step 1 before it closes step 0: the record's Δ for step 1 is made there (here a Δ the record
    gives an async step, 3 extra prompts admitted), not the last closed step's (step 0's, none)."""
    s = Scheduler(ScheduleConfig(policy="async", batch=3, max_new_tokens=12, check_tokens=2, staleness=1))
    s.follow(Decisions(deltas=(0, 3), chunks=(0, 0)))
    first = s.plan_step(0.0, version=0)
    finish_all(s, {i: 1 + i % 5 for i in range(20)}, first)
    s.finish_generation()
    second = s.plan_step(1.0, version=0)  # step 0 not closed yet
    assert (len(first.new), len(second.new)) == (3, 6)
