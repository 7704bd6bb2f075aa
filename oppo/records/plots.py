"""Plots shared by the CLIs and notebooks. Each function writes a PNG and returns its path.

Imported lazily by the commands (matplotlib is not part of the scheduling core).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from oppo.records.io import fsync_path
from oppo.records.optrace import rows_of_steps, rows_per_step
from oppo.records.schema import PHASES, StepRecord, TraceRow

PHASE_COLORS = dict(zip(PHASES, ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#999999")))


def _subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], **kwargs):
    """``pyplot.subplots`` without pyplot: a figure of its own on an Agg canvas, in no global registry (nothing to
    close, nothing left open when a plot fails; and pyplot's import is skipped)."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)  # the figure's canvas: renders text extents (label placement) and the PNG
    return fig, fig.subplots(nrows, ncols, **kwargs)


def _save(fig, path: str | Path) -> Path:
    """The figure as a PNG written beside ``path`` (its suffix kept: matplotlib reads the format from it), flushed to
    disk and renamed onto it: a kill leaves the old plot or the new, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.tight_layout()
    try:
        fig.savefig(tmp, dpi=110)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_path(path.parent)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def timeline(trace: Sequence[TraceRow], path: str | Path, steps: Sequence[int] | None = None, title: str = "") -> Path:
    """One lane per device, one bar per operation coloured by phase, for the chosen steps (default: first 3)."""
    chosen = set(steps if steps is not None else sorted(rows_per_step(trace))[:3])
    rows = rows_of_steps(trace, chosen)
    devices = sorted({r.device for r in rows}, key=_device_order)
    fig, ax = _subplots(figsize=(11, 0.45 * len(devices) + 1.6))
    lane = {device: i for i, device in enumerate(devices)}
    for phase in PHASES:  # one collection of boxes per phase, every lane (bars of a lane never overlap)
        boxes = [_box(r.start_s, r.end_s, lane[r.device]) for r in rows if r.phase == phase]
        if boxes:
            ax.add_collection(PolyCollection(boxes, facecolors=PHASE_COLORS[phase], alpha=0.85))
    ax.autoscale_view()
    ax.set_yticks(range(len(devices)), devices)
    ax.set_xlabel("time (s)")
    ax.set_title(title or f"steps {sorted(chosen)}")
    handles = [Rectangle((0, 0), 1, 1, color=PHASE_COLORS[p]) for p in PHASES if any(r.phase == p for r in rows)]
    ax.legend(handles, [p for p in PHASES if any(r.phase == p for r in rows)], loc="upper right", fontsize=8)
    return _save(fig, path)


def _box(start: float, end: float, lane: int) -> list[tuple[float, float]]:
    """A bar's corners: ``start`` to ``end`` along x, 0.8 of a lane high."""
    return [(start, lane - 0.4), (start, lane + 0.4), (end, lane + 0.4), (end, lane - 0.4)]


def _device_order(device: str):
    digits = "".join(ch for ch in device if ch.isdigit())
    return (device.rstrip("0123456789"), int(digits) if digits else 0)


def utilization_bars(utils: Mapping[str, Mapping[str, float]], path: str | Path) -> Path:
    """Busy fraction per device, one group of bars per policy: ``{policy: {device: fraction}}``."""
    policies = list(utils)
    devices = sorted({d for u in utils.values() for d in u}, key=_device_order)
    fig, ax = _subplots(figsize=(max(6, len(devices) * 0.9), 3.5))
    width = 0.8 / max(len(policies), 1)
    for i, policy in enumerate(policies):
        xs = [j + i * width for j in range(len(devices))]
        ax.bar(xs, [utils[policy].get(d, 0.0) for d in devices], width, label=policy)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(devices))], devices)
    ax.set_ylabel("busy fraction")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    return _save(fig, path)


