"""A watchdog that ends a rollout engine's processes and removes its weights file when the trainer dies without
closing the engine (SIGKILL, the kernel's OOM killer): vLLM's engine core does not watch its parent, and it would
otherwise keep its cores, its memory and a model-sized file in /dev/shm after the trainer is gone.

The trainer starts it as a script (standard library only: it imports nothing of oppo, torch or vLLM) with a pipe on
its standard input, and writes one JSON line per change of what to guard::

    {"pids": [[pid, start_ticks], ...], "remove": ["/dev/shm/oppo-weights-..."], "adopt": [pid, [pid, ...]]}

``adopt`` (while the engine starts, before its processes are known): every process that appears below the first
pid, but for the listed ones (there before), is guarded too; null once the engine's processes are named.
``done`` on a line of its own: the trainer closed the engine itself; the watchdog exits and touches nothing. The end
of its input without ``done`` means the trainer died: it ends each guarded process and its descendants (SIGTERM, then
SIGKILL after a grace period) and removes the folders. A process is recognised by its id *and* its start time (clock
ticks since boot, ``/proc/PID/stat`` field 22), so an id the system has since given to another process is left alone.
Linux only (``/proc``), as vLLM's CPU and CUDA builds are.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

GRACE_S = 5.0  # SIGTERM to SIGKILL: vLLM's engine core shuts its workers down on SIGTERM
ADOPT_POLL_S = 0.2  # how often the processes below a starting engine's trainer are looked for


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
    """The trainer's end of the watchdog: :meth:`adopt_new_children` covers an engine while it starts, :meth:`guard`
    names what to clean up if the trainer dies; :meth:`release` (at a normal close) lets the watchdog exit without
    touching anything."""

    def __init__(self) -> None:
        self.pids: list[list[int]] = []
        self.remove: list[str] = []
        self.adopt: list | None = None
        self.process = subprocess.Popen(
            [sys.executable, "-I", __file__],  # isolated: no user site, no current folder on the path
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # a Ctrl-C or a signal to the trainer's group leaves it to clean up
        )

    def adopt_new_children(self) -> None:
        """Guard every process this one starts from now until the next :meth:`guard` (an engine starting)."""
        me = os.getpid()
        self.adopt = [me, [pid for pid in descendants(me)]]
        self._tell()

    def guard(self, pids: list[int] = (), remove: list[str | Path] = ()) -> None:
        self.pids += [identity(pid) for pid in pids if start_ticks(pid) is not None]
        self.remove += [str(folder) for folder in remove]
        self.adopt = None
        self._tell()

    def _tell(self) -> None:
        self._say(json.dumps({"pids": self.pids, "remove": self.remove, "adopt": self.adopt}))

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
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read, args=(lines,), daemon=True).start()
    told = {"pids": [], "remove": [], "adopt": None}
    adopted: dict[int, int | None] = {}  # pid -> start ticks of the processes that appeared while an engine started
    while True:
        try:
            line = lines.get(timeout=ADOPT_POLL_S)
        except queue.Empty:
            line = ""
        if line == "done":  # the trainer closed the engine itself
            return
        if line is None:  # the trainer is gone
            break
        if line:
            try:
                said = json.loads(line)
                told = {"pids": list(said["pids"]), "remove": list(said["remove"]), "adopt": said.get("adopt")}
            except (ValueError, KeyError, TypeError):  # a line cut short (the trainer killed mid-write): it is gone
                break
        if told.get("adopt"):
            parent, before = told["adopt"]
            for pid in set(descendants(parent)) - set(before) - {os.getpid()}:
                adopted.setdefault(pid, start_ticks(pid))
    reap(told["pids"] + [[pid, ticks] for pid, ticks in adopted.items() if ticks is not None], told["remove"])


def _read(lines: queue.Queue) -> None:
    """Standard input's lines (stripped) into ``lines``, then None at its end."""
    for line in sys.stdin:
        lines.put(line.strip())
    lines.put(None)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer's Ctrl-C is the trainer's to handle
    main()
