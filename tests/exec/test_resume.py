"""``--save-every N`` and ``--resume RUN_DIR``: a resumed run is the uninterrupted run (float64), Ctrl-C keeps the
last complete checkpoint, and a resume that would not be the same run is refused."""

import csv
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from oppo.exec.step.snapshot import load_state
from tests import invoke

COMMON = (
    "--preset", "tiny-cpu", "--policy", "inter", "--delta", "2", "--check-tokens", "2", "--batch", "4",
    "--max-new-tokens", "24", "--dtype", "float64", "--seed", "5",
)  # fmt: skip


def train(*args: str) -> subprocess.CompletedProcess:
    return invoke.train(*args)  # in this process; the run killed mid-way below is a real one


def rows(path, drop=("start_s", "end_s", "step_s")) -> list[dict]:
    with open(path, newline="") as fh:
        return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(fh)]


def weights(run_dir, role: str) -> torch.Tensor:
    tensors = load_file(run_dir / "checkpoint" / role / "model.safetensors")
    return torch.cat([tensors[k].flatten() for k in sorted(tensors)])


@pytest.fixture(scope="module")
def cut_run(tmp_path_factory):
    """A run of 3 steps that saved a checkpoint at its end."""
    cut = tmp_path_factory.mktemp("resume") / "cut"
    res = train(*COMMON, "--steps", "3", "--save-every", "3", "--out", str(cut))
    assert res.returncode == 0, res.stderr
    return cut


def test_a_resumed_run_is_the_uninterrupted_run(tmp_path, cut_run):
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    shutil.copytree(cut_run, cut)
    assert train(*COMMON, "--steps", "6", "--save-every", "6", "--out", str(straight)).returncode == 0
    assert int(rows(cut / "steps.csv")[-1]["deferred"]) > 0  # sequences with their tokens carried over the cut
    started = json.loads((cut / "config.json").read_text())["provenance"]
    res = train("--resume", str(cut), "--steps", "6", "--save-every", "6")
    assert res.returncode == 0, res.stderr
    provenance = json.loads((cut / "config.json").read_text())["provenance"]
    assert {k: v for k, v in provenance.items() if k != "resumed"} == started  # where the run started, kept
    assert [set(p) for p in provenance["resumed"]] == [set(started)]  # and the process that went on
    assert rows(cut / "sequences.csv") == rows(straight / "sequences.csv")  # the same trained ids, lags, lengths
    assert rows(cut / "steps.csv") == rows(straight / "steps.csv")  # rewards, Δ, finished, deferred
    assert rows(cut / "metrics.csv") == rows(straight / "metrics.csv")  # losses, KL, gradient norms
    for role in ("actor", "critic"):
        a, b = weights(straight, role), weights(cut, role)
        assert a.dtype == torch.float64 and float((a - b).abs().max()) <= 1e-10 * float(a.abs().max()), role
    steps = list(csv.DictReader(open(cut / "steps.csv")))
    assert float(steps[3]["start_s"]) >= float(steps[2]["end_s"])  # the clock goes on from the save


@pytest.mark.slow
def test_ctrl_c_keeps_the_last_checkpoint_and_the_run_goes_on(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "oppo.exec.train", *COMMON, "--steps", "500", "--save-every", "2", "--out", str(run)]
    default_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731  (as on a terminal)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 120
        while not (run / "checkpoint" / "state.pkl").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (run / "checkpoint" / "state.pkl").exists(), "no checkpoint written"
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    saved = len(rows(run / "steps.csv"))
    res = train("--resume", str(run), "--steps", "12", "--save-every", "0")
    assert res.returncode == 0, res.stderr
    assert [int(r["step"]) for r in rows(run / "steps.csv")] == list(range(12))
    assert saved >= 2


def test_a_resume_that_would_be_another_run_is_refused(cut_run):
    before = (cut_run / "checkpoint" / "state.pkl").read_bytes()
    config_before = (cut_run / "config.json").read_bytes()
    for args, message in [
        (("--seed", "9"), "seed differ from the run's; only --steps may change"),
        (("--out", "elsewhere"), "drop --config and --out"),
    ]:
        res = train("--resume", str(cut_run), "--steps", "4", *args)
        assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert (cut_run / "checkpoint" / "state.pkl").read_bytes() == before  # nothing written
    assert (cut_run / "config.json").read_bytes() == config_before


