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

from oppo.exec.step.snapshot import latest, load_state, verify
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
        while not (run / "checkpoint" / "manifest.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (run / "checkpoint" / "manifest.json").exists(), "no checkpoint written"
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
    before = (cut_run / "checkpoint" / "state.json").read_bytes()
    config_before = (cut_run / "config.json").read_bytes()
    for args, message in [
        (("--seed", "9"), "seed differ from the run's; only --steps may change"),
        (("--out", "elsewhere"), "drop --config and --out"),
    ]:
        res = train("--resume", str(cut_run), "--steps", "4", *args)
        assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert (cut_run / "checkpoint" / "state.json").read_bytes() == before  # nothing written
    assert (cut_run / "config.json").read_bytes() == config_before


def checkpoint_copy(tmp_path, cut_run):
    cut = tmp_path / "cut"
    shutil.copytree(cut_run, cut)
    return cut, cut / "checkpoint"


def test_a_checkpoint_of_another_format_is_refused_naming_its_writer(tmp_path, cut_run):
    cut, checkpoint = checkpoint_copy(tmp_path, cut_run)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    (checkpoint / "manifest.json").write_text(json.dumps(manifest | {"format": 5, "written_by": "oppo 9.9 (commit x)"}))
    config_before = (cut / "config.json").read_bytes()
    res = train("--resume", str(cut), "--steps", "4")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "written by oppo 9.9 (commit x) in state format 5; this oppo reads 4" in res.stderr
    assert (cut / "config.json").read_bytes() == config_before  # refused before anything is written


class Payload:
    """Unpickled, it creates the file its argument names: what a pickle sent by someone else could do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_a_pickled_checkpoint_is_refused_without_running_it(tmp_path, cut_run):
    """A checkpoint of oppo's pickle era (state.pkl, optimizers.pt), here carrying a payload that would create a file
    if unpickled: refused in one line naming the oppo that wrote the run, and the file is never created."""
    cut, checkpoint = checkpoint_copy(tmp_path, cut_run)
    ran = tmp_path / "payload-ran"
    for name in ("manifest.json", "state.json", "arrays.safetensors"):
        (checkpoint / name).unlink()
    (checkpoint / "state.pkl").write_bytes(pickle.dumps(Payload(ran)))
    (checkpoint / "optimizers.pt").write_bytes(pickle.dumps(Payload(ran)))
    assert pickle.loads((checkpoint / "state.pkl").read_bytes()) and ran.exists()  # the payload does run...
    ran.unlink()
    res = train("--resume", str(cut), "--steps", "4")  # ...but not here
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "as a pickle (state format 3 or earlier), which this oppo does not open" in res.stderr
    commit = json.loads((cut / "config.json").read_text())["provenance"]["commit"] or "unknown"
    assert f"written by oppo 0.1.0 (commit {commit})" in res.stderr
    assert not ran.exists()


def test_a_checkpoint_cut_short_falls_back_to_the_previous_one_and_says_so(tmp_path, cut_run):
    """A save cut between its renames leaves checkpoint.old whole; a checkpoint whose file does not match its
    manifest is skipped, named, and the older one resumes."""
    cut, checkpoint = checkpoint_copy(tmp_path, cut_run)
    shutil.copytree(checkpoint, cut / "checkpoint.old")
    state = checkpoint / "state.json"
    state.write_bytes(state.read_bytes()[:-40])  # cut short
    assert latest(cut, say=False) == cut / "checkpoint.old"
    res = train("--resume", str(cut), "--steps", "4")
    assert res.returncode == 0, res.stderr
    assert f"note: skipped {checkpoint}: state.json does not match its manifest" in res.stderr
    (cut / "checkpoint.old" / "arrays.safetensors").unlink()
    (cut / "checkpoint" / "state.json").write_text("{}")  # the resumed run saved again: damage both
    with pytest.raises(ValueError, match="no checkpoint to resume from: .*arrays.safetensors is missing"):
        latest(cut)


def test_a_checkpoint_is_data_and_names_the_oppo_that_wrote_it(cut_run):
    checkpoint = cut_run / "checkpoint"
    assert verify(checkpoint) is None and not list(checkpoint.rglob("*.pkl")) and not list(checkpoint.rglob("*.pt"))
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert manifest["format"] == 4 and manifest["written_by"].startswith("oppo 0.1.0 (commit ")
    assert {"state.json", "arrays.safetensors", "actor/model.safetensors", "critic/model.safetensors"} <= set(
        manifest["files"]
    )
    state = load_state(checkpoint)
    assert state["saved"].written_by == manifest["written_by"] and len(state["saved"].steps) == 3


def test_no_checkpoint_or_an_unsupported_run_is_bad_input(tmp_path):
    res = train("--resume", str(tmp_path), "--steps", "4")
    assert res.returncode == 2 and "no checkpoint in" in res.stderr
    res = train("--dp", "2", "--save-every", "2", "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and "--save-every supports one-process runs only" in res.stderr
    res = train("--steps", "2")
    assert res.returncode == 2 and "--out is required" in res.stderr
