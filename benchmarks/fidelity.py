"""Fidelity of the simulator on this machine: calibrate on the executor's sync run, predict the other policies.

    python benchmarks/fidelity.py --preset tiny-cpu --steps 30

Runs the executor for each policy (forced AlpacaEval lengths, fixed chunk and Δ), fits the cost profile on the
sync run's trace only, simulates every policy with the same schedule, lengths and seed, and prints per policy
the median absolute step-time error and the error of the predicted speedup over sync. Also prints the held-out
error of the GPU profile fits.
"""

import argparse
from pathlib import Path

from oppo.exec.config import ExecConfig, ModelConfig, TaskConfig, default_schedule
from oppo.exec.train import train
from oppo.fidelity import fidelity
from oppo.lengths import load_lengths
from oppo.sim.costs import gpu_efficiencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny-cpu")
    parser.add_argument("--policies", default="sync,intra,inter,oppo")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--chunk", default="16")
    parser.add_argument("--delta", default="2")
    parser.add_argument("--lengths-model", default="alpaca-7b")
    parser.add_argument("--out", default="runs/fidelity")
    args = parser.parse_args()
    if "sync" not in args.policies.split(","):
        parser.error("--policies must include sync: the simulator is calibrated on the sync run")
    task = TaskConfig(lengths="alpaca_eval", lengths_model=args.lengths_model)
    lengths = load_lengths(task.lengths, model=task.lengths_model)
    runs = {}
    for policy in args.policies.split(","):
        schedule = default_schedule(
            policy=policy,
            batch=args.batch,
            max_new_tokens=args.max_new_tokens,
            chunk=args.chunk,
            delta=args.delta,
            check_tokens=8,
        )
        config = ExecConfig(schedule=schedule, model=ModelConfig(preset=args.preset), steps=args.steps, task=task)
        runs[policy] = Path(args.out) / f"{args.preset}-{policy}"
        train(config, runs[policy])
    report = fidelity(runs, lengths, Path(args.out) / f"{args.preset}-profile.json")
    print(
        f"\n{args.preset}: calibrated on sync only; B={args.batch}, {args.lengths_model} lengths cap "
        f"{args.max_new_tokens}, chunk {args.chunk}, delta {args.delta}, steps 1..{args.steps - 1}"
    )
    print(
        f"{'policy':<7} {'measured_s':>11} {'predicted_s':>12} {'median_err':>11} "
        f"{'speedup':>8} {'predicted':>10} {'err':>6}"
    )
    for policy, r in report.items():
        print(
            f"{policy:<7} {r['measured_step_s']:>11.3f} {r['predicted_step_s']:>12.3f} {r['median_step_err']:>10.1%} "
            f"{r['measured_speedup']:>7.2f}x {r['predicted_speedup']:>9.2f}x {r['speedup_err']:>6.1%}"
        )
    print("\nGPU profile fits (held-out 20% of rows):")
    for name, fit in gpu_efficiencies().items():
        print(
            f"  {name:<10} median error {fit.heldout_median_abs_err:.1%}, "
            f"p90 {fit.heldout_p90_abs_err:.1%} (from {fit.gpu})"
        )


if __name__ == "__main__":
    main()
