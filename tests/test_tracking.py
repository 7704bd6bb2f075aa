"""Experiment tracking (``--tensorboard``, ``--mlflow``) read back with the trackers' own readers, and every run's
provenance in ``config.json``."""

import argparse
import csv
import json
import os
import subprocess
import sys

import pytest

from oppo.provenance import git_commit, provenance
from oppo.stored_config import load_stored_config
from oppo.tracking import trackers_from
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
    args = ("--preset", "tiny-cpu", "--mode", "sync", "--steps", "2", "--batch", "2", "--out", str(tmp_path / "exec"))
    res = cli("oppo.exec.train", *args, "--mlflow", str(tmp_path / "ml"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    client, run = mlflow_run(tmp_path / "ml")
    assert run.data.tags["backend"] == "exec"
    losses = client.get_metric_history(run.info.run_id, "metrics/mean_reward")
    assert sorted(m.step for m in losses) == [0, 1]
    assert run.data.params["schedule.policy"] == "sync"


def test_a_missing_tracker_library_is_bad_input(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow now raises ImportError
    with pytest.raises(ValueError, match="--mlflow needs the mlflow package"):
        trackers_from(argparse.Namespace(tensorboard=None, mlflow="somewhere"))


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
