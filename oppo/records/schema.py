"""The record schema shared by the simulator and the executor (docs/design.md section 4).

Files of a run directory (written by :mod:`oppo.records.io`, summarised by :mod:`oppo.records.metrics`):
- ``trace.csv``: one :class:`TraceRow` per executed operation;
- ``steps.csv``: one :class:`StepRecord` per step;
- ``sequences.csv``: one :class:`TrainedSeq` per trained sequence (source of the deferral histogram);
- ``summary.json``: :func:`oppo.records.metrics.summarize` of the above plus the config;
- ``trace.json``: the operations as a Perfetto timeline (:mod:`oppo.records.perfetto`).

The three record types are ``NamedTuple``s: immutable like frozen dataclasses and about four times cheaper to
create (a 1000-step simulation at B = 512 on 8 GPUs has ~800k records). The scheduler hands its trained sequences
over by column (:class:`TrainedColumns`, read as ``TrainedSeq``s): half a million of them in such a simulation,
never one tuple each.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from operator import eq
from typing import NamedTuple

PHASES = ("decode", "prefill", "score", "train_actor", "train_critic", "sync", "other")


HOST = "host"  # the device of work on the driver's CPU (a rule reward scoring), not a model's device


def engine_lane(device: str, engine: str) -> str:
    """The lane of a rollout engine's own iterations beside ``device``'s (its process, e.g. ``cpu0/vllm``,
    ``cuda:0/vllm``: a slash, which no device name holds)."""
    return f"{device}/{engine}"


def on_engine(device: str) -> bool:
    """Whether a trace row's device is a rollout engine's lane (:func:`engine_lane`), not a trainer's device."""
    return "/" in device


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


_new_trained = partial(tuple.__new__, TrainedSeq)  # a TrainedSeq from a tuple in field order, no Python call
_TRAINED_FIELDS = {name: k for k, name in enumerate(TrainedSeq._fields)}


class TrainedColumns(Sequence[TrainedSeq]):
    """Trained-sequence records held by column, one list per :class:`TrainedSeq` field (in field order), read as a
    sequence of ``TrainedSeq`` built on access. Compares equal to any sequence of the same records. A run's log
    grows by :meth:`extend` (which copies what it is given); ``copy.copy`` copies the columns; the constructor and
    :meth:`of` hold what they are given."""

    __slots__ = ("columns",)

    def __init__(self, columns: Sequence[list] | None = None) -> None:
        """``columns``: one list per field, in field order, of one length (held, not copied), or None: no records.
        Records one by one go through :meth:`of`."""
        columns = [[] for _ in TrainedSeq._fields] if columns is None else list(columns)
        if (
            len(columns) != len(TrainedSeq._fields)
            or not all(type(c) is list for c in columns)
            or len(set(map(len, columns))) > 1
        ):
            raise ValueError(
                f"TrainedColumns takes {len(TrainedSeq._fields)} lists of one length, one per TrainedSeq field "
                "(records one by one: TrainedColumns.of)"
            )
        self.columns = columns

    @classmethod
    def of(cls, records: Iterable[TrainedSeq]) -> TrainedColumns:
        """The records given one by one (already by column: returned as they are)."""
        if isinstance(records, TrainedColumns):
            return records
        rows = list(records)
        return cls([list(c) for c in zip(*rows, strict=True)] if rows else None)

    def __copy__(self) -> TrainedColumns:
        return TrainedColumns([list(c) for c in self.columns])

    def column(self, name: str) -> list:
        """Every record's ``name`` field, in record order (the list held: do not change it)."""
        return self.columns[_TRAINED_FIELDS[name]]

    def tuples(self) -> Iterator[tuple]:
        """The records as plain tuples in field order (``zip`` reuses each one once it is released)."""
        return zip(*self.columns)

    def extend(self, records: Iterable[TrainedSeq]) -> None:
        for mine, theirs in zip(self.columns, TrainedColumns.of(records).columns):
            mine += theirs

    def __len__(self) -> int:
        return len(self.columns[0])

    def __getitem__(self, index):
        if isinstance(index, slice):
            return TrainedColumns([c[index] for c in self.columns])
        return _new_trained([c[index] for c in self.columns])

    def __iter__(self) -> Iterator[TrainedSeq]:
        return map(_new_trained, zip(*self.columns))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TrainedColumns):
            return self.columns == other.columns
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(map(eq, self, other))
        return NotImplemented

    __hash__ = None  # mutable, like a list

    def __repr__(self) -> str:
        return f"TrainedColumns({list(self)!r})"
