"""A trace recorded once per operation of a device group, read as one :class:`TraceRow` per device.

A data-parallel group of GPUs runs each operation in lockstep, so the simulator records it once, with each
member's end time (~300k rows but ~45k operations in a 1000-step run at B = 512 on 8 GPUs). Read as a sequence it
is the per-GPU trace, built on first read. The run's files read the operations instead: ``trace.csv`` formats each
operation's shared fields once (:meth:`OpTrace.csv_lines`), the timeline and ``trace.json`` build the rows of the
steps they show only (:func:`rows_of_steps`, :func:`rows_per_step`, :func:`devices_of` take any trace).
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from itertools import chain, compress, repeat
from operator import itemgetter

from oppo.records.schema import TraceRow

CSV_SPECIAL = frozenset(',"\r\n')  # a field holding one of these is quoted by the csv module
_new_row = partial(tuple.__new__, TraceRow)  # a TraceRow from a tuple in field order, no Python call
_STEP, _MEMBERS, _ENDS = itemgetter(0), itemgetter(1), itemgetter(5)


class OpTrace(Sequence[TraceRow]):
    """The per-device rows of ``ops``, a list of operations appended as they run: ``(step, member devices, role,
    phase, start_s, each member's end_s, batch_size, num_tokens, context_tokens)`` (lists of equal length for
    the members and their ends). The list may grow between reads; rows are built for the new operations only."""

    def __init__(self, ops: list[tuple]) -> None:
        self.ops = ops
        self._rows: list[TraceRow] = []
        self._expanded_ops = 0  # operations already in _rows

    def rows(self) -> list[TraceRow]:
        """Every operation's rows, one per member, in the order the operations were recorded."""
        if self._expanded_ops < len(self.ops):
            with cycle_collector_paused():  # ~300k new tuples in a long run
                self._rows += _expanded(self.ops[self._expanded_ops :])
            self._expanded_ops = len(self.ops)
        return self._rows

    def __len__(self) -> int:
        return sum(map(len, map(_MEMBERS, self.ops)))

    def __getitem__(self, index):
        return self.rows()[index]

    def __iter__(self) -> Iterator[TraceRow]:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:  # as a list of its rows compares
        return isinstance(other, list | OpTrace) and self.rows() == list(other)

    __hash__ = None  # mutable, like a list

    def csv_lines(self) -> Iterator[str] | None:
        """The rows as ``trace.csv`` lines, as the csv module writes them (see :func:`oppo.records.io.write_rows`):
        each operation's shared fields formatted once, its members' ends by ``repr``. None where the module would
        write differently: a time that is not a float or int (numpy's repr differs from its str), or a name holding
        a comma, quote or line break."""
        ops = self.ops
        end_types = set(map(type, chain.from_iterable(map(_ENDS, ops))))
        names = {*chain.from_iterable(map(_MEMBERS, ops)), *map(itemgetter(2), ops), *map(itemgetter(3), ops)}
        if not set(map(type, map(itemgetter(4), ops))) | end_types <= {float, int} or not all(
            isinstance(n, str) and CSV_SPECIAL.isdisjoint(n) for n in names
        ):
            return None
        return _op_lines(ops, shared_ends=end_types <= {float})  # 1 == 1.0, but their reprs differ


def _op_lines(ops: list[tuple], shared_ends: bool) -> Iterator[str]:
    for step, members, role, phase, start, ends, batch, tokens, context in ops:
        head, tail = f"{step},", f",{role},{phase},{start!r},"
        rest = f",{batch},{tokens},{context}\r\n"
        if shared_ends and ends.count(ends[0]) == len(ends):  # members end together: the device alone varies
            shared = f"{tail}{ends[0]!r}{rest}"
            yield from (head + member + shared for member in members)
        else:
            yield from (f"{head}{member}{tail}{end!r}{rest}" for member, end in zip(members, ends))


def _expanded(ops: list[tuple]) -> list[TraceRow]:
    """The TraceRows of recorded operations, built column by column in C: a group's fields repeated once per
    member, its members and end times chained."""
    counts = list(map(len, map(_MEMBERS, ops)))  # rows per operation

    def repeated(k: int):
        return chain.from_iterable(map(repeat, map(itemgetter(k), ops), counts))

    def chained(k: int):
        return chain.from_iterable(map(itemgetter(k), ops))

    columns = (repeated(0), chained(1), repeated(2), repeated(3), repeated(4), chained(5))
    return list(map(_new_row, zip(*columns, repeated(6), repeated(7), repeated(8))))


def rows_per_step(trace: Sequence[TraceRow]) -> Counter:
    """Rows of each step (counted over the operations of an :class:`OpTrace`, no rows built)."""
    if isinstance(trace, OpTrace):
        counts: Counter = Counter()
        for step, members in zip(map(_STEP, trace.ops), map(_MEMBERS, trace.ops)):
            counts[step] += len(members)
        return counts
    return Counter(map(_STEP, trace))  # column 0, counted in C


def devices_of(trace: Sequence[TraceRow]) -> set[str]:
    """Every device the trace has a row on."""
    if isinstance(trace, OpTrace):
        return set(chain.from_iterable(map(_MEMBERS, trace.ops)))
    return set(map(itemgetter(1), trace))


def rows_of_steps(trace: Sequence[TraceRow], steps: Collection[int]) -> list[TraceRow]:
    """The rows of these steps, in trace order (an :class:`OpTrace` builds these rows only)."""
    if isinstance(trace, OpTrace):
        return _expanded(list(compress(trace.ops, map(steps.__contains__, map(_STEP, trace.ops)))))
    return list(compress(trace, map(steps.__contains__, map(_STEP, trace))))


@contextmanager
def cycle_collector_paused():
    """Building hundreds of thousands of records makes next to no reference cycles: left on, Python's cyclic
    garbage collector rescans the growing record lists again and again (~20% of a 1000-step B = 512
    simulation). Memory is still freed by reference counting; the collector runs again afterwards if it ran
    before (nested pauses, such as a ``run`` command's around its simulation's, restore it once, at the outer)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
