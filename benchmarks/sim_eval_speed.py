"""CPU seconds of the simulator, this tree against another source tree (e.g. an unpacked ``git archive`` of main),
alternated A B A B so that a shared machine's load falls on both alike.

    python benchmarks/sim_eval_speed.py --other /tmp/oppo-before [--repeats 5]

Two measures, each run in a fresh interpreter with ``PYTHONPATH`` set to the tree:

- evaluation: ``oppo.sim.study.experiments.run`` in-process (``paper-7b-h200``, ``oppo``, B = 112, 200 steps, AlpacaEval
  lengths loaded and a 1-step run done beforehand), ``time.process_time`` around the call: what a plan pays per
  evaluation once its process is warm;
- command: ``python -m oppo.sim run --setup paper-7b-h200 --policy oppo --steps 1000 --batch 512``, CPU seconds of
  the child (``resource.getrusage(RUSAGE_CHILDREN)`` user + system deltas): interpreter start, records, plots;
- startup: the same command for 1 step: what does not grow with the run (the interpreter, importing numpy, SimPy
  and matplotlib, drawing two PNGs). The command less its startup is the part that does.

Prints, per measure and tree, the median and the spread (min - max) of the CPU seconds, and the ratio other / this;
then that ratio for the command less its startup (medians).
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EVALUATION = """
import time
from oppo.catalog.lengths import load_lengths
from oppo.sim.study.experiments import run
from oppo.sim.setup.toml_file import load_setup
setup, trace = load_setup("paper-7b-h200"), load_lengths({lengths!r})
run(setup, "oppo", 1, seed=0, trace=trace, batch={batch})  # warm-up: profile fits and imports, paid once per plan
start = time.process_time()
run(setup, "oppo", {steps}, seed=0, trace=trace, batch={batch})
print(time.process_time() - start)
"""


def _env(tree: Path) -> dict[str, str]:
    return os.environ | {"PYTHONPATH": str(tree)}


def evaluation_s(tree: Path, steps: int, batch: int, lengths: str) -> float:
    """CPU seconds of one in-process evaluation, in a fresh interpreter importing ``oppo`` from ``tree``."""
    code = EVALUATION.format(steps=steps, batch=batch, lengths=lengths)
    out = subprocess.run([sys.executable, "-c", code], env=_env(tree), cwd=tree, check=True, capture_output=True)
    return float(out.stdout.split()[-1])


def command_s(tree: Path, steps: int, batch: int, out: Path) -> float:
    """CPU seconds (user + system) of the whole ``run`` command, with ``oppo`` imported from ``tree``."""
    cmd = [sys.executable, "-m", "oppo.sim", "run", "--setup", "paper-7b-h200", "--policy", "oppo"]
    cmd += ["--steps", str(steps), "--batch", str(batch), "--out", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, env=_env(tree), cwd=tree, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _line(name: str, tree: str, seconds: list[float]) -> str:
    return f"{name:<11} {tree:<6} {statistics.median(seconds):>9.3f} {min(seconds):>8.3f} {max(seconds):>8.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--other", type=Path, required=True, help="source tree to compare with (holds oppo/)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per tree and measure (alternated)")
    parser.add_argument("--steps", type=int, default=200, help="evaluation: steps")
    parser.add_argument("--batch", type=int, default=112, help="evaluation: B")
    parser.add_argument("--lengths", default="alpaca_eval", help="evaluation: length trace")
    parser.add_argument("--command-steps", type=int, default=1000)
    parser.add_argument("--command-batch", type=int, default=512)
    args = parser.parse_args()
    trees = {"this": ROOT, "other": args.other.resolve()}
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for name, tree in trees.items():  # A B A B: load changes hit both trees alike
                evaluation = evaluation_s(tree, args.steps, args.batch, args.lengths)
                times.setdefault(("evaluation", name), []).append(evaluation)
                command = command_s(tree, args.command_steps, args.command_batch, Path(tmp) / name)
                times.setdefault(("command", name), []).append(command)
                startup = command_s(tree, 1, args.command_batch, Path(tmp) / name)
                times.setdefault(("startup", name), []).append(startup)
    print(f"{'measure':<11} {'tree':<6} {'median_s':>9} {'min_s':>8} {'max_s':>8}")
    median = {key: statistics.median(seconds) for key, seconds in times.items()}
    for measure in ("evaluation", "command", "startup"):
        for name in trees:
            print(_line(measure, name, times[measure, name]))
        ratio = median[measure, "other"] / median[measure, "this"]
        print(f"{measure:<11} other / this = {ratio:.2f}x (medians, {args.repeats} alternated repeats)")
    grown = {name: median["command", name] - median["startup", name] for name in trees}
    ratio = f"{grown['other'] / grown['this']:.2f}x" if grown["this"] > 0 else "n/a (no time above the startup's)"
    print(f"command less startup: this {grown['this']:.3f} s, other {grown['other']:.3f} s, other / this = {ratio}")
    print(f"load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
