"""``sweep`` and ``plan`` killed mid-table (SIGKILL: no handler runs) are finished by ``--resume DIR``: the table is
the uninterrupted run's, byte for byte, and only what the journal lacks is simulated. A journal line a kill cut is
left out; an option that would make another table is refused in one line."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from oppo.sim.study.journal import COMMAND, JOURNAL, Journal, read_journal
from tests import invoke
from tests.sim.test_pool import session_processes

# Killed, these run on two worker processes (~1.5 s to start, at each rung of a plan); uninterrupted and resumed
# (in this process), on one: the same table. A sweep: eight simulations of ~0.4 s (~1.6 s of table after the first
# result on two workers). A plan: 24 simulations at the first rung, 16 at the second, 3 on a fresh seed (~0.1 s
# each).
SWEEP = ("sweep", "--setup", "paper-7b-h200", "--batch", "64", "--steps", "500")
SWEEP += ("--chunks", "100,150,200,250,300,350,400,450")
PLAN = ("plan", "--batch", "16", "--policies", "sync,oppo,april", "--rung-steps", "40,80", "--rung-seeds", "1,2")
PLAN += ("--budget", "40", "--fresh-seeds", "1")
TWO, ONE = ("--workers", "2"), ("--workers", "1")
TABLES = {"sweep": ("sweep.csv",), "plan": ("plan.csv",)}


def sim(*args) -> subprocess.CompletedProcess:
    return invoke.sim(*map(str, args))


def lines(folder: Path) -> list[dict]:
    """The journal's entries (a finished journal: every line whole)."""
    path = folder / JOURNAL
    return [json.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def kept(folder: Path) -> int:
    """How many results the journal holds (its last line may be cut: a command still writing it, or killed)."""
    return len(read_journal(folder / JOURNAL)[0])


def same_tables(command: str, a: Path, b: Path) -> None:
    """The table's bytes, and a plan's best settings (its provenance says which processes wrote it)."""
    table = TABLES[command][0]
    assert (a / table).read_bytes() == (b / table).read_bytes()
    if command == "plan":
        best = [json.loads((folder / "best" / "config.json").read_text()) for folder in (a, b)]
        assert best[0].pop("provenance") and best[1].pop("provenance") and best[0] == best[1]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, Path]:
    """Each command's table, run once without interruption (in this process)."""
    done = {}
    for command, args in (("sweep", SWEEP), ("plan", PLAN)):
        out = tmp_path_factory.mktemp(command)
        res = sim(*args, *ONE, "--out", out)
        assert res.returncode == 0, res.stderr
        done[command] = out
    return done


def start(args, out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "oppo.sim", *map(str, args), "--out", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def kill(proc: subprocess.Popen) -> list[int]:
    """SIGKILL the command by its pid, as ``kill -9`` would. Its workers end with it (the forkserver and the
    resource tracker once they have): those of its session still alive 5 s later are returned, and ended (ours,
    by pid)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    deadline = time.monotonic() + 5
    while (left := session_processes(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def kill_mid_table(args, out: Path, table: str, at_lines: int) -> int:
    """Start the command, SIGKILL it once its journal holds ``at_lines`` results and its table is not written;
    returns the journal's lines then."""
    proc = start(args, out)
    try:
        while proc.poll() is None:
            if kept(out) >= at_lines and not (out / table).exists():
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.005)
        assert proc.wait(timeout=60) == -signal.SIGKILL, "the command ended before it was killed: make it longer"
    finally:
        left = kill(proc)
    assert not left, f"processes of the killed command left running: {left}"
    assert not (out / table).exists()
    return kept(out)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads sessions from /proc")
@pytest.mark.parametrize("command", ["sweep", "plan"])
def test_killed_mid_table_resume_writes_the_uninterrupted_table(tmp_path, uninterrupted, command):
    args = SWEEP if command == "sweep" else PLAN
    reference = uninterrupted[command]
    total = len(lines(reference))
    # a plan is killed in its second rung: the first's results decide which configurations go on, read back
    first_rung = sum("steps=40 " in entry["sim"] for entry in lines(reference)) if command == "plan" else 0
    out = tmp_path / "killed"
    killed_at = kill_mid_table((*args, *TWO), out, TABLES[command][0], first_rung + 1)
    assert 1 <= killed_at < total
    res = sim(command, "--resume", out, *ONE)
    assert res.returncode == 0, res.stderr
    assert f"{total - killed_at} simulated" in res.stderr
    same_tables(command, reference, out)
    assert len(lines(out)) == total  # each simulation once: those the journal held were not run again
    assert {e["key"]: e["result"] for e in lines(out)} == {e["key"]: e["result"] for e in lines(reference)}


