"""A table's journal: ``sweep`` and ``plan`` append each simulation's result to ``DIR/journal.jsonl`` as it comes
back, so that a command killed mid-table (SIGKILL, a lost machine, a power cut) is finished by ``--resume DIR``,
which simulates only what the journal lacks and writes the table an uninterrupted run writes, byte for byte.

Format: one JSON object a line, ``{"key": ..., "sim": ..., "result": {...}}``, written whole, flushed and fsynced
before the next simulation is recorded. ``key`` is the sha256 of what decides the result: what the command computes
of a simulation (``what``: a sweep's row, a plan's summary) and the simulation's config as its ``config.json``
stores it (schedule, whole setup, steps, seed, async's options, the length trace's path and content digest:
:func:`~oppo.sim.study.experiments.config_dict`). A simulation is deterministic for those, so a result found under
its key is the result it would give again. ``sim`` names it for a reader (policy, knobs, steps, seed); ``result``
holds plain JSON values (numpy scalars as Python's; a float's repr read back is the same float). A line a kill cut
(no line break at its end, or not JSON) is left out when read, and cut off before the next line is appended.

The table is always computed from the results as read back from their lines, whether simulated by this process or
an earlier one: an interrupted and resumed table and an uninterrupted one are made of the same values.

``DIR/command.json`` holds the command's resolved options (written before its first simulation, atomically), which
``--resume`` reads back: see :mod:`oppo.sim.cli`."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oppo.cli import Interrupted
from oppo.records.io import fsync_path
from oppo.sim.study.pool import IN_PROCESS, Pool, evaluate

JOURNAL = "journal.jsonl"
COMMAND = "command.json"


def digest(value: Any) -> str:
    """The sha256 of ``value`` as canonical JSON (sorted keys, tuples as lists, numpy scalars as Python's)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=plain)
    return hashlib.sha256(text.encode()).hexdigest()


def plain(value: Any) -> Any:
    """A JSON encoder's fallback: numpy scalars and arrays as Python values, sets as lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_journal(path: str | Path) -> tuple[dict[str, Any], int]:
    """The results of a journal by key, and how many bytes of it are whole lines (a kill may have cut the last)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}, 0
    whole = data[: data.rfind(b"\n") + 1]  # a last line without its line break was cut: left out
    results: dict[str, Any] = {}
    for line in whole.splitlines():
        try:
            entry = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # not written whole (a disk that lost the end of a write): simulated again
        if isinstance(entry, dict) and isinstance(entry.get("key"), str) and "result" in entry:
            results[entry["key"]] = entry["result"]
    return results, len(whole)


class Journal:
    """The journal of ``folder``: ``fresh`` starts it empty (a new command), else it holds what an interrupted
    command recorded (``--resume``). ``begin`` is called once, before the first simulation is recorded (a new
    command writes its ``command.json`` there: an option refused before any simulation leaves no folder).
    ``resume`` is the command line that finishes the table (said when Ctrl-C stops it)."""

    def __init__(self, folder: str | Path, fresh: bool, begin: Callable[[], None] | None = None, resume: str = ""):
        self.folder = Path(folder)
        self.path = self.folder / JOURNAL
        self.fresh = fresh
        self.results, self._whole = ({}, 0) if fresh else read_journal(self.path)
        self._begin = begin
        self._fd: int | None = None
        self.resume = resume
        self.reused = 0  # simulations whose results were read back from the journal, not simulated
        self.simulated = 0  # simulations this process ran and recorded

    def evaluate(
        self,
        fn: Callable[[Any], Any],
        items: Sequence[Any],
        keys: Sequence[str],
        labels: Sequence[str],
        pool: Pool = IN_PROCESS,
        desc: str = "sims",
    ) -> list:
        """``[fn(item) for item in items]`` as read back from the journal: the items whose key it holds are not
        simulated; the others are (once per key, in the items' order, where ``pool`` says), each recorded as it
        comes back."""
        todo: dict[str, int] = {}  # key -> its first item
        for i, key in enumerate(keys):
            if key not in self.results and key not in todo:
                todo[key] = i
        self.reused += len(items) - len(todo)
        if todo:
            first = list(todo.values())
            self._open()
            held = len(self.results)

            def record(j: int, result: Any) -> None:
                self.append(keys[first[j]], labels[first[j]], result)

            try:
                evaluate(fn, [items[i] for i in first], pool, desc, done=record)
            except Interrupted:
                kept = len(read_journal(self.path)[0])  # on disk: Ctrl-C may stop the bookkeeping of a line written
                done = kept - held
                raise Interrupted(
                    f"{done} of {len(first)} simulations had finished, the other {len(first) - done} were cancelled; "
                    f"nothing of the table is written yet: the {kept} finished are kept in {self.path}"
                    + (f", `{self.resume}` finishes it" if self.resume else "")
                ) from None
        return [self.results[key] for key in keys]

    def append(self, key: str, label: str, result: Any) -> Any:
        """Record ``result`` under ``key`` (flushed to disk before returning); returns it as read back."""
        self._open()
        line = json.dumps({"key": key, "sim": label, "result": result}, separators=(",", ":"), default=plain)
        data = (line + "\n").encode()
        view = memoryview(data)
        while view:  # one write() may write less than asked
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)
        self.results[key] = json.loads(line)["result"]
        self.simulated += 1
        return self.results[key]

    def _open(self) -> None:
        if self._fd is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._begin is not None:
            self._begin()
        new = not self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.ftruncate(self._fd, 0 if self.fresh else self._whole)  # a line a kill cut is cut off before appending
        os.fsync(self._fd)
        if new:
            fsync_path(self.folder)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
