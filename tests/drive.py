"""Drive the scheduling core with known response lengths (EOS at the given length), no clock."""

from __future__ import annotations

from oppo import Scheduler


def run_step(scheduler: Scheduler, lengths: dict[int, int], reward: float = 0.0, now: float = 0.0):
    """One step: ``lengths`` maps seq id -> its true response length (ids admitted this step are looked up)."""
    plan = scheduler.plan_step(now)
    rounds = finish_all(scheduler, lengths, plan, now)
    return plan, scheduler.close_step(now + 1.0, reward), rounds


def finish_all(scheduler: Scheduler, lengths: dict[int, int], plan, now: float = 0.0) -> int:
    """Decode the planned step's rounds until the scheduler stops generation; returns the rounds."""
    decoded = dict(plan.prefix_tokens)
    rounds = 0
    while not scheduler.generation_done:
        n = scheduler.next_round_tokens()
        finished = {}
        for seq_id in scheduler.running():
            k = min(n, scheduler.budget_left(seq_id))
            rest = lengths[seq_id] - decoded[seq_id]
            if rest <= k:
                finished[seq_id] = rest
            decoded[seq_id] += min(rest, k)
        scheduler.report_round(now, n, finished)
        rounds += 1
    return rounds
