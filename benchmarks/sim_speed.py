"""How fast the simulator runs, end to end: ``python -m oppo.sim run`` for 1000 PPO steps at B = 512 on 8 GPUs
(7 actor + 1 reward), per policy, timed as a user sees it (interpreter start, simulation, records, plots).

    python benchmarks/sim_speed.py [--steps 1000] [--batch 512] [--repeats 3] [--other DIR]

Prints, per policy, the median wall seconds of the whole command over ``--repeats`` runs, the simulation's own
share (``wall_s`` in summary.json) and simulated steps per second (target: the oppo command under 6 s). With
``--other`` (another source tree, e.g. an unpacked ``git archive`` of main), each policy also runs with ``oppo``
imported from that tree, the trees alternated run by run, and the ratio other / this of the medians is printed.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed_run(
    policy: str, steps: int, batch: int, lengths: str | None, out: Path, tree: Path = ROOT
) -> tuple[float, float, int]:
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
    env = os.environ | {"PYTHONPATH": str(tree)}
    subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=tree)
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
    parser.add_argument("--other", type=Path, help="another source tree (holds oppo/), alternated with this one")
    args = parser.parse_args()
    trees = {"this": ROOT} | ({"other": args.other.resolve()} if args.other else {})
    print(
        f"{'policy':<8} {'tree':<6} {'steps':>6} {'batch':>6} {'command_s':>10} "
        f"{'simulate_s':>11} {'steps/s':>8} {'trace rows':>11}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for policy in args.policies.split(","):
            runs: dict[str, list] = {name: [] for name in trees}
            for _ in range(args.repeats):
                for name, tree in trees.items():  # alternated: load changes hit both trees alike
                    out = Path(tmp) / name / policy
                    runs[name].append(timed_run(policy, args.steps, args.batch, args.lengths, out, tree))
            for name, rows in runs.items():
                wall = statistics.median(r[0] for r in rows)
                sim_s = statistics.median(r[1] for r in rows)
                print(
                    f"{policy:<8} {name:<6} {args.steps:>6} {args.batch:>6} {wall:>10.2f} {sim_s:>11.2f} "
                    f"{args.steps / sim_s:>8.1f} {rows[0][2]:>11}"
                )
            if args.other:
                ratio = statistics.median(r[0] for r in runs["other"]) / statistics.median(r[0] for r in runs["this"])
                print(f"{policy:<8} command other / this = {ratio:.2f}x (medians, {args.repeats} alternated repeats)")


if __name__ == "__main__":
    main()
