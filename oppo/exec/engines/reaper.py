"""A watchdog that ends a rollout engine's processes and removes its weights file when the trainer dies without
closing the engine (SIGKILL, the kernel's OOM killer): vLLM's engine core does not watch its parent, and it would
otherwise keep its cores, its memory and a model-sized file in /dev/shm after the trainer is gone.

The trainer starts it as a script (standard library only: it imports nothing of oppo, torch or vLLM) with a pipe on
its standard input, and writes one JSON line per change of what to guard::

    {"pids": [[pid, start_ticks], ...], "remove": ["/dev/shm/oppo-weights-..."]}

``done`` on a line of its own: the trainer closed the engine itself; the watchdog exits and touches nothing. The end
of its input without ``done`` means the trainer died: it ends each guarded process and its descendants (SIGTERM, then
SIGKILL after a grace period) and removes the folders. A process is recognised by its id *and* its start time (clock
ticks since boot, ``/proc/PID/stat`` field 22), so an id the system has since given to another process is left alone.
Linux only (``/proc``), as vLLM's CPU and CUDA builds are.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 5.0  # SIGTERM to SIGKILL: vLLM's engine core shuts its workers down on SIGTERM


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot), or None if there is no such process or it has ended
    (a zombie: its parent has not collected its exit status yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (the command name) may hold spaces and parentheses: fields after it are counted from its last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else int(fields[19])


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), from /proc's parent ids."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # ended while we looked
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def identity(pid: int) -> list[int]:
    """``[pid, start_ticks]``: what the watchdog is told to guard."""
    ticks = start_ticks(pid)
    if ticks is None:
        raise ProcessLookupError(pid)
    return [pid, ticks]


def reap(guarded: list[list[int]], remove: list[str], grace_s: float = GRACE_S) -> None:
    """End the guarded processes that are still the ones named (and all below them), then remove the folders."""
    alive = [pid for pid, ticks in guarded if start_ticks(pid) == ticks]
    victims = [(pid, start_ticks(pid)) for pid in alive + [d for pid in alive for d in descendants(pid)]]
    _signal(victims, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(start_ticks(pid) == ticks for pid, ticks in victims):
        time.sleep(0.1)
    _signal(victims, signal.SIGKILL)
    for folder in remove:
        shutil.rmtree(folder, ignore_errors=True)


def _signal(victims: list[tuple[int, int | None]], sig: int) -> None:
    for pid, ticks in victims:
        if ticks is not None and start_ticks(pid) == ticks:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


class Watchdog:
    """The trainer's end of the watchdog: :meth:`guard` names what to clean up if the trainer dies; :meth:`release`
    (at a normal close) lets the watchdog exit without touching anything."""

    def __init__(self) -> None:
        self.pids: list[list[int]] = []
        self.remove: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-I", __file__],  # isolated: no user site, no current folder on the path
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # a Ctrl-C or a signal to the trainer's group leaves it to clean up
        )

    def guard(self, pids: list[int] = (), remove: list[str | Path] = ()) -> None:
        self.pids += [identity(pid) for pid in pids if start_ticks(pid) is not None]
        self.remove += [str(folder) for folder in remove]
        self._say(json.dumps({"pids": self.pids, "remove": self.remove}))

    def release(self) -> None:
        self._say("done")
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=10)

    def _say(self, line: str) -> None:
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):  # the watchdog is gone (killed with the trainer's group): nothing to say
            pass


def main() -> None:
    guarded, remove = [], []
    for line in sys.stdin:
        if line.strip() == "done":
            return
        try:
            told = json.loads(line)
            guarded, remove = told["pids"], told["remove"]
        except (ValueError, KeyError, TypeError):  # a line cut short (the trainer killed mid-write): it is gone
            break
    reap(guarded, remove)  # no "done": the trainer is gone


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer's Ctrl-C is the trainer's to handle
    main()
