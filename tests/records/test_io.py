"""The record files' CSV: the fast ``%`` format writes the csv module's bytes, and falls back where it would not."""

import csv

import numpy as np
import pytest

from oppo.records.io import read_rows, write_rows
from oppo.records.schema import StepRecord, TraceRow, TrainedSeq

TRACE = [
    TraceRow(0, "gpu0", "actor", "decode", 0.0, 1 / 3, 512, 9000, 123456),
    TraceRow(0, "gpu1", "actor", "decode", 1e-17, 12345.678901234567, 1, 0, 0),
    TraceRow(1, "cpu1", "reward", "prefill", 2.5, 3, 7, 70, 0),  # an int in a float column: str == repr
]
TRAINED = [TrainedSeq(3, 17, 17, 1, 2, 1024, 512, True, 2), TrainedSeq(3, 18, 18, 3, 0, 7, 7, False, np.int64(0))]
STEPS = [StepRecord(0, 0.0, 12.5, 12.5, 0.1 + 0.2, 4, 0, 512, 3)]


def _csv_module(path, rows, cls):
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(cls._fields)
        writer.writerows(rows)


@pytest.mark.parametrize(
    "rows, cls",
    [
        (TRACE, TraceRow),
        (TRAINED, TrainedSeq),
        (STEPS, StepRecord),
        ([TraceRow(0, "gpu0", "actor, critic", "decode", 0.0, 1.0, 1, 1, 1)], TraceRow),  # quoted: falls back
        ([TraceRow(0, "gpu0", "actor", "decode", np.int64(2), 1.0, 1, 1, 1)], TraceRow),  # repr differs: falls back
        ([TraceRow(0, "gpu0", "actor", 'say "hi"', np.float64(2.5), 1.0, 1, 1, 1)], TraceRow),
        ([], TraceRow),
    ],
)
def test_rows_written_as_the_csv_module_writes_them(tmp_path, rows, cls):
    write_rows(tmp_path / "fast.csv", rows, cls)
    _csv_module(tmp_path / "csv.csv", rows, cls)
    assert (tmp_path / "fast.csv").read_bytes() == (tmp_path / "csv.csv").read_bytes()


def test_rows_read_back(tmp_path):
    write_rows(tmp_path / "trace.csv", TRACE, TraceRow)
    back = read_rows(tmp_path / "trace.csv", TraceRow)
    assert [tuple(r) for r in back] == [tuple(r) for r in TRACE]  # floats round-trip exactly (repr)


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "trace.csv"
    write_rows(path, TRACE, TraceRow)
    before = path.read_bytes()

    def rows():
        yield TRACE[0]
        raise RuntimeError("cut off")

    with pytest.raises(RuntimeError):
        write_rows(path, rows(), TraceRow)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["trace.csv"]