@pytest.mark.parametrize("command", ["sweep", "plan"])
def test_resuming_a_finished_table_rewrites_its_bytes_without_simulating(tmp_path, uninterrupted, command):
    out = tmp_path / command
    os.symlink(uninterrupted[command], out)  # --resume a folder by another name: the same table
    before = {name: (out / name).read_bytes() for name in TABLES[command]}
    journal = (out / JOURNAL).read_bytes()
    for name in before:
        (out / name).unlink()
    res = sim(command, "--resume", out)
    assert res.returncode == 0, res.stderr
    assert f"{len(journal.splitlines())} simulations read back from {JOURNAL}, 0 simulated" in res.stderr
    assert {name: (out / name).read_bytes() for name in before} == before
    assert (out / JOURNAL).read_bytes() == journal


def test_a_journal_line_a_kill_cut_is_left_out_and_cut_off_before_the_next(tmp_path):
    with Journal(tmp_path, fresh=True) as journal:
        journal.append("a", "first", {"x": 0.1, "y": None, "p": "oppo"})
        journal.append("b", "second", {"x": 1e-300, "y": float("inf")})
    whole = (tmp_path / JOURNAL).read_bytes()
    cut = whole + b'{"key":"c","sim":"third","result":{"x":0.3'  # written in part: no closing brace, no line break
    (tmp_path / JOURNAL).write_bytes(cut)
    results, size = read_journal(tmp_path / JOURNAL)
    assert results == {"a": {"x": 0.1, "y": None, "p": "oppo"}, "b": {"x": 1e-300, "y": float("inf")}}
    assert size == len(whole)
    # a whole line that is not JSON (a disk that lost a write's end) is left out as well
    (tmp_path / JOURNAL).write_bytes(whole + b'{"key":"c","sim\n' + cut[len(whole) :])
    results, _ = read_journal(tmp_path / JOURNAL)
    assert set(results) == {"a", "b"}
    (tmp_path / JOURNAL).write_bytes(cut)
    with Journal(tmp_path, fresh=False) as journal:
        assert journal.results["a"]["x"] == 0.1
        journal.append("c", "third", {"x": 0.3})
    assert (tmp_path / JOURNAL).read_bytes() == whole + b'{"key":"c","sim":"third","result":{"x":0.3}}\n'


