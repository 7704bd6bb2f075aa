"""Metrics of a run's records: busy fractions, the deferral histogram, the summary, throughput per stage."""

import json

import pytest

from oppo.records.io import read_rows, write_run
from oppo.records.metrics import deferral_histogram, stage_throughput, summarize, utilization
from oppo.records.schema import StepRecord, TraceRow, TrainedSeq


def test_busy_union_and_histogram():
    # overlapping operations on one device count once: busy [0, 3) and [5, 6) of 10 s
    ops = [TraceRow(0, "gpu0", "actor", "decode", a, b, 1, 1, 0) for a, b in [(0, 2), (1, 3), (5, 6)]]
    assert utilization(ops, 10.0) == {"gpu0": 0.4}
    trained = [TrainedSeq(0, i, i, 0, d, 5, 5, True, d) for i, d in enumerate([0, 0, 0, 1])]
    assert deferral_histogram(trained) == {0: 0.75, 1: 0.25}


def test_records_roundtrip_and_summary(tmp_path):
    steps = [StepRecord(i, i * 2.0, i * 2.0 + 2, 2.0, 0.5 * i, 1, 0, 4, 1) for i in range(3)]
    trace = [
        TraceRow(0, "gpu0-6", "actor", "decode", 0.0, 3.0, 4, 40, 100),
        TraceRow(0, "gpu7", "reward", "prefill", 1.0, 4.0, 4, 40, 0),
    ]
    trained = [TrainedSeq(0, 0, 0, 0, 0, 10, 10, True, 0), TrainedSeq(1, 1, 1, 0, 1, 12, 2, True, 1)]
    summary = summarize("oppo", steps, trace, trained, {"schedule": {"batch": 4}}, wall_s=0.1)
    assert summary["utilization"] == {"gpu0-6": 0.5, "gpu7": 0.5}
    assert summary["mean_deferrals"] == 0.5 and summary["deferral_hist"] == {"0": 0.5, "1": 0.5}
    assert summary["mean_step_s"] == 2.0 and summary["total_s"] == 6.0 and summary["batch"] == 4
    write_run(tmp_path, steps, trace, trained, summary)
    assert read_rows(tmp_path / "steps.csv", StepRecord) == steps
    assert read_rows(tmp_path / "trace.csv", TraceRow) == trace
    assert read_rows(tmp_path / "sequences.csv", TrainedSeq) == trained
    assert json.loads((tmp_path / "summary.json").read_text())["policy"] == "oppo"


def test_stage_throughput_counts_a_group_operation_once():
    rows = [TraceRow(0, f"gpu{g}", "actor", "train_actor", 0.0, 2.0, 8, 1000, 0) for g in range(2)]
    stages = stage_throughput(rows, {"actor": 10.0}, 100.0)
    assert stages["actor/train_actor"]["tokens_per_s"] == 500.0  # 1000 tokens in 2 s, not 2000
    assert stages["actor/train_actor"]["mfu"] == pytest.approx(3 * 10.0 * 1000 / (2.0 * 200.0))
