"""Reading and writing a run's record files: CSV rows of the record types, JSON written atomically."""

from __future__ import annotations

import csv
import dataclasses
import fcntl
import json
import operator
import os
import typing
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from oppo.records.optrace import CSV_SPECIAL, OpTrace
from oppo.records.perfetto import trace_events
from oppo.records.schema import StepRecord, TraceRow, TrainedColumns, TrainedSeq


def field_names(cls: type) -> list[str]:
    """Columns of a record type: a NamedTuple (the high-volume records) or a dataclass."""
    return list(cls._fields) if hasattr(cls, "_fields") else [f.name for f in dataclasses.fields(cls)]


def write_rows(path: str | Path, rows: Iterable[Any], cls: type) -> None:
    """Write dataclass rows to CSV atomically (a temporary file renamed into place: never a half file).

    Values are written as Python prints them (floats: shortest repr, exact round trip; bools: True/False). The
    rows become tuples in C (``attrgetter``) and the csv module formats them in C: ~1 s per million rows; a
    NamedTuple's rows go through one ``%`` format instead, the same bytes in half the time (records held by column,
    :class:`~oppo.records.schema.TrainedColumns`, as plain tuples); an :class:`~oppo.records.optrace.OpTrace`
    formats each operation once for all its devices, the same bytes again."""
    lines = rows.csv_lines() if isinstance(rows, OpTrace) else None
    if lines is None and (line := _line_format(cls, rows)) is not None:
        lines = map(line.__mod__, rows.tuples() if isinstance(rows, TrainedColumns) else rows)
    names = field_names(cls)
    with _replacing(path) as fh:
        writer = csv.writer(fh)
        writer.writerow(names)
        if lines is not None:
            fh.writelines(lines)
        else:  # NamedTuple rows are already tuples in column order; dataclass rows become tuples in C
            writer.writerows(rows if hasattr(cls, "_fields") else map(operator.attrgetter(*names), rows))


@contextmanager
def _replacing(path: str | Path) -> Iterator[TextIO]:
    """A text file written beside ``path``, flushed to disk and renamed onto it once complete (removed if writing
    fails): a kill or a power cut at any instant leaves the old file or the new one, never a part."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", newline="") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_path(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def fsync_path(path: str | Path) -> None:
    """Flush ``path`` to disk: a file's content, or a folder's entries (a file created or renamed in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


LOCK = ".oppo.lock"


@contextmanager
def one_writer(folder: str | Path) -> Iterator[None]:
    """Hold ``folder`` (created if needed) for this process while it writes there: a second process given the same
    folder is refused in one line (``ValueError``) while this one lives. The lock is the kernel's (``flock`` on
    ``folder/.oppo.lock``): it dies with its process, SIGKILL included, so a folder a killed run left is taken over.
    A command that fails before writing anything in a folder it created leaves no folder behind."""
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ValueError(f"{folder} is being written by another process (pid {holder}): give another --out") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    except BaseException:
        if created and {p.name for p in folder.iterdir()} <= {LOCK}:  # refused before writing: leave no folder
            (folder / LOCK).unlink(missing_ok=True)
            folder.rmdir()
        raise
    finally:
        os.close(fd)  # releases the lock


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a sibling file renamed onto it: a reader sees the old file or the new."""
    with _replacing(path) as fh:
        fh.write(text)


def _line_format(cls: type, rows: Iterable[Any]) -> str | None:
    """A ``%`` format writing a NamedTuple row as the csv module does, or None where it would not.

    The csv module writes a float by ``repr``, None as nothing and anything else by ``str``, unquoted unless the
    text holds a comma, a quote or a line break. The format does the same for a type whose fields are int,
    float, bool or str (int and bool fields hold no None) where every float column holds floats or ints and no str
    column's value holds such a character (checked over the distinct values: a few per column).
    """
    if not hasattr(cls, "_fields") or not isinstance(rows, Sequence):
        return None
    hints = typing.get_type_hints(cls)
    kinds = [hints[name] for name in cls._fields]
    if not set(kinds) <= {int, float, bool, str}:
        return None
    for k, kind in enumerate(kinds):
        column = map(operator.itemgetter(k), rows)
        if kind is float and not set(map(type, column)) <= {float, int}:  # the csv module: repr for a float only
            return None  # (an int's repr is its str: a clock's first reading, 0, is one)
        texts = set(column) if kind is str else ()
        if any(not isinstance(v, str) or not CSV_SPECIAL.isdisjoint(v) for v in texts):
            return None
    return ",".join("%r" if kind is float else "%s" for kind in kinds) + "\r\n"


def read_rows(path: str | Path, cls: type) -> list[Any]:
    """Read a CSV written by :func:`write_rows` back into dataclass rows."""
    hints = typing.get_type_hints(cls)
    kinds = {name: hints[name].__name__ for name in field_names(cls)}
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = set(kinds) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        return [cls(**{k: _parse(kinds[k], row[k]) for k in kinds}) for row in reader]


def write_json(path: str | Path, data: dict[str, Any], compact: bool = False) -> None:
    """Write JSON atomically; ``compact`` for machine-read files (no indentation)."""
    text = (
        json.dumps(data, separators=(",", ":"), default=_jsonable)
        if compact
        else json.dumps(data, indent=2, default=_jsonable)
    )
    with _replacing(path) as fh:
        fh.write(text + "\n")


def _parse(kind: Any, text: str) -> Any:
    kind = str(kind)
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        return text in ("1", "True", "true")
    return text


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.integer | np.floating):
        return value.item()
    if isinstance(value, tuple | set):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_run(
    out: str | Path,
    steps: Sequence[StepRecord],
    trace: Sequence[TraceRow],
    trained: Sequence[TrainedSeq],
    summary: dict[str, Any],
) -> None:
    """Write the run's four files to ``out`` (created if needed)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / "steps.csv", steps, StepRecord)
    write_rows(out / "trace.csv", trace, TraceRow)
    write_rows(out / "sequences.csv", trained, TrainedSeq)
    write_json(out / "trace.json", trace_events(trace), compact=True)  # open in https://ui.perfetto.dev
    write_json(out / "summary.json", summary)