def step_breakdown(breakdowns: Mapping[str, Mapping[str, float]], path: str | Path) -> Path:
    """Stacked seconds per step by role/phase, one bar per policy: ``{policy: {"role/phase": s}}``."""
    policies = list(breakdowns)
    keys = sorted({k for b in breakdowns.values() for k in b})
    fig, ax = _subplots(figsize=(max(5, 1.2 * len(policies)), 4))
    bottom = [0.0] * len(policies)
    for n, key in enumerate(keys):
        heights = [breakdowns[p].get(key, 0.0) for p in policies]
        color = PHASE_COLORS.get(key.split("/")[-1], "#999999")
        ax.bar(policies, heights, bottom=bottom, label=key, color=color, alpha=1.0 - 0.15 * (n % 4))
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_ylabel("seconds per step (sum of operations)")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def reward_curves(runs: Mapping[str, Sequence[StepRecord]], path: str | Path, time_axis: bool = True) -> Path:
    """Mean reward per step against (simulated or wall) time, one line per run; step time below."""
    fig, (top, bottom) = _subplots(2, 1, figsize=(8, 5.5), sharex=False)
    for name, steps in runs.items():
        xs = [s.end_s for s in steps] if time_axis else [s.step for s in steps]
        top.plot(xs, [s.mean_reward for s in steps], label=name)
        bottom.plot([s.step for s in steps], [s.step_s for s in steps], label=name)
    top.set_xlabel("time (s)" if time_axis else "step")
    top.set_ylabel("mean reward")
    top.legend(fontsize=8)
    bottom.set_xlabel("step")
    bottom.set_ylabel("step time (s)")
    return _save(fig, path)


SMOOTH_STEPS = 5  # the running mean of learning_plot: one step's reward over B samples is noisy


LEARNING_MEASURES = {  # what learning_plot draws: (trained samples' column, held-out column, what it is)
    "reward": ("reward", "held_out_reward", "reward"),
    "accuracy": ("rule_score", "held_out_rule_score", "accuracy (answer check)"),
}


def learning_plot(
    runs: Mapping[str, Sequence[Sequence[Mapping]]], path: str | Path, title: str = "", measure: str = "reward"
) -> Path:
    """Learning (:mod:`oppo.exec.learning` rows, per variant a list of runs over seeds): the trained samples' reward
    or accuracy (``measure``; top, running mean) and the held-out one of the trained weights (bottom, where
    evaluated, from the scores before any update where every seed has them) against samples trained (left) and run
    seconds (right); mean line and range over seeds."""
    trained_key, held_key, name = LEARNING_MEASURES[measure]
    fig, axes = _subplots(2, 2, figsize=(11, 7.5), sharey="row")
    for variant, seeds in runs.items():
        samples = np.array([[r["samples"] for r in rows] for rows in seeds], dtype=float)  # (seeds, steps)
        seconds = np.array([[r["end_s"] for r in rows] for rows in seeds])
        trained = _running_mean(np.array([[r[trained_key] for r in rows] for rows in seeds]), SMOOTH_STEPS)
        color = _band(axes[0], variant, samples, seconds, trained, None)
        evaluated = [i for i, r in enumerate(seeds[0]) if r[held_key] is not None]  # the same steps per seed
        if evaluated:
            held = np.array([[rows[i][held_key] for i in evaluated] for rows in seeds])
            at_samples, at_seconds = samples[:, evaluated], seconds[:, evaluated]
            if all(rows[0].get("start") for rows in seeds):  # the weights before any update, at 0 samples and 0 s
                start = np.array([[rows[0]["start"][held_key]] for rows in seeds])
                zeros = np.zeros_like(start)
                held, at_samples, at_seconds = (
                    np.hstack(p) for p in ((start, held), (zeros, at_samples), (zeros, at_seconds))
                )
            _band(axes[1], variant, at_samples, at_seconds, held, color, marker="o")
    axes[0, 0].set_ylabel(f"{name} of the trained samples\n({SMOOTH_STEPS}-step mean)")
    axes[1, 0].set_ylabel(f"held-out {name} of the trained weights")
    axes[1, 0].set_xlabel("samples trained")
    axes[1, 1].set_xlabel("run seconds")
    axes[0, 0].legend(fontsize=8)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    fig.suptitle(title or "learning under staleness (mean and range over seeds)")
    return _save(fig, path)


def _running_mean(values, window: int):
    """Mean over the last ``window`` points (fewer at the start), per row. (rows, points) -> same."""
    sums = np.cumsum(values, axis=1)
    shifted = np.concatenate([np.zeros((len(values), window)), sums[:, :-window]], axis=1)[:, : values.shape[1]]
    return (sums - shifted) / np.minimum(np.arange(1, values.shape[1] + 1), window)


