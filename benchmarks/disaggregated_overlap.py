"""Disaggregated placement on this machine: sync vs intra vs oppo with the reward model on its own core.

    python benchmarks/disaggregated_overlap.py --preset small-cpu --steps 6

Runs each policy with ``--placement disaggregated`` (actor generation and actor + critic training on the driver
core; the reward, reference and critic scorers in a Ray actor on the other core, the critic's weights synced each
step), forced AlpacaEval lengths, and prints from the records: mean step time and ratio to sync, the share of
reward-prefill time hidden under the actor's decode, and each device's busy fraction.
"""

import argparse
import csv
import json
from pathlib import Path

from oppo.exec.config import ExecConfig, ModelConfig, PPOConfig, TaskConfig, default_schedule
from oppo.exec.train import train
from oppo.records.io import read_rows
from oppo.records.metrics import hidden_fraction
from oppo.records.schema import TraceRow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small-cpu")
    parser.add_argument("--policies", default="sync,intra,oppo")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--chunk", default="32")
    parser.add_argument("--remote-roles", default="reward+reference+critic", help="roles on the second core")
    parser.add_argument("--epochs", type=int, default=1, help="PPO epochs (fewer: scoring weighs more)")
    parser.add_argument("--lengths-model", default="alpaca-7b")
    parser.add_argument("--out", default="runs/bench-disaggregated")
    args = parser.parse_args()
    results = {}
    for policy in args.policies.split(","):
        schedule = default_schedule(
            policy=policy,
            batch=args.batch,
            max_new_tokens=args.max_new_tokens,
            chunk=args.chunk,
            check_tokens=8,
            delta_init=2,
            delta_max=max(2, args.batch // 4),
            streamed_scorers=("reward", "reference", "critic"),
        )
        config = ExecConfig(
            schedule=schedule,
            model=ModelConfig(preset=args.preset),
            steps=args.steps,
            ppo=PPOConfig(epochs=args.epochs, minibatches=1),
            placement="disaggregated",
            remote_roles=tuple(args.remote_roles.split(",")),
            task=TaskConfig(lengths="alpaca_eval", lengths_model=args.lengths_model),
        )
        out = Path(args.out) / f"{args.preset}-{policy}"
        train(config, out)
        summary = json.loads((out / "summary.json").read_text())
        trace = read_rows(out / "trace.csv", TraceRow)
        steps = list(csv.DictReader(open(out / "steps.csv")))
        # step 0 pays one-off warm-up (allocations, first Ray calls): report steps 1..N
        step_s = [float(r["step_s"]) for r in steps[1:]] or [float(r["step_s"]) for r in steps]
        results[policy] = (sum(step_s) / len(step_s), hidden_fraction(trace), summary["utilization"])
    base = results.get("sync", next(iter(results.values())))[0]
    print(
        f"\n{args.preset}, disaggregated (remote: {args.remote_roles}), B={args.batch}, "
        f"{args.lengths_model} lengths cap {args.max_new_tokens}, chunk {args.chunk}, steps 1..{args.steps - 1}"
    )
    print(f"{'policy':<7} {'step_s':>8} {'vs sync':>8} {'reward prefill hidden':>22}  busy fraction per device")
    for policy, (step_s, hidden, util) in results.items():
        busy = ", ".join(f"{d}: {u:.0%}" for d, u in util.items())
        print(f"{policy:<7} {step_s:>8.3f} {base / step_s:>7.2f}x {hidden:>22.0%}  {busy}")


if __name__ == "__main__":
    main()
