"""A run killed at any instant resumes to the run it would have been, or is refused in one line saying why; one
process writes a run folder at a time; a disk that refuses a write ends the run in one line and keeps what was whole.

The kill test (``-m slow``, 100 instants; a smoke of 3 in the default run) SIGKILLs the main process of a tiny
float64 run that saves every step, at random instants (in and between its writes), resumes it, and compares its
records and final weights with an uninterrupted run's."""

import csv
import errno
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from oppo.exec.step import snapshot
from oppo.records.io import one_writer
from tests import invoke

RUN = (
    "--preset",
    "tiny-cpu",
    "--policy",
    "inter",
    "--delta",
    "2",
    "--check-tokens",
    "2",
    "--batch",
    "4",
    "--max-new-tokens",
    "24",
    "--dtype",
    "float64",
    "--seed",
    "5",
)
STEPS = 6


def rows(path, drop=("start_s", "end_s", "step_s")) -> list[dict]:
    with open(path, newline="") as fh:
        return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(fh)]


def weights(run_dir: Path, role: str) -> torch.Tensor:
    tensors = load_file(run_dir / "checkpoint" / role / "model.safetensors")
    return torch.cat([tensors[k].flatten() for k in sorted(tensors)])


def same_run(a: Path, b: Path) -> bool:
    """The records (times aside) and the final weights (to 1e-10 relative) of two runs agree."""
    for name in ("steps.csv", "sequences.csv", "metrics.csv"):
        if rows(a / name) != rows(b / name):
            return False
    for role in ("actor", "critic"):
        x, y = weights(a, role), weights(b, role)
        if float((x - y).abs().max()) > 1e-10 * float(x.abs().max()):
            return False
    return True


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("straight") / "run"
    res = invoke.train(*RUN, "--steps", str(STEPS), "--save-every", "1", "--out", str(out))
    assert res.returncode == 0, res.stderr
    return out


def test_a_second_process_on_one_out_is_refused_and_a_dead_ones_folder_taken_over(tmp_path):
    out = tmp_path / "run"
    with one_writer(out):  # another process's hold, as the kernel sees it (a lock of its own open file)
        res = invoke.train(*RUN, "--steps", "1", "--out", str(out))
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert f"{out} is being written by another process (pid {os.getpid()})" in res.stderr
        assert not (out / "config.json").exists()  # refused before anything was written
        res = invoke.sim("run", "--steps", "1", "--out", str(out))
        assert res.returncode == 2 and "is being written by another process" in res.stderr
    holder = subprocess.Popen(  # a process that takes the folder, then dies by SIGKILL holding it
        [
            sys.executable,
            "-c",
            f"from oppo.records.io import one_writer\nwith one_writer({str(out)!r}):\n"
            "    print('held', flush=True)\n    import time; time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert invoke.train(*RUN, "--steps", "1", "--out", str(out)).returncode == 2
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    res = invoke.train(*RUN, "--steps", "1", "--out", str(out))  # the lock died with its process
    assert res.returncode == 0, res.stderr


def test_a_full_disk_ends_the_run_in_one_line_and_keeps_the_last_checkpoint(tmp_path, straight, monkeypatch):
    """The second save hits a full disk: exit 1 and one line; the first checkpoint stays whole and verifies, no
    half-written folder is left, and the run resumed from it is the uninterrupted run."""
    out, saves, real = tmp_path / "run", [], snapshot._write_checkpoint

    def full_on_second(tmp, *args):
        saves.append(tmp)
        real(tmp, *args)  # written, then refused before its manifest is complete:
        if len(saves) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / snapshot.MANIFEST))

    monkeypatch.setattr(snapshot, "_write_checkpoint", full_on_second)
    res = invoke.train(*RUN, "--steps", str(STEPS), "--save-every", "2", "--out", str(out))
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "No space left on device; the records last written and the last checkpoint kept" in res.stderr
    assert snapshot.verify(out / "checkpoint") is None and not (out / "checkpoint.tmp").exists()
    assert len(snapshot.load_state(out / "checkpoint")["saved"].steps) == 2
    json.loads((out / "config.json").read_text())  # whole
    monkeypatch.undo()
    res = invoke.train("--resume", str(out), "--steps", str(STEPS), "--save-every", str(STEPS))
    assert res.returncode == 0, res.stderr
    assert same_run(straight, out)


