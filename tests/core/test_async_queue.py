"""The continuous-admission queue of asynchronous RL (oppo.core.async_queue) and the closed-form mean lag
(oppo.core.staleness): scripted scenarios and invariants."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oppo.core.async_queue import GroupQueue
from oppo.core.staleness import assumptions_hold, mean_lag, utilization


def test_admission_stops_at_the_bound_and_steps_take_the_oldest_first():
    q = GroupQueue(batch=2, staleness=1)
    admitted = []
    while q.can_admit():
        admitted.append(q.admit(len(admitted)))
    assert admitted == [0, 0, 0, 0]  # (K + 1) x B groups of version 0: steps 0 and 1 can train them
    for g in (3, 2):  # the later ones finish first
        q.finish(g)
    assert q.ready()  # nothing left behind is late: groups 0 and 1 can still go to step 1
    assert q.take() == [(3, 0), (2, 0)] and q.training == 2
    assert not q.can_admit()  # during step 0, steps 1..1 can train at most 2 groups: 0 and 1
    q.publish()
    assert q.version == 1 and q.can_admit()
    q.admit(4)
    q.finish(4)
    q.finish(0)
    assert not q.ready()  # taking 4 would leave group 1 (due now, still generating) late
    q.finish(1)
    assert q.take() == [(0, 0), (1, 0)]  # the oldest versions first, then finish order


def test_queue_groups_and_concurrency_bound_admission():
    q = GroupQueue(batch=2, staleness=3, queue_groups=3, concurrency=2)
    q.admit(0)
    q.admit(1)
    assert not q.can_admit()  # two generating at once
    q.finish(0)
    q.admit(2)
    assert not q.can_admit()  # three in flight or finished: the queue is full
    with pytest.raises(ValueError, match="cannot hold"):
        GroupQueue(batch=4, staleness=1, queue_groups=3)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(0, 3),
    st.integers(0, 3),  # queue_groups in batches (0: unbounded)
    st.integers(0, 6),
    st.lists(st.integers(0, 1000), min_size=200, max_size=200),
)
def test_every_taken_group_is_within_the_bound_and_the_queue_never_deadlocks(batch, k, q_batches, conc, draws):
    """Random finish orders (the draws pick which running group finishes, or whether the trainer acts): a step
    never trains a group more than K versions old, the queue and concurrency bounds hold, and something can
    always move."""
    q = GroupQueue(batch, k, q_batches * batch, conc)
    next_id, steps = 0, 0
    for draw in draws:
        while q.can_admit():
            q.admit(next_id)
            next_id += 1
        assert not q.queue_groups or q.untaken + q.training <= q.queue_groups
        assert not q.concurrency or len(q.in_flight) <= q.concurrency
        if q.training:
            q.publish()
        elif q.ready() and draw % 3 == 0:
            for _, version in q.take():
                assert steps - version <= k
            steps += 1
        elif q.in_flight:
            q.finish(list(q.in_flight)[draw % len(q.in_flight)])
        else:
            assert q.ready(), "nothing generating, nothing trainable: deadlock"
    assert steps > 0


def test_closed_form_regimes():
    assert mean_lag(8, 4, 0.3, concurrency=8) == pytest.approx(1.3)  # C / B + rho
    assert mean_lag(8, 1, 0.3, concurrency=16) == 1  # capped by K
    assert mean_lag(8, 3, 2.0) == 3  # trainer-bound: the bound that binds
    assert mean_lag(8, 3, 2.0, queue_groups=24) == 2  # Q / B - 1
    assert mean_lag(8, 3, 0.5, admission="step") == 1
    assert mean_lag(8, 0, 0.5, concurrency=8) == 0
    assert utilization(8, 2.0, 16, 4.0) == pytest.approx(1.0)
    assert mean_lag(8, 4, 0.3, concurrency=8, queue_groups=16) == 1  # Q / B - 1
    assert mean_lag(8, 4, 0.3, concurrency=8, queue_groups=8) == 0  # Q = B: no generation during a step
    assert not assumptions_hold(8, 4, 0.9, 1.0, 1.0, 0.1)  # near saturation
    assert assumptions_hold(8, 4, 0.3, 1.3, 1.0, 2.0) and not assumptions_hold(8, 4, 0.3, 1.3, 1.0, 3.0)
    assert not assumptions_hold(2, 4, 0.3, 1.3, 1.0, 2.0)  # a take is one in B finishes
    with pytest.raises(ValueError, match="unknown admission"):
        mean_lag(8, 1, 0.5, 8, admission="later")