def _band(row, label: str, samples, seconds, values, color, marker=None):
    """``values`` (seeds, points) against samples trained (left) and against seconds (right, on a grid up to the
    time every seed reached; before a seed's first point, its first value): the mean line and the range over
    seeds. Returns the line's colour."""
    grid = np.linspace(0.0, seconds[:, -1].min(), values.shape[1])
    on_grid = np.array([np.interp(grid, t, v) for t, v in zip(seconds, values)])
    for ax, x, y in ((row[0], samples.mean(axis=0), values), (row[1], grid, on_grid)):
        (line,) = ax.plot(x, y.mean(axis=0), label=label, color=color, marker=marker, markersize=3)
        color = line.get_color()
        ax.fill_between(x, y.min(axis=0), y.max(axis=0), color=color, alpha=0.15)
    return color


def sweep_plot(
    xs: Sequence[float], ys: Sequence[float], xlabel: str, path: str | Path, ylabel: str = "mean step (s)"
) -> Path:
    fig, ax = _subplots(figsize=(6, 3.5))
    ax.plot(xs, ys, marker="o")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    best = min(range(len(ys)), key=ys.__getitem__)
    ax.annotate(f"min at {xs[best]}", (xs[best], ys[best]), textcoords="offset points", xytext=(0, 10), ha="center")
    return _save(fig, path)


def speed_vs_staleness(rows: Sequence[Mapping], path: str | Path, title: str = "") -> Path:
    """One point per policy: work done (finished trained responses per second, ratio to the baseline) against the
    mean policy lag of trained samples (the bar reaches the p99 lag), coloured by mean utilisation. Labels are
    placed so that none overlaps another. ``rows``: :func:`oppo.sim.study.experiments.compare_rows`."""
    return _save(staleness_figure(rows, title), path)


def staleness_figure(rows: Sequence[Mapping], title: str = ""):
    """The figure of :func:`speed_vs_staleness`, laid out, not saved."""
    fig, ax = _subplots(figsize=(6.5, 4.2))
    ys = [r["samples_speedup"] or 0.0 for r in rows]
    for r, y in zip(rows, ys):
        ax.plot([r["mean_lag"], r["p99_lag"]], [y] * 2, color="#999999", lw=1, zorder=1)
    points = ax.scatter(
        [r["mean_lag"] for r in rows], ys, c=[r["mean_util"] for r in rows], cmap="viridis", vmin=0, vmax=1, s=60
    )
    fig.colorbar(points, ax=ax, label="mean utilisation")
    ax.set_xlabel("policy lag of trained samples (versions): mean, bar to p99")
    ax.set_ylabel("finished samples / s over the baseline")
    ax.set_title(title or "work done against staleness")
    ax.grid(alpha=0.3)
    ax.margins(x=0.15, y=0.15)
    fig.tight_layout()
    place_labels(ax, [r["policy"] for r in rows], [(r["mean_lag"], y) for r, y in zip(rows, ys)])
    return fig


# offsets (points) tried in turn for a label, nearest first: right, above, left, below, then further out
_LABEL_OFFSETS = [(dx * k, dy * k) for k in (1, 2, 3, 4) for dx, dy in ((6, 4), (6, -12), (-6, 4), (-6, -12))] + [
    (0, 10 * k) for k in (2, 3, 4)
]


def place_labels(ax, labels: Sequence[str], xy: Sequence[tuple[float, float]]) -> list:
    """Annotate each point with its label at the first offset (``_LABEL_OFFSETS``, in order) whose box overlaps
    no label placed before it; deterministic. Returns the text artists."""
    renderer = ax.figure.canvas.get_renderer()
    placed, texts = [], []
    for label, (x, y) in zip(labels, xy):
        for dx, dy in _LABEL_OFFSETS:
            ha = "left" if dx >= 0 else "right"
            text = ax.annotate(label, (x, y), textcoords="offset points", xytext=(dx, dy), ha=ha, fontsize=9)
            box = text.get_window_extent(renderer).expanded(1.05, 1.1)
            if not any(box.overlaps(other) for other in placed):
                break
            text.remove()
        else:  # every offset taken: keep the last, drawn with a leader line
            text = ax.annotate(
                label,
                (x, y),
                textcoords="offset points",
                xytext=(dx, dy),
                ha=ha,
                fontsize=9,
                arrowprops={"arrowstyle": "-", "color": "#999999"},
            )
            box = text.get_window_extent(renderer)
        placed.append(box)
        texts.append(text)
    return texts


