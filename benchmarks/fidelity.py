"""Fidelity of the simulator on this machine: calibrate on the executor's sync run, predict the other policies.

    python benchmarks/fidelity.py --preset tiny-cpu --steps 30 --repeats 3

Runs the executor for each policy (forced AlpacaEval lengths, fixed chunk and Δ), pinned to one core with one
torch thread (``--core``; the machine's other work stays off it), the policies interleaved within each of
``--repeats`` repeats so that a slow moment falls on all alike. Each repeat fits the cost profile on its own sync
run's trace only and simulates every policy with the same schedule, lengths and seed. Prints per policy the
measured mean step time (median over repeats and its interquartile range), the predicted one, the median step
error, and the measured and predicted speedup over sync (medians over repeats). A speedup is graded (predicted
within ``--tolerance`` of measured) only where the measured step time's interquartile range is at most
``--max-spread`` of its median, sync's included: a noisier measurement than the error it grades grades nothing.
Exits 1 when a graded speedup fails.

    python benchmarks/fidelity.py --study runs/real-task --policies sync,oppo

makes no runs: it predicts a learning study's (``benchmarks/real_task_learning.py``) runs of a real task, natural
lengths, adaptive Δ and chunk. Each seed K's ``sync-sK`` run calibrates the profile that predicts that seed's other
variants, on the lengths each run generated and with the Δ and chunk size it chose at each step; the seeds take the
place of the repeats.
"""

import argparse
import os
import statistics
from pathlib import Path

import numpy as np

from oppo.catalog.lengths import load_lengths
from oppo.exec.config import ExecConfig, ModelConfig, TaskConfig, default_schedule
from oppo.exec.train import train
from oppo.fidelity import fidelity
from oppo.sim.cost.gpu import gpu_efficiencies


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny-cpu")
    parser.add_argument("--policies", default="sync,intra,inter,oppo")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--chunk", default="16")
    parser.add_argument("--delta", default="2")
    parser.add_argument("--lengths-model", default="alpaca-7b")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every policy (default: 3)")
    parser.add_argument("--core", type=int, default=0, help="the core the runs are pinned to (default: 0)")
    parser.add_argument("--max-spread", type=float, default=0.05, help="IQR / median above which nothing is graded")
    parser.add_argument("--tolerance", type=float, default=0.10, help="predicted speedup within this of measured")
    parser.add_argument("--out", default="runs/fidelity")
    parser.add_argument("--study", metavar="DIR", help="predict a learning study's runs (DIR/VARIANT-sK) instead")
    args = parser.parse_args(argv)
    policies = args.policies.split(",")
    if "sync" not in policies:
        parser.error("--policies must include sync: the simulator is calibrated on the sync run")
    if args.study:
        reports = study_reports(Path(args.study), policies)
        if not reports:
            parser.error(f"--study {args.study}: no seed has a finished run of every policy ({', '.join(policies)})")
        args.repeats = len(reports)
        if not report(reports, policies, args):
            raise SystemExit(1)
        return
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.core})  # this process and the runs in it: one core
    task = TaskConfig(lengths="alpaca_eval", lengths_model=args.lengths_model)
    lengths = load_lengths(task.lengths, model=task.lengths_model)
    reports = []
    for repeat in range(args.repeats):
        runs = {}
        for policy in policies:
            schedule = default_schedule(
                policy=policy,
                batch=args.batch,
                max_new_tokens=args.max_new_tokens,
                chunk=args.chunk,
                delta=args.delta,
                check_tokens=8,
            )
            model = ModelConfig(preset=args.preset, threads=1)
            config = ExecConfig(schedule=schedule, model=model, steps=args.steps, task=task)
            runs[policy] = Path(args.out) / f"{args.preset}-r{repeat}-{policy}"
            train(config, runs[policy])
        reports.append(fidelity(runs, lengths, Path(args.out) / f"{args.preset}-r{repeat}-profile.json"))
    if not report(reports, policies, args):
        raise SystemExit(1)


def study_reports(study: Path, policies: list[str]) -> list[dict]:
    """One fidelity report per seed whose runs of every policy finished (a summary.json), calibrated on its sync."""
    reports = []
    for sync in sorted(study.glob("sync-s*")):
        seed = sync.name.removeprefix("sync-")
        runs = {policy: study / f"{policy}-{seed}" for policy in policies}
        if all((run / "summary.json").is_file() for run in runs.values()):
            reports.append(fidelity(runs, None, study / f"profile-{seed}.json"))
    return reports


def report(reports: list[dict], policies: list[str], args) -> bool:
    """Print the table; False if a graded speedup failed."""
    if args.study:
        print(
            f"\n{args.study}: calibrated on each seed's sync run, the runs' own lengths, Δ and chunk sizes, "
            f"steps 1.., {args.repeats} seeds (medians; IQR of the measured step time over seeds)"
        )
    else:
        print(
            f"\n{args.preset} on core {args.core}: calibrated on each repeat's sync run; B={args.batch}, "
            f"{args.lengths_model} lengths cap {args.max_new_tokens}, chunk {args.chunk}, delta {args.delta}, "
            f"steps 1..{args.steps - 1}, {args.repeats} repeats (medians; IQR of the measured step time)"
        )
    print(
        f"{'policy':<7} {'measured_s':>11} {'IQR':>7} {'predicted_s':>12} {'median_err':>11} "
        f"{'speedup':>8} {'predicted':>10} {'err':>6}  grade"
    )
    spread = {p: _iqr([r[p]["measured_step_s"] for r in reports]) for p in policies}
    passed = True
    for policy in policies:
        rows = [r[policy] for r in reports]
        measured, predicted = (statistics.median(x[k] for x in rows) for k in ("measured_step_s", "predicted_step_s"))
        speedup, predicted_speedup = (
            statistics.median(x[k] for x in rows) for k in ("measured_speedup", "predicted_speedup")
        )
        err = abs(predicted_speedup - speedup) / speedup
        noisy = max(spread[policy], spread["sync"]) > args.max_spread
        grade = "not graded (spread)" if noisy else "pass" if err <= args.tolerance else "FAIL"
        passed &= grade != "FAIL"
        print(
            f"{policy:<7} {measured:>11.3f} {spread[policy]:>6.1%} {predicted:>12.3f} "
            f"{statistics.median(x['median_step_err'] for x in rows):>10.1%} {speedup:>7.2f}x "
            f"{predicted_speedup:>9.2f}x {err:>6.1%}  {grade}"
        )
    print("\nGPU profile fits (held-out 20% of rows):")
    for name, fit in gpu_efficiencies().items():
        print(
            f"  {name:<10} median error {fit.heldout_median_abs_err:.1%}, "
            f"p90 {fit.heldout_p90_abs_err:.1%} (from {fit.gpu})"
        )
    return passed


def _iqr(values: list[float]) -> float:
    """Interquartile range over the median (0 with fewer than two values)."""
    if len(values) < 2:
        return 0.0
    q1, q3 = np.percentile(values, [25, 75])
    return float((q3 - q1) / statistics.median(values))


if __name__ == "__main__":
    main()
