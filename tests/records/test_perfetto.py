"""The Perfetto timeline of a run's operations."""

import pytest

from oppo.records.perfetto import trace_events
from oppo.records.schema import TraceRow


def test_trace_events_one_lane_per_device_and_whole_steps():
    rows = [
        TraceRow(s, d, "actor", "decode", s + 0.1 * i, s + 0.1 * i + 0.05, 4, 4, 0)
        for s in range(3)
        for i, d in enumerate(["gpu0", "gpu1", "gpu10", "gpu2"])
    ]
    events = trace_events(rows, max_rows=9)
    lanes = {e["args"]["name"]: e["tid"] for e in events["traceEvents"] if e["ph"] == "M"}
    assert list(lanes) == ["gpu0", "gpu1", "gpu2", "gpu10"]  # numeric order, one lane each
    ops = [e for e in events["traceEvents"] if e["ph"] == "X"]
    assert events["otherData"] == {"steps": 2, "of": 3} and len(ops) == 8  # whole steps within the bound
    assert ops[0]["ts"] == 0.0 and ops[0]["dur"] == pytest.approx(0.05e6) and ops[0]["name"] == "actor/decode"