def test_a_cut_journal_of_a_sweep_resumes_to_its_table(tmp_path):
    out = tmp_path / "s"
    res = sim("sweep", "--setup", "tiny-cpu", "--steps", "6", "--chunks", "2,4,8,16,32", "--out", out)
    assert res.returncode == 0, res.stderr
    table, journal = (out / "sweep.csv").read_bytes(), (out / JOURNAL).read_bytes()
    whole = journal[: journal.index(b"\n", len(journal) // 2) + 1]
    (out / JOURNAL).write_bytes(whole + journal[len(whole) : len(whole) + 50])  # some whole lines and a part
    (out / "sweep.csv").unlink()
    res = sim("sweep", "--resume", out)
    assert res.returncode == 0, res.stderr
    held = len(whole.splitlines())
    assert 0 < held < 5 and f"{held} simulations read back from {JOURNAL}, {5 - held} simulated" in res.stderr
    assert (out / "sweep.csv").read_bytes() == table
    assert sorted((out / JOURNAL).read_bytes().splitlines()) == sorted(journal.splitlines())


@pytest.mark.parametrize(
    "command, extra, message",
    [
        ("sweep", ("--steps", "20"), "--steps 20 (began with 500) would make another table"),
        ("sweep", ("--chunks", "100,200"), "--chunks 100,200 (began with 100,150,200,250,300,350,400,450)"),
        ("sweep", ("--delta-max", "3"), "--delta-max 3 (began without it) would make another table"),
        ("plan", ("--budget", "60"), "--budget 60 (began with 40)"),
        ("plan", ("--no-memory-screen",), "--no-memory-screen True (began with False)"),
        ("plan", ("--policies", "sync,oppo"), "--policies sync,oppo (began with sync,oppo,april)"),
        ("sweep", ("--out", "elsewhere"), "--out elsewhere is another folder"),
    ],
)
def test_resume_with_another_table_s_option_is_refused_in_one_line(uninterrupted, command, extra, message):
    folder = uninterrupted[command]
    journal = (folder / JOURNAL).read_bytes()
    res = sim(command, "--resume", folder, *extra)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert (folder / JOURNAL).read_bytes() == journal


def test_a_plan_does_not_resume_a_sweep(uninterrupted):
    res = sim("plan", "--resume", uninterrupted["sweep"])
    assert res.returncode == 2 and "a sweep began there (python -m oppo.sim sweep --resume" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_the_options_it_began_with_and_where_the_simulations_run_are_taken(uninterrupted):
    folder = uninterrupted["sweep"]
    res = sim("sweep", "--resume", folder, "--steps", "500", "--chunks", "100,150,200,250,300,350,400,450")
    assert res.returncode == 0, res.stderr  # given as it began: the same table
    res = sim("sweep", "--resume", folder, "--workers", "1", "--out", folder)
    assert res.returncode == 0, res.stderr


def test_nothing_to_resume_is_said_in_one_line(tmp_path):
    res = sim("sweep", "--resume", tmp_path)
    assert res.returncode == 2 and "no table to finish there" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = sim("plan")
    assert res.returncode == 2 and "plan needs --out DIR (or --resume DIR" in res.stderr


def test_an_edited_input_is_refused(tmp_path):
    trace = tmp_path / "lengths.csv"
    trace.write_text("response_tokens\n10\n20\n300\n")
    out = tmp_path / "s"
    res = sim("sweep", "--setup", "tiny-cpu", "--steps", "3", "--chunks", "2,4", "--lengths", trace, "--out", out)
    assert res.returncode == 0, res.stderr
    trace.write_text("response_tokens\n10\n20\n301\n")
    res = sim("sweep", "--resume", out)
    assert res.returncode == 2 and "changed since the table began" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_new_run_in_the_folder_starts_a_new_journal(tmp_path):
    out = tmp_path / "s"
    args = ("sweep", "--setup", "tiny-cpu", "--steps", "3", "--out", out)
    assert sim(*args, "--chunks", "2,4,8").returncode == 0
    assert sim(*args, "--chunks", "2,4").returncode == 0
    assert len(lines(out)) == 2
    assert json.loads((out / COMMAND).read_text())["options"]["chunks"] == "2,4"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads sessions from /proc")
@pytest.mark.parametrize("command", ["sweep", "plan"])
def test_killed_at_random_instants_resume_writes_the_uninterrupted_table(tmp_path, uninterrupted, command, capsys):
    args = SWEEP if command == "sweep" else PLAN
    reference, rng, outcomes = uninterrupted[command], random.Random(7), Counter()
    total = len(lines(reference))
    # how long the command takes here as a process, from its start and from its first simulation (command.json)
    began, whole = time.monotonic(), start((*args, *TWO), tmp_path / "whole")
    while not (tmp_path / "whole" / COMMAND).exists() and whole.poll() is None:
        time.sleep(0.005)
    simulating = time.monotonic()
    assert whole.wait(timeout=600) == 0
    whole.stderr.close()
    took_s, simulated_s = time.monotonic() - began, time.monotonic() - simulating
    for attempt in range(12):  # killed at a random instant of the whole command, or of its simulations
        out = tmp_path / str(attempt)
        proc = start((*args, *TWO), out)
        try:
            if attempt % 2:
                while not (out / COMMAND).exists() and proc.poll() is None:
                    time.sleep(0.005)
            time.sleep(rng.uniform(0.0, simulated_s if attempt % 2 else took_s))
        finally:
            left = kill(proc)
        assert not left, f"processes of the killed command left running: {left}"
        held = kept(out)
        res = sim(command, "--resume", out, *ONE)
        if not (out / COMMAND).exists():  # killed before its first simulation began: nothing to finish
            assert res.returncode == 2 and "no table to finish there" in res.stderr, res.stderr
            outcomes["before the first simulation"] += 1
            continue
        assert res.returncode == 0, res.stderr
        same_tables(command, reference, out)
        assert len(lines(out)) == total
        outcomes["table already written" if held == total else f"{'some' if held else 'no'} results kept"] += 1
    with capsys.disabled():
        print(f"\n{command} ({took_s:.1f} s, {simulated_s:.1f} s simulating) killed 12 times: {dict(outcomes)}")
    assert sum(outcomes.values()) == 12
