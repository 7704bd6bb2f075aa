"""Mean staleness of asynchronous RL in closed form, from queueing arguments (a check on the simulator).

Terms: B groups a step, K the staleness bound, C groups generating at once (continuous admission), Q the queue
bound (groups in flight, finished or being trained; 0: none), T the trainer's seconds per step, L a group's
generation seconds (its longest sample), lambda = C / E[L] the groups the rollout finishes per second when it is
never held back (Little's law on the engine), and rho = T lambda / B the trainer's utilisation if it were never
starved. The lag of a sample is the number of versions published between its first token and its training.

**Rollout-bound** (rho < 1): the trainer takes a step every S = B / lambda seconds and publishes T later. A group
admitted after finish number i (one admission per finish) is, by Little's law, finished C finishes later on
average, whatever the length distribution; it waits for its batch to fill and is trained; counting the takes in
between with i uniform modulo B gives C / B, and the update published within the group's first T seconds of
life adds T / S = rho on average (admission times independent of the update times)::

    E[lag] = min(K, C / B + rho)

With a queue bound Q (0 < Q - B: the groups that may generate while a step trains), at most Q - B groups
generate ahead and no group waits behind more than Q / B - 1 takes::

    E[lag] = min(K, min(C, Q - B) / B + rho, Q / B - 1)     (Q = B: 0, generation waits for every update)

**Trainer-bound** (rho >= 1): the rollout keeps the queue full, so the bound that binds decides: groups admitted
when a step's B leave are trained after the (Q - 2B) / B steps queued ahead of them, or the K steps the staleness
bound lets through::

    E[lag] = min(K, Q / B - 1)        (Q = 0: K)

**Step-synchronous admission** (the executor's rollout workers: a step's B groups as one batch, the next once it
ends, newest weights): rollout-bound, a step is generated while the previous one trains, E[lag] = min(K, 1);
trainer-bound as above.

Assumptions, and where they stop holding (``docs/policies.md``): steady state (the first K steps have less lag);
lambda steady (a continuous-batching engine whose rate does not depend on how many groups run, or C fixed and
the engine always full); rho away from 1 (near 1 full batches also wait for the trainer, adding lag up to the
trainer-bound value); the bound K not binding often (C / B + rho well below K, and few groups so long that they
are waited for: the trainer then idles and rho falls); groups of one sample or of equal lengths within a group.
"""

from __future__ import annotations

ADMISSIONS = ("continuous", "step")
RHO_BAND = (0.8, 1.2)  # between these the trainer is near saturation: batches also queue for it


MIN_BATCH = 4  # below it a step's take coincides with one in B admissions often enough to bias the C / B term


def assumptions_hold(batch: int, staleness: int, rho: float, lag: float, step_s: float, group_p95_s: float) -> bool:
    """Whether the closed form's assumptions hold, conservatively: at least :data:`MIN_BATCH` groups a step (with
    B = 1-3 a take is one finish in B, not independent of the admissions: measured 1.07 against 1.30 at B = 1),
    rho outside :data:`RHO_BAND`, and, below it, the bound K slack enough that groups rarely wait for it:
    (K - the predicted lag) x S, the seconds a group may still take without being waited for, at least the 95th
    percentile of a group's generation seconds. A heuristic: with exponential generation times (a heavier tail than
    the lognormal of sigma 0.6 it was checked on) and the slack just above that percentile, the mean lag of the queue
    driven by events runs 0.2-0.7 versions above the closed form (B = 8, C = 16, rho = 0.3, K = 10: 2.5-3.0 against
    2.3; K = 20: 2.31; ``tests/core/test_async_queue.py``)."""
    if batch < MIN_BATCH or RHO_BAND[0] < rho < RHO_BAND[1]:
        return False
    return rho >= 1 or (staleness - lag) * step_s >= group_p95_s


def utilization(batch: int, train_s: float, concurrency: int, group_s: float) -> float:
    """rho = T lambda / B with lambda = C / E[L]: ``train_s`` the trainer's seconds per step, ``group_s`` the mean
    seconds a group generates, ``concurrency`` the groups generating at once.

    >>> utilization(batch=8, train_s=30.0, concurrency=16, group_s=200.0)  # 30 s x 16 / 200 s / 8
    0.3
    """
    if min(batch, train_s, concurrency, group_s) <= 0:
        raise ValueError("utilization needs batch, train_s, concurrency and group_s > 0")
    return train_s * concurrency / group_s / batch


def mean_lag(
    batch: int, staleness: int, rho: float, concurrency: int = 0, queue_groups: int = 0, admission: str = "continuous"
) -> float:
    """Steady-state mean lag (versions) of the trained samples' first tokens; see the module doc.
    ``concurrency`` is needed for continuous admission only.

    Rollout-bound, 16 groups generating for steps of 8, the trainer busy 30% of the time: C / B + rho = 2.3, under
    a bound of 4; a bound of 2 binds; trainer-bound, the bound decides:

    >>> mean_lag(batch=8, staleness=4, rho=0.3, concurrency=16)
    2.3
    >>> mean_lag(batch=8, staleness=2, rho=0.3, concurrency=16)
    2.0
    >>> mean_lag(batch=8, staleness=4, rho=1.5)
    4.0
    """
    if admission not in ADMISSIONS:
        raise ValueError(f"unknown admission {admission!r}; choose from {', '.join(ADMISSIONS)}")
    if batch < 1 or staleness < 0 or rho < 0 or queue_groups < 0:
        raise ValueError("mean_lag needs batch >= 1, staleness >= 0, rho >= 0 and queue_groups >= 0")
    if rho >= 1:
        return float(min(staleness, queue_groups / batch - 1)) if queue_groups else float(staleness)
    if admission == "step":
        return float(min(staleness, 1))
    if concurrency < 1:
        raise ValueError("continuous admission needs concurrency >= 1")
    if not queue_groups:
        return min(float(staleness), concurrency / batch + rho)
    ahead = min(concurrency, queue_groups - batch)  # groups generating while a step trains
    if ahead <= 0:
        return 0.0  # generation waits for every update
    return min(float(staleness), ahead / batch + rho, queue_groups / batch - 1)
