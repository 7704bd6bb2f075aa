"""Every plot function writes a non-empty PNG."""

from oppo import plots
from oppo.records import StepRecord, TraceRow


def test_plots_write_images(tmp_path):
    trace = [
        TraceRow(0, "gpu0", "actor", "decode", 0.0, 2.0, 4, 40, 100),
        TraceRow(0, "gpu1", "reward", "prefill", 0.5, 1.0, 4, 40, 0),
        TraceRow(1, "gpu0", "actor", "train_actor", 2.0, 3.0, 4, 80, 0),
    ]
    steps = [StepRecord(i, i * 3.0, i * 3.0 + 3, 3.0, 0.1 * i, 2, 8, 4, 1) for i in range(5)]
    paths = [
        plots.timeline(trace, tmp_path / "t.png"),
        plots.utilization_bars({"sync": {"gpu0": 0.5, "gpu1": 0.1}, "oppo": {"gpu0": 0.9}}, tmp_path / "u.png"),
        plots.step_breakdown({"sync": {"actor/decode": 2.0, "reward/score": 1.0}}, tmp_path / "b.png"),
        plots.reward_curves({"sync": steps, "oppo": steps[:3]}, tmp_path / "r.png"),
        plots.sweep_plot([100, 500, 1000], [3.0, 2.0, 2.5], "chunk", tmp_path / "s.png"),
    ]
    for path in paths:
        assert path.stat().st_size > 2000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
