"""Every plot function writes a non-empty PNG."""

import pytest

from oppo.records import plots
from oppo.records.schema import StepRecord, TraceRow


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


def test_a_plot_that_fails_leaves_no_figure_open(tmp_path):
    """The plots draw on figures of their own, in no global registry: one that fails midway leaks nothing (a
    long sweep or notebook would otherwise pile figures up in pyplot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    with pytest.raises(AttributeError):
        plots.reward_curves({"sync": [object()]}, tmp_path / "r.png")
    assert plt.get_fignums() == before


def test_staleness_labels_do_not_overlap():
    """Policies at (nearly) the same point, as inter / oppo and sync / intra are on the 7B preset: every label
    box is apart from every other."""
    points = {
        "sync": (0.0, 1.0),
        "intra": (0.0, 0.998),
        "inter": (0.231, 1.82),
        "oppo": (0.231, 1.81),
        "april": (0.249, 1.881),
        "tppo": (0.594, 1.704),
        "tailbatch": (0.018, 1.542),
        "async": (0.995, 1.103),
    }
    rows = [
        {"policy": p, "samples_speedup": y, "mean_lag": x, "p99_lag": 2 * x, "mean_util": 0.8}
        for p, (x, y) in points.items()
    ]
    fig = plots.staleness_figure(rows, "overlap")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    texts = [t for t in ax.texts if t.get_text() in points]
    assert sorted(t.get_text() for t in texts) == sorted(points)
    boxes = [t.get_window_extent(renderer) for t in texts]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (texts[boxes.index(a)].get_text(), texts[boxes.index(b)].get_text())