def test_a_file_size_limit_ends_the_run_in_one_line_leaving_nothing_half_written(tmp_path):
    """A real refusal by the kernel (a file-size limit: EFBIG, as a full disk's ENOSPC): the checkpoint's arrays do
    not fit; exit 1, one line, no half-written checkpoint, config.json whole."""
    out = tmp_path / "run"

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails (EFBIG) rather than the process dying
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))

    cmd = [sys.executable, "-m", "oppo.exec.train", *RUN, "--steps", "3", "--save-every", "2", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limited, timeout=300)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "File too large" in res.stderr and "Traceback" not in res.stderr
    assert not (out / "checkpoint.tmp").exists() and not (out / "checkpoint").exists()
    json.loads((out / "config.json").read_text())


def kill_and_resume(straight: Path, out: Path, pick: random.Random, times: tuple[float, float]) -> str:
    """Start the run and SIGKILL it: one time in five at a random instant before its first checkpoint (its start,
    the models' loading, the first step), else at a random instant after that checkpoint appeared (in the steps and
    the saves after it); then resume it. ``times``: the seconds to the first checkpoint and from it to the end, as
    measured on one whole run. The outcome: "same" (the resumed run equals the uninterrupted one), "refused" (one
    line), "finished" (it ended first) or what went wrong."""
    cmd = [sys.executable, "-m", "oppo.exec.train", *RUN, "--steps", str(STEPS), "--save-every", "1", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        if pick.random() < 0.2:
            delay = pick.uniform(0, times[0])
        else:
            delay = pick.uniform(0, times[1])
            while not (out / "checkpoint" / snapshot.MANIFEST).exists() and proc.poll() is None:
                time.sleep(0.01)
        proc.wait(timeout=delay)
        ended = True
    except subprocess.TimeoutExpired:
        ended = False
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if ended:
        return "finished" if proc.returncode == 0 and same_run(straight, out) else f"ended {proc.returncode}"
    # what the kill left: a save under way (its folder beside the checkpoint), a checkpoint whole before it
    in_save = (out / "checkpoint.tmp").exists() or (out / "checkpoint.old").exists()
    saved = any((out / name / snapshot.MANIFEST).exists() for name in ("checkpoint", "checkpoint.old"))
    res = invoke.train("--resume", str(out), "--steps", str(STEPS), "--save-every", str(STEPS))
    if res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1:
        return "refused after a save" if saved else "refused before a save"  # the first is a failure
    if res.returncode != 0:
        return f"resume exit {res.returncode}: {res.stderr.strip()[-300:]}"
    if not same_run(straight, out):
        return "different"
    return "same, killed in a save" if in_save else "same"


def timed_run(out: Path) -> tuple[float, float]:
    """Seconds from the start to the first checkpoint, and from it to the end, of one whole run."""
    cmd = [sys.executable, "-m", "oppo.exec.train", *RUN, "--steps", str(STEPS), "--save-every", "1", "--out", str(out)]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (out / "checkpoint" / snapshot.MANIFEST).exists() and proc.poll() is None:
        time.sleep(0.01)
    first = time.monotonic() - start
    assert proc.wait(timeout=600) == 0
    return first, time.monotonic() - start - first


# a resume that equals the uninterrupted run (killed in a save or between saves), one refused because no checkpoint was
# whole yet, or a run that ended before its kill; a refusal once a checkpoint was whole is a failure
GOOD = {"same", "same, killed in a save", "refused before a save", "finished"}


def kill_outcomes(straight: Path, tmp_path: Path, instants: int, seed: int) -> Counter:
    times = timed_run(tmp_path / "probe")
    pick, outcomes = random.Random(seed), Counter()
    for k in range(instants):
        outcomes[kill_and_resume(straight, tmp_path / f"k{k}", pick, times)] += 1
        shutil.rmtree(tmp_path / f"k{k}", ignore_errors=True)
    return outcomes


def test_kills_at_a_few_instants_resume_to_the_same_run(straight, tmp_path):
    outcomes = kill_outcomes(straight, tmp_path, instants=3, seed=0)
    assert set(outcomes) <= GOOD, outcomes
    assert outcomes["same"] + outcomes["same, killed in a save"] >= 1, outcomes  # seed 0: 3 kills after the first save


@pytest.mark.slow
def test_kills_at_100_instants_resume_to_the_same_run(straight, tmp_path):
    outcomes = kill_outcomes(straight, tmp_path, instants=100, seed=1)
    print(f"100 SIGKILLs: {dict(outcomes)}")
    assert set(outcomes) <= GOOD, outcomes
    assert outcomes["same"] + outcomes["same, killed in a save"] >= 50, outcomes  # four kills in five after a save
