"""The paper's comparison on this machine: TRL 1.12 PPOTrainer vs oppo.exec (sync, oppo), same models, prompts,
length distribution and hyper-parameters, in one run.

    python benchmarks/trl_baseline.py --preset tiny-cpu --steps 60
    python benchmarks/trl_baseline.py --preset small-cpu --steps 6 --max-new-tokens 128

Prints per run: mean step time (steps 1..), trained response tokens per second, mean reward of the last 10 steps, the
time to reach a reward threshold (5-step running mean), and ratios to TRL. Differences: docs/trl.md.
"""

import argparse
import csv
from pathlib import Path

import numpy as np

from oppo.catalog.lengths import load_lengths
from oppo.exec.baselines.trl_ppo import run_trl
from oppo.exec.config import ExecConfig, ModelConfig, TaskConfig, default_schedule
from oppo.exec.train import train
from oppo.records.metrics import time_to_reward


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny-cpu")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument(
        "--lengths",
        default="hh_rlhf_harmless",
        help="trace whose lengths are forced on every run: a CSV file or a bundled trace ('' for natural lengths)",
    )
    parser.add_argument("--threshold", type=float, default=0.0, help="reward threshold for time-to-reward")
    parser.add_argument("--out", default="runs/bench-trl")
    args = parser.parse_args(argv)
    lengths = load_lengths(args.lengths) if args.lengths else None
    model = ModelConfig(preset=args.preset, threads=1)
    task = TaskConfig(lengths=args.lengths or None)  # oppo.exec loads the same trace from its config
    results = {}
    config = ExecConfig(
        schedule=default_schedule(policy="sync", batch=args.batch, max_new_tokens=args.max_new_tokens),
        model=model,
        steps=args.steps,
        task=task,
    )
    trl_steps = run_trl(config, lengths)
    results["trl"] = (
        [s.step_s for s in trl_steps],
        [s.mean_reward for s in trl_steps],
        [s.response_tokens for s in trl_steps],
    )
    for policy in ("sync", "oppo"):
        schedule = default_schedule(policy=policy, batch=args.batch, max_new_tokens=args.max_new_tokens)
        out = Path(args.out) / f"{args.preset}-{policy}"
        train(ExecConfig(schedule=schedule, model=model, steps=args.steps, task=task), out)
        steps = list(csv.DictReader(open(out / "steps.csv")))
        trace = list(csv.DictReader(open(out / "sequences.csv")))
        tokens = [sum(int(t["response_tokens"]) for t in trace if t["step"] == s["step"]) for s in steps]
        results[policy] = ([float(s["step_s"]) for s in steps], [float(s["mean_reward"]) for s in steps], tokens)
    base = np.mean(results["trl"][0][1:])
    base_ttr = time_to_reward(results["trl"][1], results["trl"][0], args.threshold)
    print(
        f"\n{args.preset}: B={args.batch}, cap {args.max_new_tokens}, lengths {args.lengths or 'natural'}, "
        f"{args.steps} steps each, threshold {args.threshold}"
    )
    print(
        f"{'run':<15} {'step_s':>8} {'vs TRL':>7} {'tok/s':>8} {'reward last10':>14} {'time to thr':>12} {'vs TRL':>7}"
    )
    for name, (times, rewards, tokens) in results.items():
        mean = np.mean(times[1:])
        ttr = time_to_reward(rewards, times, args.threshold)
        ratio = f"{base_ttr / ttr:.2f}x" if ttr and base_ttr else "-"
        print(
            f"{'oppo.exec ' + name if name != 'trl' else 'TRL':<15} {mean:>8.3f} {base / mean:>6.2f}x "
            f"{np.sum(tokens[1:]) / np.sum(times[1:]):>8.0f} {np.mean(rewards[-10:]):>14.3f} "
            f"{'-' if ttr is None else f'{ttr:.1f} s':>12} {ratio:>7}"
        )


if __name__ == "__main__":
    main()
