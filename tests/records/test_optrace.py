"""A trace of grouped operations reads, writes and plots as the per-device rows it stands for."""

import csv

import numpy as np
import pytest

from oppo.records.io import write_rows
from oppo.records.optrace import OpTrace, devices_of, rows_of_steps, rows_per_step
from oppo.records.perfetto import trace_events
from oppo.records.schema import TraceRow

OPS = [
    (0, ["gpu0", "gpu1"], "actor", "prefill", 0, [0.5, 0.5], 4, 400, 0),  # an int start: repr == str
    (0, ["gpu0", "gpu1"], "actor", "decode", 0.5, [0.75, 1 / 3 + 0.5], 4, 16, 800),  # members end apart
    (0, ["gpu2"], "reward", "prefill", 0.5, [0.625], 4, 16, 0),
    (1, ["gpu0", "gpu1"], "actor", "train_actor", 1.25, [2.0, 2.0], 4, 816, 0),
    (2, ["gpu2"], "reward", "score", 12345.678901234567, [12346.0], 2, 10, 0),
]


def _rows(ops):
    return [
        TraceRow(s, d, r, p, start, end, b, t, c)
        for s, ds, r, p, start, ends, b, t, c in ops
        for d, end in zip(ds, ends)
    ]


def _csv_module(path, rows):
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(TraceRow._fields)
        writer.writerows(rows)


def test_reads_as_its_rows():
    trace, rows = OpTrace(list(OPS)), _rows(OPS)
    assert len(trace) == len(rows) == 8 and list(trace) == rows and trace[3] == rows[3] and trace == rows
    assert trace != tuple(rows)  # compares as a list does
    trace.ops.append((3, ["gpu0"], "actor", "sync", 3.0, [3.5], 0, 0, 0))  # recorded after a read: read too
    assert len(trace) == 9 and trace[-1] == TraceRow(3, "gpu0", "actor", "sync", 3.0, 3.5, 0, 0, 0)


@pytest.mark.parametrize(
    "ops, fast",
    [
        (OPS, True),
        ([(0, ["gpu0"], "actor, critic", "decode", 0.0, [1.0], 1, 1, 1)], False),  # quoted by the csv module
        ([(0, ["gpu0", "gpu1"], "actor", "decode", np.float64(2.5), [3.0, 3.0], 1, 1, 1)], False),  # numpy repr
        ([(0, ["gpu0"], "actor", "decode", 0.0, [np.float64(1.5)], 1, 1, 1)], False),
        ([(0, ["gpu0", "gpu1"], "actor", "decode", 0.0, [1, 1.0], 1, 1, 1)], True),  # equal ends, unequal reprs
        ([], True),
    ],
)
def test_written_as_the_csv_module_writes_its_rows(tmp_path, ops, fast):
    assert (OpTrace(list(ops)).csv_lines() is not None) == fast  # formatted from the operations, or by the module
    write_rows(tmp_path / "ops.csv", OpTrace(list(ops)), TraceRow)
    _csv_module(tmp_path / "csv.csv", _rows(ops))
    assert (tmp_path / "ops.csv").read_bytes() == (tmp_path / "csv.csv").read_bytes()


def test_step_queries_match_the_rows():
    trace, rows = OpTrace(list(OPS)), _rows(OPS)
    assert rows_per_step(trace) == rows_per_step(rows) == {0: 5, 1: 2, 2: 1}
    assert devices_of(trace) == devices_of(rows) == {"gpu0", "gpu1", "gpu2"}
    assert rows_of_steps(trace, {0, 2}) == rows_of_steps(rows, {0, 2}) == [r for r in rows if r.step != 1]
    assert not trace._rows  # answered from the operations: no row built
    assert trace_events(trace, max_rows=6) == trace_events(rows, max_rows=6)
