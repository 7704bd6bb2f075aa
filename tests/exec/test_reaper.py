"""The engine watchdog: a trainer killed without closing its engine leaves no engine process and no weights file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from oppo.exec.engines import reaper

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the watchdog reads /proc (Linux)")

# A "trainer": starts an "engine" (a process with a child of its own, as vLLM's engine core has its workers), a
# watchdog guarding it and a folder, prints the ids, then either releases the watchdog or waits to be killed.
TRAINER = textwrap.dedent(
    """
    import subprocess, sys, time
    from oppo.exec.engines.reaper import Watchdog, descendants
    watchdog = Watchdog()
    if sys.argv[2] == "starting":  # killed while the engine starts: its processes not named yet
        watchdog.adopt_new_children()
    engine = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        "time.sleep(600)"])
    while not descendants(engine.pid):
        time.sleep(0.05)
    if sys.argv[2] == "starting":
        time.sleep(3.0)  # the watchdog looks every 0.2 s (once started: slower on a loaded machine)
    else:
        watchdog.guard(pids=[engine.pid], remove=[sys.argv[1]])
    print(engine.pid, *descendants(engine.pid), watchdog.process.pid, flush=True)
    if sys.argv[2] == "release":
        watchdog.release()
        print("released", flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split(")")[-1].split()[0] != "Z"  # a zombie has ended; its parent has not reaped it
    except OSError:
        return False


def _wait_gone(pids: list[int], timeout_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


def _trainer(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, list[int], Path]:
    folder = tmp_path / "oppo-weights-test"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(folder), mode], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    pids = [int(word) for word in trainer.stdout.readline().split()]
    return trainer, pids, folder


@pytest.mark.parametrize("mode", ["wait", "starting"])
def test_a_killed_trainer_leaves_no_engine_process_and_no_weights_file(tmp_path, mode):
    """Killed with its engine running (its processes named), or while the engine started (found as they came)."""
    trainer, (engine, worker, watchdog), folder = _trainer(tmp_path, mode)
    try:
        assert _alive(engine) and _alive(worker)
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(timeout=10)
        assert _wait_gone([engine, worker, watchdog]) == []
        assert not folder.exists() if mode == "wait" else folder.exists()  # a starting engine has pushed nothing
    finally:
        for pid in (engine, worker, watchdog):  # ours: started by this test's trainer
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_released_watchdog_exits_and_touches_nothing(tmp_path):
    trainer, (engine, worker, watchdog), folder = _trainer(tmp_path, "release")
    try:
        assert trainer.stdout.readline().strip() == "released"
        assert _wait_gone([watchdog]) == []
        os.kill(trainer.pid, signal.SIGKILL)  # now the trainer dies: nobody is guarding any more
        trainer.wait(timeout=10)
        time.sleep(0.5)
        assert _alive(engine) and _alive(worker)
        assert (folder / "model.safetensors").read_bytes() == b"weights"
    finally:
        for pid in (engine, worker):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_process_id_reused_by_another_process_is_left_alone(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        ticks = reaper.start_ticks(other.pid)
        assert ticks is not None
        reaper.reap([[other.pid, ticks - 1]], [], grace_s=0.1)  # the id names a process that started earlier
        time.sleep(0.2)
        assert other.poll() is None
        reaper.reap([[other.pid, ticks]], [], grace_s=5.0)  # the very process
        assert other.wait(timeout=10) == -signal.SIGTERM
    finally:
        if other.poll() is None:
            other.kill()


def test_a_line_cut_short_by_the_trainers_death_still_ends_what_was_guarded(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        guarded = json.dumps({"pids": [reaper.identity(other.pid)], "remove": []})
        told = guarded + "\n" + '{"pids": [['  # the second line cut short
        watchdog = subprocess.run([sys.executable, "-I", reaper.__file__], input=told, text=True, timeout=30)
        assert watchdog.returncode == 0 and other.wait(timeout=10) == -signal.SIGTERM
    finally:
        if other.poll() is None:
            other.kill()
