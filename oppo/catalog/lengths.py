"""Response-length traces: plain or gzipped CSV with a ``response_tokens`` column (optional ``prompt_tokens``)."""

from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import ClassVar

import numpy as np

from oppo.data import TRACES, data_dir, sources_of, trace_path


@dataclass(frozen=True)
class LengthTrace:
    """Token counts of real responses (and their prompts when the trace has them)."""

    name: str
    response_tokens: np.ndarray  # (N,) int64, >= 0
    prompt_tokens: np.ndarray | None  # (N,) int64 or None
    ordered: bool = False  # replay rows in order (the i-th admitted sequence gets row i), not sampled
    prompt_ids: np.ndarray | None = None  # (N,) int64 codes of the 'prompt_id' column: rows of one prompt
    path: str | None = None  # the file or bundled name it was loaded from (None: built in memory)
    model: str | None = None  # the 'model' column value it was filtered to

    NO_SOURCE: ClassVar[dict] = {"lengths": None, "lengths_model": None, "sources": {}}  # none, or in memory

    def source(self) -> dict:
        """What a run's config stores to load this trace again: path, model filter, content digest."""
        if self.path is None:
            return dict(self.NO_SOURCE)
        return {"lengths": self.path, "lengths_model": self.model, "sources": sources_of({"lengths": self.path})}

    @cached_property
    def _prompt_groups(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows sorted by prompt, and for each sorted row its prompt's first position and row count (once)."""
        order = np.argsort(self.prompt_ids, kind="stable")
        sorted_ids = self.prompt_ids[order]
        return order, np.searchsorted(sorted_ids, sorted_ids), np.bincount(self.prompt_ids)[sorted_ids]

    def sample(self, rng: np.random.Generator, n: int, start: int = 0, group_size: int = 1):
        """``n`` rows: drawn with replacement, or rows ``start .. start+n`` (cycling) of an ordered trace.
        With ``group_size`` G > 1 and prompt ids, each G consecutive rows are responses to one prompt (drawn
        with replacement among that prompt's rows). Returns (response lengths, prompt lengths or None)."""
        if self.ordered:
            idx = (start + np.arange(n)) % len(self.response_tokens)
        elif group_size > 1 and self.prompt_ids is not None:
            order, first, count = self._prompt_groups
            anchor = rng.integers(0, len(order), size=n // group_size)  # a prompt, weighted by its rows
            pick = first[anchor].repeat(group_size) + (rng.random(n) * count[anchor].repeat(group_size)).astype(int)
            idx = order[pick]
        else:
            idx = rng.integers(0, len(self.response_tokens), size=n)
        prompts = None if self.prompt_tokens is None else self.prompt_tokens[idx]
        return self.response_tokens[idx], prompts


def load_lengths(path: str | Path, model: str | None = None) -> LengthTrace:
    """Load a length trace: a CSV file, or a bundled trace by name (``alpaca_eval``, ``gsm8k``,
    ``hh_rlhf_harmless``); ``model`` keeps only rows of that ``model`` column value (AlpacaEval has 225).

    Raises ``ValueError`` naming the file and the problem: missing column, empty, non-numeric or negative.
    """
    path = trace_path(path)
    if not path.is_file():
        raise FileNotFoundError(f"lengths file not found: {path} (bundled traces: {', '.join(TRACES)})")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", newline="") as fh:
            reader = csv.reader(io.StringIO(fh.read()))
            header = next(reader, [])
            rows = [row for row in reader if row]  # blank lines skipped, as csv.DictReader does
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ValueError(f"{path}: not a readable CSV ({err})") from None
    if not rows or "response_tokens" not in header:
        columns = ", ".join(dict.fromkeys(header)) if rows else "none"
        raise ValueError(f"{path}: needs a 'response_tokens' column (found: {columns})")
    if model is not None:
        at = header.index("model") if "model" in header else None
        rows = [r for r in rows if at is not None and at < len(r) and r[at] == model]
        if not rows:
            raise ValueError(f"{path}: no rows with model={model!r}")
    width = len(header)
    rows = [r if len(r) >= width else r + [""] * (width - len(r)) for r in rows]  # a short row: empty cells
    index = {name: i for i, name in enumerate(header)}  # a repeated name: its last column, as DictReader
    columns = {name: [r[i] for r in rows] for name, i in index.items() if name != "model"}
    response = _column(path, columns["response_tokens"], "response_tokens")
    prompt = _column(path, columns["prompt_tokens"], "prompt_tokens") if "prompt_tokens" in columns else None
    prompt_ids = None
    if "prompt_id" in columns:  # codes 0..P-1 of the prompt each row answers
        prompt_ids = np.unique(columns["prompt_id"], return_inverse=True)[1].astype(np.int64)
    bundled = path.resolve().parent == data_dir().resolve()
    stored = path.name if bundled else str(path.resolve())  # a bundled trace resolves from any directory
    return LengthTrace(path.name.split(".")[0], response, prompt, prompt_ids=prompt_ids, path=stored, model=model)


def _column(path: Path, texts: list[str], name: str) -> np.ndarray:
    """A column's cells as non-negative integers, parsed in one pass (C ``float`` over the column); a bad value
    is located by :func:`_first_bad`, which raises the message naming its row."""
    try:
        values = np.fromiter(map(float, texts), np.float64, len(texts))
    except ValueError:
        _first_bad(path, texts, name)
    if not np.all(np.isfinite(values) & (values >= 0) & (values == np.floor(values))):
        _first_bad(path, texts, name)
    return values.astype(np.int64)


def _first_bad(path: Path, texts: list[str], name: str) -> None:
    """Raise for the first value of a column that is empty, non-numeric, negative or not an integer."""
    for i, raw in enumerate(texts):
        text = raw.strip()
        try:
            value = float(text)
        except ValueError:
            what = "empty" if not text else f"non-numeric {text!r}"
            raise ValueError(f"{path}: row {i + 2}: {what} value in column {name!r}") from None
        if not 0 <= value < float("inf") or value != int(value):  # negative, nan, inf or fractional
            raise ValueError(f"{path}: row {i + 2}: {name} must be a non-negative integer, got {text!r}")
