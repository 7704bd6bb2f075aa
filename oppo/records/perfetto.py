"""A run's operations as a Chrome / Perfetto trace-event timeline (``trace.json``, https://ui.perfetto.dev)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from oppo.records.optrace import devices_of, rows_of_steps, rows_per_step
from oppo.records.schema import TraceRow

TRACE_EVENTS_MAX_ROWS = 10_000  # trace.json (Perfetto) holds the first steps up to this many operations


def trace_events(trace: Sequence[TraceRow], max_rows: int = TRACE_EVENTS_MAX_ROWS) -> dict[str, Any]:
    """The operations as a Chrome / Perfetto trace-event JSON object: one lane (thread) per device, one complete
    event per operation named "role/phase", times in microseconds. Holds whole steps, the first ones, up to
    ``max_rows`` operations (``otherData.steps`` says how many)."""
    counts = rows_per_step(trace)  # ~300k rows in a long run: counted without building them where it can
    steps = sorted(counts)
    kept, total = set(), 0
    for step in steps:
        if total + counts[step] > max_rows and kept:
            break
        kept.add(step)
        total += counts[step]
    devices = sorted(devices_of(trace), key=_device_key)
    rows = rows_of_steps(trace, kept)
    lane = {d: i for i, d in enumerate(devices)}
    events: list[dict[str, Any]] = [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": i, "args": {"name": d}} for d, i in lane.items()
    ]
    events += [
        {
            "name": f"{r.role}/{r.phase}",
            "cat": r.phase,
            "ph": "X",
            "pid": 0,
            "tid": lane[r.device],
            "ts": r.start_s * 1e6,
            "dur": (r.end_s - r.start_s) * 1e6,
            "args": {"step": r.step, "batch": r.batch_size, "tokens": r.num_tokens, "context": r.context_tokens},
        }
        for r in rows
    ]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"steps": len(kept), "of": len(steps)}}


def _device_key(device: str) -> tuple[str, int]:
    match = re.fullmatch(r"([a-z:]+?)(\d+)", device.replace("cuda:", "cuda"))
    return (match.group(1), int(match.group(2))) if match else (device, 0)
