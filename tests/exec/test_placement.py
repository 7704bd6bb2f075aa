"""Disaggregated placement: a short run with the reward model in a Ray actor equals the colocated run."""

import csv
import subprocess
import sys

import pytest

pytest.importorskip("ray")


def run(tmp_path, placement, *extra):
    out = tmp_path / placement
    cmd = [sys.executable, "-m", "oppo.exec.train", "--mode", "intra", "--chunk", "4", "--steps", "3",
           "--batch", "4", "--seed", "5", "--placement", placement, "--out", str(out), *extra]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return out


def rewards(out):
    return [float(r["mean_reward"]) for r in csv.DictReader(open(out / "steps.csv"))]


def test_disaggregated_matches_colocated(tmp_path):
    colocated = run(tmp_path, "colocated")
    disaggregated = run(tmp_path, "disaggregated")
    assert rewards(disaggregated) == pytest.approx(rewards(colocated), abs=1e-5)
    devices = {(r["device"], r["role"]) for r in csv.DictReader(open(disaggregated / "trace.csv"))}
    assert ("cpu1", "reward") in devices and ("cpu0", "actor") in devices
    leftover = subprocess.run(["pgrep", "-f", "ray::ScorerWorker"], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""  # clean shutdown


def test_dead_worker_ends_run_with_records(tmp_path):
    import json
    import time

    out = tmp_path / "dies"
    cmd = [sys.executable, "-m", "oppo.exec.train", "--mode", "intra", "--chunk", "4", "--steps", "100000",
           "--batch", "4", "--placement", "disaggregated", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while time.time() < deadline and not (out / "steps.csv").exists():
        time.sleep(0.2)
    subprocess.run(["pkill", "-9", "-f", "ray::ScorerWorker"])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "reward worker died" in err
    assert json.loads((out / "summary.json").read_text())["steps"] >= 10
