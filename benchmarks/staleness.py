"""Learning under staleness, measured: sync, oppo and async K = 1, 2, 4 (with and without decoupled PPO) on the
same task for the same number of trained steps over several seeds, with real gradients.

    python benchmarks/staleness.py --steps 60 --seeds 3 --out runs/staleness
    python benchmarks/staleness.py --variants sync,async2,async2-decoupled --steps 30 --seeds 2

Each variant is one ``python -m oppo.exec.train --preset tiny-cpu`` run per seed, variants interleaved within a
seed. ``asyncK`` is ``--policy async --staleness K`` (in one process, generation with the weights of K versions ago:
the staleness of a rollout running K versions ahead, not its overlap); ``-decoupled`` adds ``--offpolicy
decoupled``. Every ``--eval-every`` steps each run scores its trained weights on the same held-out prompts
(``--eval-every`` of the executor: fixed prompts, fixed sampling noise, the run's clock stopped meanwhile).

Prints, per variant, the reward of the last 10 steps' trained samples and the held-out reward and rule score (the
task's ground truth) of the last evaluation (mean and min - max over seeds), and the wall time; writes
``learning.csv`` (every step of every run) and ``learning.png``: the trained samples' reward (top) and the held-out
reward (bottom) against samples trained and against wall-clock seconds, mean and range over seeds. The trained
samples' rewards are of the weights that generated them: under async K versions behind the learner, so they lag
it; the held-out rows score the learner itself.
"""

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from oppo.exec.learning import VARIANTS, read_run, summary, variant_flags, write_learning_csv
from oppo.records.plots import learning_plot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=5, help="held-out evaluation period in steps (default: 5)")
    parser.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts (default: 32)")
    parser.add_argument("--out", default="runs/staleness")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    try:
        flags = {v: variant_flags(v) for v in variants}
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    out = Path(args.out)
    runs: dict[str, list[list[dict]]] = {v: [] for v in variants}
    for seed in range(args.seeds):
        for variant in variants:  # interleaved: a slow moment of the machine falls on every variant alike
            run = out / f"{variant}-seed{seed}"
            cmd = [sys.executable, "-m", "oppo.exec.train", "--preset", "tiny-cpu", *flags[variant]]
            cmd += ["--steps", str(args.steps), "--batch", str(args.batch), "--seed", str(seed), "--out", str(run)]
            cmd += ["--eval-every", str(args.eval_every), "--eval-prompts", str(args.eval_prompts)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{variant} seed {seed} failed: {done.stderr.strip().splitlines()[-1]}")
            runs[variant].append(read_run(run))
    write_learning_csv(out / "learning.csv", runs)
    learning_plot(runs, out / "learning.png")
    print(f"tiny-cpu, {args.steps} steps x B {args.batch}, {args.seeds} seeds; means, [min, max] over seeds")
    print("reward: the last 10 steps' trained samples; held-out: the last evaluation of the trained weights")
    print(f"{'variant':<20} {'reward':>22} {'held-out reward':>22} {'held-out rule score':>22} {'wall s':>8}")
    for row in summary(runs):
        reward, held, rule = (span(row[k]) for k in ("reward", "held_out_reward", "held_out_rule_score"))
        print(f"{row['variant']:<20} {reward:>22} {held:>22} {rule:>22} {statistics.fmean(row['seconds']):8.1f}")
    print(f"-> {out / 'learning.csv'}, {out / 'learning.png'}")


def span(values: list[float]) -> str:
    return f"{statistics.fmean(values):.3f} [{min(values):.3f}, {max(values):.3f}]" if values else "-"


if __name__ == "__main__":
    main()
