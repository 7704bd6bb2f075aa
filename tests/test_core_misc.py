import argparse
import gzip
import json
import subprocess
import sys

import pytest

from oppo import ScheduleConfig
from oppo.cli import add_config_args, given_options
from oppo.lengths import load_lengths
from oppo.metrics import deferral_histogram, summarize, utilization
from oppo.record_io import read_rows, write_run
from oppo.records import StepRecord, TraceRow, TrainedSeq


def test_core_import_pulls_no_backend():
    code = (
        "import sys, oppo, oppo.scheduler, oppo.records, oppo.lengths, oppo.cli;"
        "bad = {'torch', 'simpy', 'transformers', 'ray', 'oppo.sim', 'oppo.exec'} & set(sys.modules);"
        "print(sorted(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch": 0}, "batch must be > 0"),
        ({"policy": "fast"}, "unknown policy"),
        ({"delta_min": 5, "delta_max": 2, "delta_init": 2}, "delta bounds reversed"),
        ({"chunk": "0"}, "chunk must be > 0"),
        ({"chunk": "big"}, "chunk must be an integer"),
        ({"delta": "-1"}, "delta must be >= 0"),
        ({"policy": "inter", "batch": 4, "delta": "5"}, "Δ must be <= B"),
        ({"max_deferrals": 0}, "max_deferrals must be >= 1"),
        ({"streamed_scorers": ("judge",)}, "unknown streamed_scorers"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ScheduleConfig(**kwargs)


def test_cli_from_config():
    parser = argparse.ArgumentParser()
    add_config_args(parser, ScheduleConfig)
    args = parser.parse_args(["--batch", "12", "--chunk-candidates", "8,16", "--delta", "3"])
    cfg = ScheduleConfig(**given_options(ScheduleConfig, args))
    assert cfg.batch == 12 and cfg.chunk_candidates == (8, 16) and cfg.fixed_delta == 3
    assert cfg.max_new_tokens == ScheduleConfig().max_new_tokens
    assert "prompt groups trained per step" in parser.format_help()


@pytest.mark.parametrize(
    "raised, code, stderr",
    [
        ("ValueError('unknown setup x; choose from a, b')", 2, "error: unknown setup x; choose from a, b\n"),
        ("FileNotFoundError('lengths file not found: x.csv')", 2, "error: lengths file not found: x.csv\n"),
        ("KeyError(17)", 1, "KeyError: 17"),  # a bug: its traceback, not a user error
        ("AttributeError('no')", 1, "AttributeError: no"),
    ],
)
def test_run_cli_one_line_for_bad_input_traceback_for_a_bug(raised, code, stderr):
    script = f"import sys; from oppo.cli import run_cli\ndef main(argv): raise {raised}\nsys.exit(run_cli(main))"
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert res.returncode == code
    if code == 2:
        assert res.stderr == stderr
    else:
        assert "Traceback (most recent call last)" in res.stderr and res.stderr.rstrip().endswith(stderr)


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


def test_lengths_plain_and_gzip(tmp_path):
    text = "model,prompt_tokens,response_tokens\na,3,10\nb,4,20\n"
    (tmp_path / "l.csv").write_text(text)
    with gzip.open(tmp_path / "l.csv.gz", "wt") as fh:
        fh.write(text)
    for name in ("l.csv", "l.csv.gz"):
        trace = load_lengths(tmp_path / name)
        assert trace.response_tokens.tolist() == [10, 20] and trace.prompt_tokens.tolist() == [3, 4]
    assert load_lengths(tmp_path / "l.csv", model="b").response_tokens.tolist() == [20]


@pytest.mark.parametrize(
    "text, message",
    [
        ("tokens\n1\n", "needs a 'response_tokens' column"),
        ("response_tokens\n", "needs a 'response_tokens' column"),
        ("response_tokens\n-3\n", "non-negative integer"),
        ("response_tokens\n5\ninf\n", "non-negative integer"),  # float('inf') parses; int() of it would not
        ("response_tokens\n1e400\n", "non-negative integer"),
        ("response_tokens\nabc\n", "non-numeric"),
        ("response_tokens\n\n5\n", None),  # csv skips blank lines
        ("response_tokens,x\n,1\n", "empty value"),
    ],
)
def test_lengths_errors(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    if message is None:
        assert load_lengths(path).response_tokens.tolist() == [5]
    else:
        with pytest.raises(ValueError, match=message):
            load_lengths(path)
    with pytest.raises(FileNotFoundError):
        load_lengths(tmp_path / "missing.csv")


def test_trace_events_one_lane_per_device_and_whole_steps():
    from oppo.perfetto import trace_events

    rows = [
        TraceRow(s, d, "actor", "decode", s + 0.1 * i, s + 0.1 * i + 0.05, 4, 4, 0)
        for s in range(3)
        for i, d in enumerate(["gpu0", "gpu1", "gpu10", "gpu2"])
    ]
    events = trace_events(rows, max_rows=9)
    lanes = {e["args"]["name"]: e["tid"] for e in events["traceEvents"] if e["ph"] == "M"}
    assert list(lanes) == ["gpu0", "gpu1", "gpu2", "gpu10"]  # numeric order, one lane each
    ops = [e for e in events["traceEvents"] if e["ph"] == "X"]
    assert events["otherData"] == {"steps": 2, "of": 3} and len(ops) == 8  # whole steps within the bound
    assert ops[0]["ts"] == 0.0 and ops[0]["dur"] == pytest.approx(0.05e6) and ops[0]["name"] == "actor/decode"


def test_stage_throughput_counts_a_group_operation_once():
    from oppo.metrics import stage_throughput

    rows = [TraceRow(0, f"gpu{g}", "actor", "train_actor", 0.0, 2.0, 8, 1000, 0) for g in range(2)]
    stages = stage_throughput(rows, {"actor": 10.0}, 100.0)
    assert stages["actor/train_actor"]["tokens_per_s"] == 500.0  # 1000 tokens in 2 s, not 2000
    assert stages["actor/train_actor"]["mfu"] == pytest.approx(3 * 10.0 * 1000 / (2.0 * 200.0))


def test_gpu_names_as_torch_prints_them():
    from oppo.gpus import gpu_by_device_name

    names = {"NVIDIA GH200 480GB": "gh200", "NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100"}
    assert {n: gpu_by_device_name(n).name for n in names} == names
    assert gpu_by_device_name("Some Other Card") is None