def plot_fidelity(measured: Mapping, predicted: Mapping, fitted: int, path: str | Path, title: str = "") -> Path:
    """Measured and predicted seconds per step, one panel per stage (and the step); the first ``fitted`` steps
    (left of the dashed line) were used to fit."""
    names = ["step", *[k for k in measured if k != "step"]]
    fig, axes = _subplots(len(names), 1, figsize=(10, 1.7 * len(names) + 0.6), sharex=True)
    for ax, name in zip(axes, names):
        ax.plot(measured[name], lw=1, color="#333333", label="measured")
        ax.plot(predicted[name], lw=1, color="#dd8452", label="predicted")
        if fitted:
            ax.axvline(fitted - 0.5, color="#999999", linestyle="--", lw=1)
        ax.set_ylabel(f"{name} (s)")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8)
    axes[0].set_title(title or "measured vs predicted")
    axes[-1].set_xlabel("logged step (fit | validate)")
    return _save(fig, path)


def fidelity_matrix(report: Mapping[str, Mapping], path: str | Path, title: str = "") -> Path:
    """Median step and stage errors per run (rows): within (the shared layer on the run's validated steps) and
    leave-one-run-out (fitted on the other runs), one heat map each, the value printed in every cell."""
    kinds = [k for k in ("within", "leave_one_out") if any(k in entry for entry in report.values())]
    runs = list(report)
    stages = (s for entry in report.values() for k in kinds for s in entry.get(k, {}).get("stages", {}))
    columns = ["step", *dict.fromkeys(stages)]
    fig, axes = _subplots(1, len(kinds), figsize=(1.1 * len(columns) * len(kinds) + 3, 0.55 * len(runs) + 1.6))
    for ax, kind in zip(np.atleast_1d(axes), kinds):
        cells = np.full((len(runs), len(columns)), np.nan)
        for i, run in enumerate(runs):
            fid = report[run].get(kind)
            for j, col in enumerate(columns):
                stat = fid and (fid["step"] if col == "step" else fid["stages"].get(col))
                if stat:
                    cells[i, j] = stat["median_abs_err"]
        ax.imshow(np.minimum(cells, 1.0), cmap="RdYlGn_r", vmin=0, vmax=1, aspect="auto")
        for (i, j), value in np.ndenumerate(cells):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.0%}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(runs)), runs if ax is np.atleast_1d(axes)[0] else [""] * len(runs), fontsize=8)
        ax.set_title(kind.replace("_", "-") + " (median error)", fontsize=10)
    fig.suptitle(title or "one framework layer across runs")
    return _save(fig, path)


def pareto_plot(
    rows: Sequence[Mapping], path: str | Path, objective: str, max_lag: float | None = None, title: str = ""
) -> Path:
    """Work per second against steady policy lag for every configuration of a plan's last rung (grey), its Pareto
    front (line, labelled) and the ``max_lag`` budget. ``rows``: :func:`oppo.sim.study.plan.plan_rows`."""
    last = max(r["steps"] for r in rows)
    final = [r for r in rows if r["steps"] == last]
    front = sorted((r for r in final if r["pareto"]), key=lambda r: r["steady_lag"])
    fig, ax = _subplots(figsize=(7, 4.5))
    ax.scatter(
        [r["steady_lag"] for r in final], [r[objective] for r in final], color="#bbbbbb", s=25, label="evaluated"
    )
    ax.plot(
        [r["steady_lag"] for r in front], [r[objective] for r in front], "o-", color="#d62728", label="Pareto front"
    )
    if max_lag is not None:
        ax.axvline(max_lag, color="#555555", ls="--", lw=1, label=f"max lag {max_lag:g}")
    ax.set_xlabel("steady mean policy lag: samples of the second half of the steps (versions)")
    ax.set_ylabel(objective.replace("_per_s", " / s"))
    ax.set_title(title or f"plan: work against staleness ({last} steps)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.margins(x=0.15, y=0.15)
    fig.tight_layout()
    labels = [
        " ".join(str(r[k]) for k in ("policy", "chunk", "delta_max", "staleness") if r[k] not in (None, ""))
        for r in front
    ]
    place_labels(ax, labels, [(r["steady_lag"], r[objective]) for r in front])
    return _save(fig, path)
