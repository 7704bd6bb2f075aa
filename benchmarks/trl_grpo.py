"""GRPO on a task with answers, side by side: TRL 1.12's GRPOTrainer, oppo.exec sync and oppo.exec oppo on the same
model, data, reward function, group size, lengths, sampling and CPU threads, natural lengths.

    python -m oppo.exec.arithmetic --out data/add
    python benchmarks/trl_grpo.py --data data/add/train.jsonl --val-data data/add/val.jsonl --reward-fn gsm8k \\
        --steps 30 --eval-every 10 --out runs/bench-grpo

Prints per run: median step time (steps 1..; spread: the 25th-75th percentiles), its ratio to TRL's, samples
trained per second, and held-out greedy accuracy before training and at each evaluation against the run's clock
(evaluation time excluded). Writes ``OUT/grpo_side_by_side.csv`` (one row per run and evaluation).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oppo.exec.learning import add_study_args, study_from  # noqa: E402
from oppo.exec.train import train  # noqa: E402
from oppo.exec.trl_grpo import run_trl_grpo  # noqa: E402


def oppo_points(out: Path) -> tuple[list[float], list[tuple[int, float, float]]]:
    """(step seconds, [(updates, clock s, held-out accuracy)]) of an oppo.exec run's records."""
    with open(out / "steps.csv") as fh:
        steps = list(csv.DictReader(fh))
    with open(out / "metrics.csv") as fh:
        metrics = list(csv.DictReader(fh))
    start = json.loads((out / "summary.json").read_text()).get("held_out_start", {}).get("rule_score", np.nan)
    points = [(0, 0.0, start)]
    for s, m in zip(steps, metrics):
        if m["held_out_rule_score"] not in ("", "nan"):
            points.append((int(s["step"]) + 1, float(s["end_s"]), float(m["held_out_rule_score"])))
    return [float(s["step_s"]) for s in steps], points


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_study_args(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench-grpo")
    args = parser.parse_args(argv)
    study, out = study_from(args), Path(args.out)
    runs: dict[str, tuple[list[float], list[tuple[int, float, float]]]] = {}
    trl = run_trl_grpo(study.config("sync", args.seed), eval_every=study.eval_every)
    wall = [p.wall_s for p in trl]
    runs["TRL GRPOTrainer"] = (
        list(np.diff(wall)),
        [(p.step, p.wall_s, p.held_out_accuracy) for p in trl if np.isfinite(p.held_out_accuracy)],
    )
    for policy in ("sync", "oppo"):
        train(dataclasses.replace(study.config(policy, args.seed), save_every=0), out / policy)
        runs[f"oppo.exec {policy}"] = oppo_points(out / policy)
    samples = study.batch * study.group_size
    base = float(np.median(runs["TRL GRPOTrainer"][0][1:]))
    shape = f"{study.batch} prompts x {study.group_size} samples, cap {study.max_new_tokens}"
    print(f"\n{study.preset}: {shape}, {study.steps} steps")
    print(
        f"{'run':<18} {'step s (p25-p75)':>20} {'vs TRL':>7} {'samples/s':>10}  held-out accuracy at (updates, clock s)"
    )
    rows = []
    for name, (times, points) in runs.items():
        t = np.asarray(times[1:])
        median, p25, p75 = np.median(t), np.percentile(t, 25), np.percentile(t, 75)
        curve = ", ".join(f"{acc:.2f} ({n}, {clock:.0f})" for n, clock, acc in points)
        print(
            f"{name:<18} {median:>8.2f} ({p25:.2f}-{p75:.2f}) {base / median:>6.2f}x {samples / median:>10.2f}  {curve}"
        )
        rows += [{"run": name, "updates": n, "clock_s": clock, "held_out_accuracy": acc} for n, clock, acc in points]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "grpo_side_by_side.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["run", "updates", "clock_s", "held_out_accuracy"])
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
