"""The data-parallel actor group on this machine: one policy with ``--dp 1``, ``--dp N`` and ``--dp N --shard``.

    python benchmarks/data_parallel.py --preset small-cpu --dp 2 --steps 8 [--no-shard]

Prints, from each run's records: mean step time (steps 1.. : step 0 pays the warm-up) and its ratio to ``--dp 1``,
each device's busy fraction (one per rank, plus the driver holding the reward model), the step's time per phase
summed over devices, and the number of decode rounds per step (each round is one call to every rank).
"""

import argparse
import csv
import json
from collections import Counter
from pathlib import Path

from oppo.exec.config import ExecConfig, ModelConfig, default_schedule
from oppo.exec.train import train

PHASES = (
    "actor/prefill",
    "actor/decode",
    "actor/score",
    "reference/score",
    "critic/score",
    "reward/prefill",
    "actor/train_actor",
    "critic/train_critic",
)


def run(args, dp: int, shard: bool = False) -> dict:
    schedule = default_schedule(policy=args.policy, batch=args.batch, max_new_tokens=args.max_new_tokens)
    config = ExecConfig(schedule=schedule, model=ModelConfig(preset=args.preset), steps=args.steps, dp=dp, shard=shard)
    out = Path(args.out) / f"{args.preset}-{args.policy}-dp{dp}{'-shard' * shard}"
    train(config, out)
    summary = json.loads((out / "summary.json").read_text())
    step_s = [float(r["step_s"]) for r in csv.DictReader(open(out / "steps.csv"))]
    rounds = Counter(
        (r["step"], r["device"]) for r in csv.DictReader(open(out / "trace.csv")) if r["phase"] == "decode"
    )
    return {
        "step_s": sum(step_s[1:]) / max(len(step_s) - 1, 1),
        "busy": summary["utilization"],
        "phases": summary["phase_s_per_step"],
        "rounds": sum(rounds.values()) / max(len(rounds), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small-cpu", help="model preset (tiny-cpu, small-cpu)")
    parser.add_argument("--policy", default="oppo")
    parser.add_argument("--dp", type=int, default=2, help="ranks of the data-parallel run")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument(
        "--shard", action=argparse.BooleanOptionalAction, default=True, help="also run --dp N --shard (FSDP2)"
    )
    parser.add_argument("--out", default="runs/bench-data-parallel")
    args = parser.parse_args()
    results = {"1": run(args, 1), str(args.dp): run(args, args.dp)}
    if args.shard:
        results[f"{args.dp} shard"] = run(args, args.dp, True)
    base = results["1"]["step_s"]
    print(f"\n{args.preset}, {args.policy}, B={args.batch}, cap {args.max_new_tokens}, steps 1..{args.steps - 1}")
    print(f"{'ranks':<8} {'step_s':>7} {'vs dp 1':>8} {'rounds':>7}  busy fraction per device")
    for dp, r in results.items():
        busy = ", ".join(f"{d}: {u:.0%}" for d, u in r["busy"].items())
        print(f"{dp:<8} {r['step_s']:>7.3f} {base / r['step_s']:>7.2f}x {r['rounds']:>7.1f}  {busy}")
    print("\nseconds per step by phase, summed over devices")
    print(f"{'phase':<20}" + "".join(f"{'dp ' + dp:>12}" for dp in results))
    for phase in PHASES:
        print(f"{phase:<20}" + "".join(f"{r['phases'].get(phase, 0.0):>12.3f}" for r in results.values()))


if __name__ == "__main__":
    main()
