"""GRPO on a task with answers, side by side: TRL 1.12's GRPOTrainer, oppo.exec sync and oppo.exec oppo on the same
model, data, reward function, group size, lengths, sampling and CPU threads, natural lengths.

    python -m oppo.exec.tasks.arithmetic --out data/add
    python benchmarks/trl_grpo.py --data data/add/train.jsonl --val-data data/add/val.jsonl --reward-fn gsm8k \\
        --steps 30 --eval-every 10 --out runs/bench-grpo

``--variants sync,oppo,sync@vllm,oppo@vllm`` adds the runs that generate on vLLM's engine. With ``--repeats R`` the
runs go round R times, interleaved (each round starts with the next run), so that the machine's drift and the order
fall on all of them alike.
Prints per run: median step time over the rounds (steps 1..; spread: the 25th-75th percentiles), its ratio to
TRL's (the median of the rounds' ratios, and their range), samples trained per second, and held-out greedy accuracy
before training and at each evaluation against the run's clock (evaluation time excluded). Writes
``OUT/grpo_side_by_side.csv`` (one row per round, run and evaluation).
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

from oppo.exec.baselines.trl_grpo import run_trl_grpo  # noqa: E402
from oppo.exec.learning import add_study_args, study_from  # noqa: E402
from oppo.exec.train import train  # noqa: E402


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


TRL = "TRL GRPOTrainer"


def one_run(name: str, study, seed: int, out: Path) -> tuple[list[float], list[tuple[int, float, float]]]:
    """One run: (step seconds, held-out points)."""
    if name == TRL:
        trl = run_trl_grpo(study.config("sync", seed), eval_every=study.eval_every)
        points = [(p.step, p.wall_s, p.held_out_accuracy) for p in trl if np.isfinite(p.held_out_accuracy)]
        return list(np.diff([p.wall_s for p in trl])), points
    variant = name.split()[-1]
    folder = out / variant.replace("@", "-")
    train(dataclasses.replace(study.config(variant, seed), save_every=0), folder)
    return oppo_points(folder)


def one_round(
    runs: tuple[str, ...], study, seed: int, out: Path, first: int
) -> dict[str, tuple[list[float], list[tuple[int, float, float]]]]:
    """The runs, one after another from the ``first``-th (rounds rotate it: no run always goes first)."""
    order = runs[first:] + runs[:first]
    done = {name: one_run(name, study, seed, out) for name in order}
    return {name: done[name] for name in runs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_study_args(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats", type=int, default=1, help="rounds of the three runs, interleaved, each round starting one later"
    )
    parser.add_argument(
        "--variants",
        default="sync,oppo",
        help="oppo.exec runs beside TRL's: sync, oppo, ... each optionally @vllm (generation on vLLM's engine)",
    )
    parser.add_argument("--out", default="runs/bench-grpo")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    study, out = study_from(args), Path(args.out)
    runs = (TRL, *(f"oppo.exec {v}" for v in args.variants.split(",")))
    rounds = [one_round(runs, study, args.seed, out / f"round{r}", r % len(runs)) for r in range(args.repeats)]
    samples = study.batch * study.group_size
    shape = f"{study.batch} prompts x {study.group_size} samples, cap {study.max_new_tokens}"
    print(f"\n{study.preset}: {shape}, {study.steps} steps, {args.repeats} interleaved round(s)")
    print(
        f"{'run':<23} {'step s (p25-p75)':>20} {'vs TRL (range)':>18} {'samples/s':>10}  "
        "held-out accuracy at (updates, clock s), first round"
    )
    rows = []
    for name in rounds[0]:
        t = np.concatenate([np.asarray(runs[name][0][1:]) for runs in rounds])  # the first step warms up
        median, p25, p75 = np.median(t), np.percentile(t, 25), np.percentile(t, 75)
        # each round's ratio of medians: drift of the machine between rounds moves all three runs of a round alike
        ratios = [np.median(runs[TRL][0][1:]) / np.median(runs[name][0][1:]) for runs in rounds]
        vs = f"{np.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        curve = ", ".join(f"{acc:.2f} ({n}, {clock:.0f})" for n, clock, acc in rounds[0][name][1])
        print(f"{name:<23} {median:>8.2f} ({p25:.2f}-{p75:.2f}) {vs:>18} {samples / median:>10.2f}  {curve}")
        rows += [
            {"run": name, "round": r, "updates": n, "clock_s": clock, "held_out_accuracy": acc}
            for r, runs in enumerate(rounds)
            for n, clock, acc in runs[name][1]
        ]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "grpo_side_by_side.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["run", "round", "updates", "clock_s", "held_out_accuracy"])
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
