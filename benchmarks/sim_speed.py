"""How fast the simulator runs: 1000 PPO steps at B = 512 on 8 GPUs (7 actor + 1 reward), per policy.

    python benchmarks/sim_speed.py [--steps 1000] [--batch 512]

Prints wall seconds and simulated steps per second for each policy (target: <= 10 s per 1000 steps).
"""

import argparse
import time

from oppo.lengths import load_lengths
from oppo.sim import SimConfig, load_setup, simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--policies", default="sync,inter,oppo,tppo")
    args = parser.parse_args()
    setup = load_setup("paper-7b-h200")
    trace = load_lengths("traces/alpaca_eval_lengths.csv.gz")
    print(f"{'policy':<8} {'steps':>6} {'batch':>6} {'wall_s':>8} {'steps/s':>9} {'trace rows':>11}")
    for policy in args.policies.split(","):
        config = SimConfig(setup.schedule(policy=policy, batch=args.batch), setup, steps=args.steps)
        start = time.perf_counter()
        result = simulate(config, trace)
        wall = time.perf_counter() - start
        print(
            f"{policy:<8} {args.steps:>6} {args.batch:>6} {wall:>8.2f} {args.steps / wall:>9.1f} {len(result.trace):>11}"
        )


if __name__ == "__main__":
    main()
