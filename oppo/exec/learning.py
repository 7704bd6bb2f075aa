"""Learning under staleness: the variants a study compares (sync, oppo, async K with or without decoupled PPO),
the executor options of each, and each run's records read back as one row per step (``benchmarks/staleness.py``
and ``notebooks/async_learning.ipynb`` run them; :func:`oppo.records.plots.learning_plot` draws them)."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

VARIANTS = ("sync", "oppo", "async1", "async2", "async4", "async1-decoupled", "async2-decoupled", "async4-decoupled")
COLUMNS = ("step", "end_s", "samples", "reward", "rule_score", "held_out_reward", "held_out_rule_score")


def variant_options(name: str) -> dict[str, str]:
    """``sync``, ``oppo``, ``asyncK`` or ``asyncK-decoupled`` as executor options (option name -> value)."""
    base, _, correction = name.partition("-")
    if base.startswith("async") and base.removeprefix("async").isdigit():
        options = {"mode": "async", "staleness": base.removeprefix("async")}
    elif base in ("sync", "oppo"):
        options = {"mode": base}
    else:
        raise ValueError(f"unknown variant {name!r}: sync, oppo, asyncK or asyncK-decoupled")
    if correction not in ("", "decoupled"):
        raise ValueError(f"unknown variant {name!r}: the only correction is -decoupled")
    return options | ({"offpolicy": "decoupled"} if correction else {})


def variant_flags(name: str) -> list[str]:
    return [text for key, value in variant_options(name).items() for text in (f"--{key}", value)]


def read_run(run: Path) -> list[dict]:
    """One row per step: when it ended (run seconds), samples trained so far, the trained samples' mean reward and
    rule score, and the held-out scores of the weights after it (None: not evaluated after that step)."""
    with open(run / "steps.csv", newline="") as fh:
        steps = list(csv.DictReader(fh))
    with open(run / "metrics.csv", newline="") as fh:
        metrics = list(csv.DictReader(fh))
    rows, trained = [], 0
    for step, metric in zip(steps, metrics):
        trained += int(step["finished"])
        held = {k: float(metric[k]) for k in ("held_out_reward", "held_out_rule_score")}
        rows.append(
            {
                "step": int(step["step"]),
                "end_s": float(step["end_s"]),
                "samples": trained,
                "reward": float(step["mean_reward"]),
                "rule_score": float(metric["rule_score"]),
            }
            | {k: None if math.isnan(v) else v for k, v in held.items()}
        )
    return rows


def write_learning_csv(path: Path, runs: dict[str, list[list[dict]]]) -> None:
    """``learning.csv``: every step of every run (variant, seed, then :data:`COLUMNS`; blank: not evaluated)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["variant", "seed", *COLUMNS])
        for variant, seeds in runs.items():
            for seed, rows in enumerate(seeds):
                for r in rows:
                    writer.writerow([variant, seed, *("" if r[c] is None else r[c] for c in COLUMNS)])


def summary(runs: dict[str, list[list[dict]]], last: int = 10) -> list[dict]:
    """Per variant, lists over seeds: the mean reward of the last ``last`` steps' trained samples, the last
    held-out reward and rule score (empty where a run never evaluated), and the run's seconds."""
    table = []
    for variant, seeds in runs.items():
        evaluated = [[r for r in rows if r["held_out_reward"] is not None] for rows in seeds]
        table.append(
            {
                "variant": variant,
                "reward": [statistics.fmean(r["reward"] for r in rows[-last:]) for rows in seeds],
                "held_out_reward": [rows[-1]["held_out_reward"] for rows in evaluated if rows],
                "held_out_rule_score": [rows[-1]["held_out_rule_score"] for rows in evaluated if rows],
                "seconds": [rows[-1]["end_s"] for rows in seeds],
            }
        )
    return table
