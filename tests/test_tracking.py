"""Experiment tracking (``--tensorboard``, ``--mlflow``, ``--wandb``) read back with the trackers' own readers, and
every run's provenance in ``config.json``."""

import argparse
import csv
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from oppo.records.provenance import git_commit, provenance
from oppo.records.stored_config import load_stored_config
from oppo.records.tracking import trackers_from
from tests import invoke

tensorboard = pytest.importorskip("tensorboard")
mlflow = pytest.importorskip("mlflow")


def cli(module: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    return invoke.invoke(module, *args, cwd=cwd)


def steps_column(run_dir, column: str) -> list[tuple[int, float]]:
    with open(run_dir / "steps.csv", newline="") as fh:
        return [(int(row["step"]), float(row[column])) for row in csv.DictReader(fh)]


def mlflow_run(store):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("oppo").experiment_id])
    return client, run


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tracked")
    args = ("run", "--steps", "6", "--batch", "32", "--out", str(root / "run"))
    res = cli("oppo.sim", *args, "--tensorboard", str(root / "tb"), "--mlflow", str(root / "ml"), cwd=root)
    assert res.returncode == 0, res.stderr
    return root


def test_tensorboard_holds_the_steps_the_summary_the_config_and_the_plots(sim_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(sim_run / "tb" / "run"), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    expected = steps_column(sim_run / "run", "step_s")
    got = [(e.step, e.value) for e in acc.Scalars("steps/step_s")]
    assert [s for s, _ in got] == [s for s, _ in expected]
    # TensorBoard stores float32: relative 1e-6
    assert all(v == pytest.approx(w, rel=1e-6) for (_, v), (_, w) in zip(got, expected))
    summary = json.loads((sim_run / "run" / "summary.json").read_text())
    assert acc.Scalars("summary/mean_step_s")[0].value == pytest.approx(summary["mean_step_s"], rel=1e-6)
    assert {"plots/timeline", "plots/rewards"} <= set(acc.Tags()["images"])
    text = acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert "schedule.policy = oppo" in text and "provenance.commit" in text


def test_mlflow_holds_the_steps_the_summary_the_config_and_the_plots(sim_run):
    client, run = mlflow_run(sim_run / "ml")
    history = client.get_metric_history(run.info.run_id, "steps/mean_reward")
    expected = steps_column(sim_run / "run", "mean_reward")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == expected  # float64: exact
    summary = json.loads((sim_run / "run" / "summary.json").read_text())
    assert run.data.metrics["summary/samples_per_s"] == summary["samples_per_s"]
    assert run.data.params["schedule.policy"] == "oppo" and run.data.params["steps"] == "6"
    assert run.data.tags["backend"] == "sim" and run.info.run_name == "run"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert {"plots/timeline.png", "plots/rewards.png"} <= artifacts


def test_trackers_are_off_by_default(tmp_path):
    res = cli("oppo.sim", "run", "--steps", "2", "--batch", "16", "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert not list((tmp_path / "run").glob("events.*"))


def test_executor_run_is_tracked_with_its_training_metrics(tmp_path):
    args = ("--preset", "tiny-cpu", "--policy", "sync", "--steps", "2", "--batch", "2", "--out", str(tmp_path / "exec"))
    res = cli("oppo.exec.train", *args, "--mlflow", str(tmp_path / "ml"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    client, run = mlflow_run(tmp_path / "ml")
    assert run.data.tags["backend"] == "exec"
    losses = client.get_metric_history(run.info.run_id, "metrics/mean_reward")
    assert sorted(m.step for m in losses) == [0, 1]
    assert run.data.params["schedule.policy"] == "sync"


def wandb_records(path) -> list[bytes]:
    """The records of a W&B transaction log (``run-*.wandb``), read with the format's spec rather than a private
    W&B module (those move between releases): a 7-byte file header (``:W&B``, magic 0xBEE1, version 0), then
    LevelDB's log format: 32 KiB blocks of chunks, each a 7-byte header (CRC32, length as uint16 LE, type 1 full,
    2 first, 3 middle, 4 last) and its bytes; a block's tail shorter than a header is zero padding."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), "not a W&B transaction log"
    block, at, records, parts = 32768, 7, [], []
    while at + 7 <= len(data):
        if block - at % block < 7:  # padding at the end of a block
            at += block - at % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[at : at + 7])
        if kind == 0:  # preallocated, never written
            break
        parts.append(data[at + 7 : at + 7 + length])
        at += 7 + length
        if kind in (1, 4):
            records.append(b"".join(parts))
            parts = []
    return records


def wandb_history(run_dir) -> tuple[dict[int, dict], dict]:
    """Each step's logged values and the summary of the offline W&B run under ``run_dir/wandb``, read back from its
    record file and parsed with W&B's own protobuf schema."""
    from wandb.proto import wandb_internal_pb2

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    history, summary = {}, {}
    for data in wandb_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            values = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item
            }
            history[values.pop("_step")] = values
        elif kind == "summary":
            summary |= {u.key or "/".join(u.nested_key): u.value_json for u in record.summary.update}
    return history, summary


def test_an_executor_run_logs_each_step_as_it_closes_to_tensorboard_and_wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline: nothing leaves the machine
    run = tmp_path / "exec"
    args = ("--preset", "tiny-cpu", "--policy", "sync", "--steps", "3", "--batch", "2", "--out", str(run))
    res = cli("oppo.exec.train", *args, "--tensorboard", str(tmp_path / "tb"), "--wandb", "oppo-test", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    with open(run / "metrics.csv", newline="") as fh:
        rewards = [float(row["mean_reward"]) for row in csv.DictReader(fh)]
    ends = [end for _, end in steps_column(run, "end_s")]
    acc = EventAccumulator(str(tmp_path / "tb" / "exec"), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("metrics/mean_reward")
    assert [e.step for e in events] == [0, 1, 2]
    assert all(e.value == pytest.approx(r, rel=1e-6) for e, r in zip(events, rewards))  # float32 there
    # written as each step closed: the events are as far apart in time as the steps' ends (logged after the run,
    # they would be milliseconds apart)
    assert events[2].wall_time - events[0].wall_time > 0.5 * (ends[2] - ends[0]) > 0
    history, summary = wandb_history(run)
    assert sorted(history) == [0, 1, 2]
    assert [history[s]["metrics/mean_reward"] for s in range(3)] == pytest.approx(rewards, rel=1e-12)
    assert json.loads(summary["summary/mean_step_s"]) == pytest.approx(
        json.loads((run / "summary.json").read_text())["mean_step_s"], rel=1e-12
    )


def test_a_resumed_run_logs_on_into_the_runs_it_started(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, tracking = tmp_path / "exec", ("--tensorboard", str(tmp_path / "tb"), "--mlflow", str(tmp_path / "ml"))
    args = ("--preset", "tiny-cpu", "--policy", "sync", "--batch", "2", "--save-every", "2", "--out", str(run))
    for steps in ("3", "5"):  # 3 steps (a checkpoint after 2), then resumed from it to 5: step 2 is done again
        res = cli("oppo.exec.train", *(args if steps == "3" else ("--resume", str(run))), "--steps", steps, *tracking)
        assert res.returncode == 0, res.stderr
    client, mlrun = mlflow_run(tmp_path / "ml")  # one run: the resumed one logged into it
    history = client.get_metric_history(mlrun.info.run_id, "metrics/mean_reward")
    assert sorted(m.step for m in history) == [0, 1, 2, 2, 3, 4]  # MLflow keeps both loggings of step 2
    acc = EventAccumulator(str(tmp_path / "tb" / "exec"), size_guidance={"scalars": 0})
    acc.Reload()
    with open(run / "metrics.csv", newline="") as fh:
        rewards = [float(row["mean_reward"]) for row in csv.DictReader(fh)]
    events = acc.Scalars("metrics/mean_reward")
    assert [e.step for e in events] == [0, 1, 2, 3, 4]  # the first logging of step 2 dropped at the restart
    assert [e.value for e in events] == pytest.approx(rewards, rel=1e-6)


def test_a_missing_tracker_library_is_bad_input(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow now raises ImportError
    with pytest.raises(ValueError, match="--mlflow needs the mlflow package"):
        trackers_from(argparse.Namespace(tensorboard=None, mlflow="somewhere"))
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ValueError, match="--wandb needs the wandb package"):
        trackers_from(argparse.Namespace(tensorboard=None, mlflow=None, wandb="project"))


def test_provenance_names_versions_commit_and_host(tmp_path):
    info = provenance()
    assert info["oppo"] and info["python"] and info["libraries"]["simpy"]
    assert info["host"]["cores"] >= 1 and isinstance(info["host"]["gpus"], list)
    assert git_commit(tmp_path) is None  # not a checkout: nothing, no failure


def test_a_stored_config_reads_past_its_provenance(tmp_path):
    res = cli("oppo.sim", "run", "--steps", "2", "--batch", "16", "--out", str(tmp_path / "a"))
    assert res.returncode == 0, res.stderr
    stored = json.loads((tmp_path / "a" / "config.json").read_text())
    assert stored["provenance"]["libraries"]["numpy"]
    assert "provenance" not in load_stored_config(tmp_path / "a")
    assert "provenance" not in json.loads((tmp_path / "a" / "summary.json").read_text())["config"]
    res = cli("oppo.sim", "run", "--config", str(tmp_path / "a" / "config.json"), "--out", str(tmp_path / "b"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "a" / "steps.csv").read_bytes() == (tmp_path / "b" / "steps.csv").read_bytes()
