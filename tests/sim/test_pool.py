"""Simulations spread over worker processes or a Ray cluster give the rows of one process, in the same order."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oppo.cli import Interrupted
from oppo.sim.model.trainer import SimConfig
from oppo.sim.setup.toml_file import load_setup
from oppo.sim.study.experiments import sweep_config
from oppo.sim.study.pool import Pool, evaluate


def sim(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oppo.sim", *args], capture_output=True, text=True, timeout=600)


def base_config(steps: int = 8) -> SimConfig:
    setup = load_setup("paper-7b-h200")
    return SimConfig(setup.schedule(policy="intra", batch=32), setup, steps, seed=1)


def square(x: int) -> int:
    return x * x


def test_results_come_back_in_the_items_order():
    assert evaluate(square, list(range(7)), Pool(workers=3)) == [x * x for x in range(7)]


def test_two_worker_processes_give_the_rows_of_one():
    values = [64, 128, 256, 512]
    one = sweep_config(base_config(), "chunk", values)
    two = sweep_config(base_config(), "chunk", values, pool=Pool(workers=2))
    assert two == one and [r["chunk"] for r in two] == values
    assert len({r["mean_step_s"] for r in one}) > 1  # the knob matters: equal rows are not trivially equal


def test_compare_with_workers_writes_the_same_table(tmp_path):
    common = ("compare", "--policies", "sync,oppo,tppo", "--steps", "6", "--batch", "32")
    for workers in ("1", "2"):
        res = sim(*common, "--workers", workers, "--out", str(tmp_path / workers))
        assert res.returncode == 0, res.stderr
    assert (tmp_path / "1" / "compare.csv").read_bytes() == (tmp_path / "2" / "compare.csv").read_bytes()


@pytest.mark.parametrize(
    "args, message",
    [
        (("--workers", "0"), "--workers must be >= 1"),
        (("--ray-address", "127.0.0.1:9"), "--ray-address 127.0.0.1:9: cannot connect"),
        (("--ray-address", "nowhere"), "expected 'auto' or host:port"),
    ],
)
def test_bad_pool_options_exit_2_in_one_line(tmp_path, args, message):
    res = sim("sweep", "--chunks", "64,128", "--steps", "2", *args, "--out", str(tmp_path / "s"))
    assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.slow
def test_a_two_node_ray_cluster_gives_the_rows_of_one_process(monkeypatch, without_ray):
    ray = without_ray
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_worker_niceness", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    try:
        values = [64, 128, 256]
        rows = sweep_config(base_config(), "chunk", values, pool=Pool(ray_address=cluster.address))
        assert not ray.is_initialized()  # the pool connected for the sweep and left
        assert rows == sweep_config(base_config(), "chunk", values)
    finally:
        cluster.shutdown()


def session_processes(sid: int) -> list[int]:
    """Pids of the live processes of session ``sid`` (a command started with ``start_new_session``: it and its
    workers), read from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[3]) == sid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp, session
            pids.append(int(stat.parent.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads sessions from /proc")
def test_ctrl_c_cancels_queued_simulations_and_leaves_no_worker(tmp_path):
    # eight simulations of ~2 s on two workers: ~8 s in all; interrupted once the first ones run
    args = ["sweep", "--setup", "paper-7b-h200", "--steps", "1200", "--batch", "256", "--workers", "2"]
    args += ["--chunks", "100,150,200,250,300,350,400,450", "--out", str(tmp_path / "s")]
    cmd = [sys.executable, "-m", "oppo.sim", *args]
    # SIGINT handled as on a terminal even where this test runs with SIGINT ignored (pytest started as a background
    # job of a non-interactive shell: its processes and their children inherit it)
    default_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(cmd, **pipes, start_new_session=True, preexec_fn=default_sigint)
    try:
        time.sleep(4.0)
        assert proc.poll() is None, "the sweep ended before it was interrupted: make it longer"
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the whole process group, workers too
        interrupted = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        took_s = time.monotonic() - interrupted
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = session_processes(proc.pid)
    deadline = time.monotonic() + 5  # a process of the session may still be exiting (the forkserver, on a busy
    while left and time.monotonic() < deadline:  # machine, closes once its parent's pipe does)
        time.sleep(0.1)
        left = session_processes(proc.pid)
    for pid in left:  # ours (its session): end them, then fail
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers left running: {left}"
    assert proc.returncode == 130, stderr
    assert took_s < 4.0, f"exited {took_s:.1f} s after the interrupt"
    said = re.search(
        r"interrupted: (\d+) of 8 simulations had finished, the other (\d+) were cancelled; nothing", stderr
    )
    assert said and int(said[1]) + int(said[2]) == 8 and int(said[1]) < 8, stderr  # counted from results, not a bar
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "s" / "sweep.csv").exists()


def die_on_one(x: int) -> int:
    if x == 1:
        os._exit(3)  # as a worker killed by the OOM killer: no exception, the process is gone
    return x


def test_a_worker_that_dies_ends_the_evaluation_with_an_error_not_a_hang():
    from concurrent.futures.process import BrokenProcessPool

    with pytest.raises(BrokenProcessPool):
        evaluate(die_on_one, [0, 1, 2, 3], Pool(workers=2))


def test_an_interrupt_counts_the_results_that_came_back(monkeypatch):
    calls = []

    def second_interrupts(x: int) -> int:
        calls.append(x)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return x

    with pytest.raises(Interrupted, match="2 of 5 simulations had finished, the other 3 were cancelled"):
        evaluate(second_interrupts, list(range(5)))


@pytest.fixture
def sigint_raises():
    """SIGINT raising KeyboardInterrupt here, as in a terminal's foreground job (a background job ignores it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_while_submitting_is_raised_once_all_are_submitted(sigint_raises):
    from oppo.sim.study.pool import _sigint_deferred

    submitted = []
    with pytest.raises(KeyboardInterrupt):
        with _sigint_deferred():
            for item in range(3):
                os.kill(os.getpid(), signal.SIGINT)  # delivered at once to this, the main, thread
                submitted.append(item)
    assert submitted == [0, 1, 2]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_where_sigint_is_ignored_it_stays_ignored():
    from oppo.sim.study.pool import _sigint_deferred

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with _sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
