"""The record schema shared by the simulator and the executor (docs/design.md section 4).

Files of a run directory (written by :mod:`oppo.record_io`, summarised by :mod:`oppo.metrics`):
- ``trace.csv``: one :class:`TraceRow` per executed operation;
- ``steps.csv``: one :class:`StepRecord` per step;
- ``sequences.csv``: one :class:`TrainedSeq` per trained sequence (source of the deferral histogram);
- ``summary.json``: :func:`oppo.metrics.summarize` of the above plus the config;
- ``trace.json``: the operations as a Perfetto timeline (:mod:`oppo.perfetto`).

The three record types are ``NamedTuple``s: immutable like frozen dataclasses and about four times cheaper to
create (a 1000-step simulation at B = 512 on 8 GPUs makes ~800k of them).
"""

from __future__ import annotations

from typing import NamedTuple

PHASES = ("decode", "prefill", "score", "train_actor", "train_critic", "sync", "other")


class TraceRow(NamedTuple):
    """One operation on one device. Times in seconds from the run's start; tokens are counts, not ids."""

    step: int
    device: str  # e.g. "gpu0-6" (a data-parallel group of GPUs 0..6), "cpu1"
    role: str  # actor, critic, reference, reward
    phase: str  # one of PHASES
    start_s: float
    end_s: float
    batch_size: int  # sequences in the operation
    num_tokens: int  # tokens processed (decoded, prefilled or trained)
    context_tokens: int  # tokens already in the KV cache / attended to, summed over the batch


class StepRecord(NamedTuple):
    step: int
    start_s: float
    end_s: float
    step_s: float
    mean_reward: float
    delta: int  # Δ used this step (prompts over-committed)
    chunk: int  # streamed chunk size in tokens; 0 = not streamed
    finished: int  # trained sequences that are complete
    deferred: int  # sequences carried to the next step


class TrainedSeq(NamedTuple):
    step: int
    seq_id: int
    group_id: int  # its prompt group (G samples of one prompt); equal to seq_id without group sampling
    admitted_step: int
    deferrals: int  # steps it waited beyond its admission step
    response_tokens: int  # response length so far (final length when finished)
    step_tokens: int  # tokens decoded during the step it was trained in
    finished: bool  # False only for T-PPO segments of unfinished sequences
    policy_lag: int  # policy versions between the weights that generated its first token and the trained ones
