"""One timing context manager that turns executed operations into the shared :class:`~oppo.records.schema.TraceRow`."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from oppo.records.schema import TraceRow


class Recorder:
    """Times operations in seconds since ``t0`` on the wall clock (default: construction), so that workers in
    other processes given the same ``t0`` record on the same time axis. Durations come from the monotonic
    ``perf_counter`` (it cannot go backwards), anchored to the wall clock once, when the recorder is made.
    Synchronises CUDA at the boundaries so that asynchronous kernels are counted in the operation that launched
    them."""

    def __init__(self, t0: float | None = None) -> None:
        self._wall_minus_perf = time.time() - time.perf_counter()  # the anchor: wall = perf + this
        self.t0 = self._wall_minus_perf + time.perf_counter() if t0 is None else t0
        self.rows: list[TraceRow] = []

    def now(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() + self._wall_minus_perf - self.t0

    @contextmanager
    def op(self, step: int, device: str, role: str, phase: str, batch: int = 0, tokens: int = 0, context: int = 0):
        """Time the body; it may fill in the yielded dict's ``batch``/``tokens``/``context`` once known."""
        info = {"batch": batch, "tokens": tokens, "context": context}
        _sync(device)
        start = self.now()
        yield info
        _sync(device)
        row = TraceRow(step, device, role, phase, start, self.now(), info["batch"], info["tokens"], info["context"])
        self.rows.append(row)

    @contextmanager
    def paused(self):
        """The clock stands still inside (held-out evaluation: measuring the run is not part of it). Only for a
        recorder no other process shares ``t0`` with."""
        start = time.perf_counter()
        yield
        self.t0 += time.perf_counter() - start

    def add(self, row: TraceRow) -> None:
        """A row timed elsewhere (a remote worker), already on this clock."""
        self.rows.append(row)


def _sync(device: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)  # a CPU-GPU sync point: the operation's kernels are done
