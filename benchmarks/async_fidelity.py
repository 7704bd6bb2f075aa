"""Simulator vs executor for asynchronous RL: the executor's ``async`` with rollout workers against the simulator's
``async`` on the same placement (one trainer core, one core per rollout worker), seeds and forced lengths.

    python benchmarks/async_fidelity.py --preset small-cpu --batch 2 --steps 8 --staleness 1,2 --repeats 3

Each repeat runs, interleaved: the calibration run (``python -m oppo.sim calibrate`` fits the cost profile on its
trace), then ``async --staleness K --rollout-workers 1`` for each K (the trainer on one core, the worker on the
other). The calibration run is synchronous RL on the same placement (``--calibration placement``: async K = 0, in
which nothing overlaps, so every operation is timed alone), or ``sync`` in one process pinned to one core with one
torch thread (``one-core``): a Ray worker decodes ~10% slower than a plain process on its core, which the
one-core calibration cannot see. The simulator then predicts
each async run from that repeat's profile (``oppo.fidelity.predict_async``: the worker generates and scores with
the reward model and reference, the trainer computes old log-probs and values and trains; step s by version
s - K, as the executor). Prints per K the measured and predicted mean lag of the trained samples and mean step
time (steps 1..; step 0 pays the warm-up), medians over repeats with their range, and whether they meet the
goal: lag within ``--lag-tolerance`` versions, step time within ``--step-tolerance``. Beside it, the step time
predicted with costs fitted on the async run's own trace: it separates the pipeline model (overlap, waits, the
bound) from the cost fit, whose error dominates on a loaded machine (a calibration run and the run it predicts
then see different loads).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from oppo.catalog.lengths import load_lengths
from oppo.cli import at_least, integers
from oppo.records.io import read_rows
from oppo.records.schema import StepRecord, TraceRow


def executor(args, flags: list[str], out: Path, core: int | None) -> None:
    cmd = [sys.executable, "-m", "oppo.exec.train", "--preset", args.preset, "--batch", str(args.batch)]
    cmd += ["--steps", str(args.steps), "--max-new-tokens", str(args.max_new_tokens), "--seed", str(args.seed)]
    cmd += ["--lengths", "alpaca_eval", "--lengths-model", args.lengths_model, *flags, "--out", str(out)]
    pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None and hasattr(os, "sched_setaffinity") else None
    done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pin)
    if done.returncode != 0 and "timed out during startup" in done.stderr:  # Ray on a busy machine: once more
        done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pin)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(flags)} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")


def one_repeat(args, root: Path, repeat: int, ks: list[int]) -> dict[int, dict[str, float]]:
    sync = root / f"r{repeat}-sync"
    if args.calibration == "placement":  # synchronous (K = 0: nothing overlaps) on the placement predicted
        executor(args, ["--policy", "async", "--staleness", "0", "--rollout-workers", "1"], sync, None)
    else:
        executor(args, ["--policy", "sync", "--threads", "1"], sync, args.core)
    profile = calibrate(sync, root / f"r{repeat}-profile.json")
    lengths = load_lengths("alpaca_eval", model=args.lengths_model)
    from oppo.fidelity import predict_async  # here, not at the top: a usage error is told before torch loads

    out = {}
    for k in ks:
        run = root / f"r{repeat}-async{k}"
        flags = ["--policy", "async", "--staleness", str(k), "--rollout-workers", "1"]
        executor(args, flags + (["--queue-groups", str(args.queue_groups)] if args.queue_groups else []), run, None)
        measured = read_rows(run / "steps.csv", StepRecord)
        steps, trained = predict_async(run, profile, lengths)
        own, _ = predict_async(run, calibrate(run, root / f"r{repeat}-async{k}-profile.json"), lengths)
        summary = json.loads((run / "summary.json").read_text())
        out[k] = {
            "measured_lag": summary["mean_policy_lag"],
            "predicted_lag": float(np.mean([t.policy_lag for t in trained])),
            "measured_step_s": float(np.mean([s.step_s for s in measured[1:]])),
            "predicted_step_s": float(np.mean([s.step_s for s in steps[1 : len(measured)]])),
            "own_trace_step_s": float(np.mean([s.step_s for s in own[1 : len(measured)]])),
        }
    return out


def calibrate(run: Path, profile: Path) -> Path:
    """``python -m oppo.sim calibrate`` on ``run``'s trace."""
    from oppo.sim.cost.profile import fit_trace, save_profile

    save_profile(fit_trace(read_rows(run / "trace.csv", TraceRow)), profile, str(run))
    return profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small-cpu")
    parser.add_argument("--batch", type=at_least(1), default=2)
    parser.add_argument("--steps", type=at_least(2), default=8, help="steps per run (>= 2: step 0 is warm-up)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lengths-model", default="alpaca-7b")
    parser.add_argument("--staleness", type=integers(0), default=[1, 2], help="comma-separated K of the async runs")
    parser.add_argument("--queue-groups", type=int, default=0, help="the async runs' --queue-groups (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument(
        "--calibration",
        choices=("placement", "one-core"),
        default="placement",
        help="the calibration run: synchronous RL on the predicted placement (async K = 0, one rollout worker), or "
        "sync in one process pinned to one core with one thread",
    )
    parser.add_argument("--core", type=int, default=0, help="with --calibration one-core: the core it is pinned to")
    parser.add_argument("--lag-tolerance", type=float, default=0.2, help="versions")
    parser.add_argument("--step-tolerance", type=float, default=0.15, help="relative")
    parser.add_argument("--out", help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    ks = args.staleness
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        reports = [one_repeat(args, root, r, ks) for r in range(args.repeats)]
    report(reports, ks, args)


def report(reports: list[dict], ks: list[int], args) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{args.preset}, B {args.batch}, {args.lengths_model} lengths capped at {args.max_new_tokens}, {args.steps} "
        f"steps, seed {args.seed}, 1 rollout worker, calibrated on the {args.calibration} run; {args.repeats} repeats "
        f"(median [min, max]); load average {load:.1f} at the end"
    )
    print(
        f"{'K':>2} {'lag measured':>20} {'predicted':>20} {'step_s measured':>22} {'predicted':>22} {'err':>6}  goal"
        f"  | own-trace costs: {'predicted':>22} {'err':>6}"
    )
    for k in ks:
        rows = [r[k] for r in reports]
        cell = {key: _median_range([row[key] for row in rows]) for key in rows[0]}
        lag_err = abs(cell["predicted_lag"][0] - cell["measured_lag"][0])
        step_err = abs(cell["predicted_step_s"][0] - cell["measured_step_s"][0]) / cell["measured_step_s"][0]
        own_err = abs(cell["own_trace_step_s"][0] - cell["measured_step_s"][0]) / cell["measured_step_s"][0]
        met = lag_err <= args.lag_tolerance and step_err <= args.step_tolerance
        print(
            f"{k:>2} {_fmt(cell['measured_lag'])} {_fmt(cell['predicted_lag'])} {_fmt(cell['measured_step_s'], 3)}"
            f" {_fmt(cell['predicted_step_s'], 3)} {step_err:6.1%}  {'met' if met else 'NOT met'} "
            f"(lag off by {lag_err:.2f}, goal {args.lag_tolerance:g}; step goal {args.step_tolerance:.0%})"
            f"  | {_fmt(cell['own_trace_step_s'], 3)} {own_err:6.1%}"
        )


def _median_range(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def _fmt(cell: tuple[float, float, float], digits: int = 2) -> str:
    m, lo, hi = cell
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]".rjust(20 if digits == 2 else 22)


if __name__ == "__main__":
    main()
