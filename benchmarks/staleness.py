"""Learning under staleness, measured: sync, oppo and async K = 1, 2, 4 (with and without decoupled PPO) on the
same task for the same number of trained steps over several seeds, with real gradients.

    python benchmarks/staleness.py --steps 60 --seeds 3 --out runs/staleness
    python benchmarks/staleness.py --variants sync,async2,async2-decoupled --steps 30 --seeds 2

Each variant is one ``python -m oppo.exec.train --preset tiny-cpu`` run per seed, variants interleaved within a
seed. ``asyncK`` is ``--mode async --staleness K`` (in one process, generation with the weights of K versions ago:
the staleness of a rollout running K versions ahead, not its overlap); ``-decoupled`` adds ``--offpolicy
decoupled``. Prints, per variant, the reward of the last 10 steps (mean and min - max over seeds), the rule score
(the task's ground truth) and the wall time; writes ``learning.csv`` (every step of every run) and
``learning.png`` (reward against samples trained and against wall-clock seconds, mean and range over seeds).
Rewards are those of the trained (behaviour) samples: a stale learner's samples come from older weights.
"""

import argparse
import csv
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np


def variant_flags(name: str) -> list[str]:
    """``sync``, ``oppo``, ``asyncK`` or ``asyncK-decoupled`` as executor options."""
    base, _, correction = name.partition("-")
    if base.startswith("async"):
        flags = ["--mode", "async", "--staleness", base.removeprefix("async")]
    else:
        flags = ["--mode", base]
    if correction:
        if correction != "decoupled":
            raise SystemExit(f"unknown variant {name!r}")
        flags += ["--offpolicy", "decoupled"]
    return flags


def read_steps(run: Path) -> list[dict]:
    with open(run / "steps.csv", newline="") as fh:
        steps = list(csv.DictReader(fh))
    with open(run / "metrics.csv", newline="") as fh:
        metrics = list(csv.DictReader(fh))
    trained = 0
    rows = []
    for step, metric in zip(steps, metrics):
        trained += int(step["finished"])
        rows.append(
            {
                "step": int(step["step"]),
                "end_s": float(step["end_s"]),
                "samples": trained,
                "reward": float(step["mean_reward"]),
                "rule_score": float(metric["rule_score"]),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--variants", default="sync,oppo,async1,async2,async4,async1-decoupled,async2-decoupled,async4-decoupled"
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", default="runs/staleness")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    out = Path(args.out)
    runs: dict[str, list[list[dict]]] = {v: [] for v in variants}
    for seed in range(args.seeds):
        for variant in variants:  # interleaved: a slow moment of the machine falls on every variant alike
            run = out / f"{variant}-seed{seed}"
            cmd = [sys.executable, "-m", "oppo.exec.train", "--preset", "tiny-cpu", *variant_flags(variant)]
            cmd += ["--steps", str(args.steps), "--batch", str(args.batch), "--seed", str(seed), "--out", str(run)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{variant} seed {seed} failed: {done.stderr.strip().splitlines()[-1]}")
            runs[variant].append(read_steps(run))
    write_csv(out / "learning.csv", runs)
    plot(runs, out / "learning.png")
    print(f"tiny-cpu, {args.steps} steps x B {args.batch}, {args.seeds} seeds; last-10 means, [min, max] over seeds")
    print(f"{'variant':<20} {'reward':>22} {'rule score':>22} {'wall s':>8}")
    for variant, seeds in runs.items():
        reward = [statistics.fmean(r["reward"] for r in rows[-10:]) for rows in seeds]
        rule = [statistics.fmean(r["rule_score"] for r in rows[-10:]) for rows in seeds]
        wall = statistics.fmean(rows[-1]["end_s"] for rows in seeds)
        print(f"{variant:<20} {span(reward):>22} {span(rule):>22} {wall:8.1f}")
    print(f"-> {out / 'learning.csv'}, {out / 'learning.png'}")


def span(values: list[float]) -> str:
    return f"{statistics.fmean(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def write_csv(path: Path, runs: dict[str, list[list[dict]]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["variant", "seed", "step", "end_s", "samples", "reward", "rule_score"])
        for variant, seeds in runs.items():
            for seed, rows in enumerate(seeds):
                for r in rows:
                    writer.writerow([variant, seed, r["step"], r["end_s"], r["samples"], r["reward"], r["rule_score"]])


SMOOTH = 5  # steps in the plotted running mean: one step's reward over B samples is noisy


def smoothed(rewards: np.ndarray) -> np.ndarray:
    """Running mean over the last ``SMOOTH`` steps (fewer at the start), per seed. (seeds, steps) -> same."""
    sums = np.cumsum(rewards, axis=1)
    shifted = np.concatenate([np.zeros((len(rewards), SMOOTH)), sums[:, :-SMOOTH]], axis=1)[:, : rewards.shape[1]]
    counts = np.minimum(np.arange(1, rewards.shape[1] + 1), SMOOTH)
    return (sums - shifted) / counts


def plot(runs: dict[str, list[list[dict]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for variant, seeds in runs.items():
        rewards = smoothed(np.array([[r["reward"] for r in rows] for rows in seeds]))  # (seeds, steps)
        samples = np.mean([[r["samples"] for r in rows] for rows in seeds], axis=0)
        seconds = np.array([[r["end_s"] for r in rows] for rows in seeds])
        grid = np.linspace(0, seconds[:, -1].min(), len(samples))  # the time every seed reached
        on_grid = np.array([np.interp(grid, t, r) for t, r in zip(seconds, rewards)])
        for ax, x, y in ((axes[0], samples, rewards), (axes[1], grid, on_grid)):
            (line,) = ax.plot(x, y.mean(axis=0), label=variant)
            ax.fill_between(x, y.min(axis=0), y.max(axis=0), color=line.get_color(), alpha=0.15)
    axes[0].set_xlabel("samples trained")
    axes[1].set_xlabel("wall-clock seconds")
    axes[0].set_ylabel(f"reward of the trained samples\n({SMOOTH}-step mean; mean and range over seeds)")
    axes[0].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle("learning under staleness (tiny-cpu, real gradients)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
