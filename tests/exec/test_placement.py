"""Disaggregated placement: a short run with the reward model in a Ray actor equals the colocated run.

Worker processes are found by the process id the run prints for each worker (``placement: ... (worker pid N)``):
the tests stop only processes they started themselves."""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray")

TRAIN = [sys.executable, "-m", "oppo.exec.train", "--policy", "intra", "--chunk", "4", "--batch", "4"]


def run(tmp_path, placement, *extra):
    out = tmp_path / placement
    cmd = [*TRAIN, "--steps", "3", "--seed", "5", "--placement", placement, "--out", str(out), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return out, res.stderr


def rewards(out):
    return [float(r["mean_reward"]) for r in csv.DictReader(open(out / "steps.csv"))]


def worker_pids(stderr: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"\(worker pid (\d+)\)", stderr)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) is not running
    state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] if os.path.exists(f"/proc/{pid}") else "X"
    return state not in ("Z", "X")


# a CLI run with its own Ray, ~55 s: test_data_parallel's disaggregated case (the reward model in its own worker, the
# run equal to one colocated rank) covers the placement by default
@pytest.mark.slow
def test_disaggregated_matches_colocated(tmp_path):
    colocated, _ = run(tmp_path, "colocated")
    disaggregated, stderr = run(tmp_path, "disaggregated")
    assert rewards(disaggregated) == pytest.approx(rewards(colocated), abs=1e-5)
    devices = {(r["device"], r["role"]) for r in csv.DictReader(open(disaggregated / "trace.csv"))}
    assert ("cpu1", "reward") in devices and ("cpu0", "actor") in devices
    pids = worker_pids(stderr)
    assert len(pids) == 1, stderr
    deadline = time.monotonic() + 30  # the worker exits with the run (clean shutdown)
    while alive(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pids[0])


def kill_mid_run(cmd: list[str], out, log, pids_of, count: int, victim: int) -> tuple[int, str, list[int]]:
    """Start ``cmd``; once it has written steps and printed ``count`` worker pids (``pids_of(stderr)``), kill the
    ``victim``-th worker, by its id. Returns the run's exit code, its stderr and the pids."""
    with open(log, "w") as err_file:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file, text=True)
    try:
        deadline = time.monotonic() + 420  # generous: Ray's start and the model loads crawl on a loaded machine
        while time.monotonic() < deadline and not (
            (out / "steps.csv").exists() and len(pids_of(log.read_text())) == count
        ):
            time.sleep(0.2)
        pids = pids_of(log.read_text())
        assert len(pids) == count and (out / "steps.csv").exists(), (
            f"no worker pids or no steps yet:\n{log.read_text()}"
        )
        os.kill(pids[victim], signal.SIGKILL)  # a worker this run started, by its id
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, log.read_text(), pids


@pytest.mark.slow  # ~40 s with both cores busy; the dead data-parallel rank's test is slow too
def test_dead_worker_ends_run_with_records(tmp_path):
    out = tmp_path / "dies"
    cmd = [*TRAIN, "--steps", "100000", "--placement", "disaggregated", "--out", str(out)]
    code, err, _ = kill_mid_run(cmd, out, tmp_path / "stderr.txt", worker_pids, count=1, victim=0)
    assert code == 1, err
    assert "reward worker died" in err
    assert json.loads((out / "summary.json").read_text())["steps"] >= 10


def test_a_local_ray_is_not_offered_the_drivers_gpu(monkeypatch):
    """Workers of a local Ray get the visible GPUs less the one the driver holds models on (a rollout worker or
    scorer on the trainer's GPU would share it, unseen); a driver on the CPU leaves Ray's detection alone."""
    import torch

    from oppo.exec.distributed.placement import workers_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert workers_gpus(torch.device("cuda", 1)) == "4,6"
    assert workers_gpus(torch.device("cuda")) == "5,6"
    assert workers_gpus(torch.device("cpu")) is None and workers_gpus(None) is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert workers_gpus(torch.device("cuda", 0)) == "1"
