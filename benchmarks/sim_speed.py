"""How fast the simulator runs, end to end: ``python -m oppo.sim run`` for 1000 PPO steps at B = 512 on 8 GPUs
(7 actor + 1 reward), per policy, timed as a user sees it (interpreter start, simulation, records, plots).

    python benchmarks/sim_speed.py [--steps 1000] [--batch 512] [--repeats 3]

Prints, per policy, the median wall seconds of the whole command over ``--repeats`` runs, the simulation's own
share (``wall_s`` in summary.json) and simulated steps per second (target: the oppo command under 6 s).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed_run(policy: str, steps: int, batch: int, lengths: str | None, out: Path) -> tuple[float, float, int]:
    cmd = [
        sys.executable,
        "-m",
        "oppo.sim",
        "run",
        "--setup",
        "paper-7b-h200",
        "--policy",
        policy,
        "--steps",
        str(steps),
        "--batch",
        str(batch),
        "--out",
        str(out),
    ]
    cmd += ["--lengths", lengths] if lengths else []
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    wall = time.perf_counter() - start
    summary = json.loads((out / "summary.json").read_text())
    rows = sum(1 for _ in open(out / "trace.csv")) - 1
    return wall, summary["wall_s"], rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--policies", default="sync,inter,oppo,tppo")
    parser.add_argument("--repeats", type=int, default=3, help="runs per policy; the median is printed")
    parser.add_argument("--lengths", help="a length trace (default: the setup's lognormal lengths)")
    args = parser.parse_args()
    print(
        f"{'policy':<8} {'steps':>6} {'batch':>6} {'command_s':>10} "
        f"{'simulate_s':>11} {'steps/s':>8} {'trace rows':>11}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for policy in args.policies.split(","):
            runs = [
                timed_run(policy, args.steps, args.batch, args.lengths, Path(tmp) / policy) for _ in range(args.repeats)
            ]
            wall = statistics.median(r[0] for r in runs)
            sim_s = statistics.median(r[1] for r in runs)
            print(
                f"{policy:<8} {args.steps:>6} {args.batch:>6} {wall:>10.2f} {sim_s:>11.2f} "
                f"{args.steps / sim_s:>8.1f} {runs[0][2]:>11}"
            )


if __name__ == "__main__":
    main()