def test_a_checkpoint_of_another_version_is_refused(tmp_path, cut_run):
    """A state.pkl pickles the scheduler's internals as they were: one of another layout is refused, naming it."""
    cut = tmp_path / "cut"
    shutil.copytree(cut_run, cut)
    state_pkl = cut / "checkpoint" / "state.pkl"
    state = pickle.loads(state_pkl.read_bytes())
    del state.__dict__["format"]  # as written before the field existed
    state_pkl.write_bytes(pickle.dumps(state))
    res = train("--resume", str(cut), "--steps", "4")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"{state_pkl} was written by another version of oppo" in res.stderr
    assert "state format 1; this one reads format 3" in res.stderr


# Where the classes of a state.pkl lived before the core, the records and the catalog had packages of their own.
OLD_PATHS = {f"oppo.core.{m}": f"oppo.{m}" for m in ("buffer", "chunking", "config", "overcommit", "scheduler")}
OLD_PATHS |= {"oppo.core.async_queue": "oppo.async_queue", "oppo.records.schema": "oppo.records"}


def test_a_checkpoint_from_before_the_core_moved_is_refused_naming_its_writer(tmp_path, cut_run):
    """A format-2 state.pkl names its classes at their old module paths: refused in one line that says which oppo
    wrote it (from the run's provenance: it predates the checkpoint's own note)."""
    cut = tmp_path / "cut"
    shutil.copytree(cut_run, cut)
    state_pkl = cut / "checkpoint" / "state.pkl"
    state = pickle.loads(state_pkl.read_bytes())
    state.format = 2
    del state.__dict__["written_by"]  # format 2 had no such field
    raw = pickle.dumps(state, protocol=2)  # protocol 2 names each class as text: "c<module>\n<name>\n"
    for new, old in OLD_PATHS.items():
        raw = raw.replace(f"c{new}\n".encode(), f"c{old}\n".encode())
    assert b"coppo.scheduler\n" in raw and b"coppo.core." not in raw
    state_pkl.write_bytes(raw)
    with pytest.raises(ValueError, match="state format 2"):
        load_state(state_pkl)
    config_before = (cut / "config.json").read_bytes()
    commit = json.loads(config_before)["provenance"]["commit"] or "unknown"
    res = train("--resume", str(cut), "--steps", "4")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"(oppo 0.1.0 (commit {commit}), state format 2; this one reads format 3)" in res.stderr
    assert (cut / "config.json").read_bytes() == config_before  # refused before anything is written


def test_a_checkpoint_from_before_the_executor_had_rooms_resumes(tmp_path, cut_run):
    """A format-3 state.pkl saved while the executor's modules stood side by side (oppo.exec.snapshot.Saved,
    oppo.exec.runner.SeqData) is read where those classes live now, and the run goes on."""
    from oppo.exec.step.snapshot import MOVED_MODULES

    cut = tmp_path / "cut"
    shutil.copytree(cut_run, cut)
    state_pkl = cut / "checkpoint" / "state.pkl"
    raw = pickle.dumps(load_state(state_pkl), protocol=2)  # protocol 2 names each class as text
    for old, new in MOVED_MODULES.items():
        raw = raw.replace(f"c{new}\n".encode(), f"c{old}\n".encode())
    assert b"coppo.exec.snapshot\nSaved\n" in raw and b"coppo.exec.runner\nSeqData\n" in raw
    state_pkl.write_bytes(raw)
    again = load_state(state_pkl)
    assert (
        type(again).__module__ == "oppo.exec.step.snapshot"
        and again.steps == load_state(cut_run / "checkpoint" / "state.pkl").steps
    )
    res = train("--resume", str(cut), "--steps", "4")
    assert res.returncode == 0, res.stderr


def test_a_checkpoint_names_the_oppo_that_wrote_it(cut_run):
    state = load_state(cut_run / "checkpoint" / "state.pkl")
    assert state.format == 3 and state.written_by.startswith("oppo 0.1.0 (commit ")


def test_no_checkpoint_or_an_unsupported_run_is_bad_input(tmp_path):
    res = train("--resume", str(tmp_path), "--steps", "4")
    assert res.returncode == 2 and "no checkpoint in" in res.stderr
    res = train("--dp", "2", "--save-every", "2", "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and "--save-every supports one-process runs only" in res.stderr
    res = train("--steps", "2")
    assert res.returncode == 2 and "--out is required" in res.stderr


def test_a_damaged_checkpoint_of_this_format_is_called_unreadable_not_another_version(tmp_path, cut_run):
    state_pkl = tmp_path / "checkpoint" / "state.pkl"
    state_pkl.parent.mkdir()
    state_pkl.write_bytes((cut_run / "checkpoint" / "state.pkl").read_bytes()[:-40])  # cut short
    with pytest.raises(ValueError, match="unreadable checkpoint") as refused:
        load_state(state_pkl)
    assert "another version" not in str(refused.value)
