"""Asynchronous RL on this machine's cores: ``async`` with rollout workers (generation on their own cores, ahead of
the trainer) against ``sync`` as a user runs it (one process, torch on every core), per trained group.

    python benchmarks/async_speed.py --preset small-cpu --batch 4 --steps 8 --repeats 3
    python benchmarks/async_speed.py --staleness 1,2 --rollout-workers 1 --inflight
    python benchmarks/async_speed.py --algo grpo --group-size 4 --batch 1     # no critic: a lighter trainer

Each run is ``python -m oppo.exec.train`` in its own process with AlpacaEval lengths forced (cap
``--max-new-tokens``); variants are interleaved within a repeat so that a slow moment of the machine falls on all
alike. The time per trained group is taken from the end of the first step to the end of the last (the first step
pays the warm-up), over the groups trained in between. Prints, per variant, the median seconds per trained group,
the spread (min - max) over repeats, the ratio to ``sync`` (median of sync / median of the variant), each device's
busy fraction (the union of its operations over the run, from ``summary.json``) and the mean policy lag.
"""

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from oppo.cli import at_least, integers


def variants(staleness: list[int], workers: int, inflight: bool = False) -> dict[str, list[str]]:
    out = {"sync": ["--policy", "sync"]}
    for k in staleness:
        flags = ["--policy", "async", "--staleness", str(k), "--rollout-workers", str(workers)]
        out[f"async K={k}, {workers} worker(s)"] = flags
        if inflight:
            out[f"async K={k}, {workers} w., in-flight"] = [*flags, "--inflight-updates"]
    return out


def seconds_per_group(run: Path, batch: int) -> float:
    with open(run / "steps.csv", newline="") as fh:
        ends = [float(row["end_s"]) for row in csv.DictReader(fh)]
    return (ends[-1] - ends[0]) / (batch * (len(ends) - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small-cpu")
    parser.add_argument("--batch", type=at_least(1), default=4)
    parser.add_argument("--steps", type=at_least(2), default=8, help="steps per run (>= 2: the first is warm-up)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--staleness", type=integers(1), default=[1], help="comma-separated K of the async variants")
    parser.add_argument("--rollout-workers", type=at_least(1), default=1)
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--algo", default="ppo", choices=("ppo", "grpo"), help="the runs' --algo")
    parser.add_argument("--group-size", type=at_least(1), default=1, help="the runs' --group-size (grpo: >= 2)")
    parser.add_argument("--inflight", action="store_true", help="also each async variant with --inflight-updates")
    parser.add_argument("--out", help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    if (args.algo == "grpo") != (args.group_size > 1):
        parser.error("--algo grpo needs --group-size >= 2, and --group-size > 1 needs --algo grpo")
    chosen = variants(args.staleness, args.rollout_workers, args.inflight)
    common = ["--preset", args.preset, "--batch", str(args.batch), "--steps", str(args.steps)]
    common += ["--max-new-tokens", str(args.max_new_tokens), "--lengths", "alpaca_eval", "--lengths-model", "alpaca-7b"]
    common += ["--algo", args.algo, "--group-size", str(args.group_size)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        per_group: dict[str, list[float]] = {name: [] for name in chosen}
        summaries: dict[str, list[dict]] = {name: [] for name in chosen}
        trainer: dict[str, list[dict[str, float]]] = {name: [] for name in chosen}
        work: dict[str, list[dict[str, float]]] = {name: [] for name in chosen}
        for repeat in range(args.repeats):
            for i, (name, flags) in enumerate(chosen.items()):
                run = root / f"r{repeat}-v{i}"
                cmd = [sys.executable, "-m", "oppo.exec.train", *common, *flags, "--out", str(run)]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed: {done.stderr.strip().splitlines()[-1]}")
                per_group[name].append(seconds_per_group(run, args.batch))
                summaries[name].append(json.loads((run / "summary.json").read_text()))
                trainer[name].append(trainer_profile(run))
                work[name].append(device_work(run))
        report(per_group, summaries, args)
        report_trainer(trainer)
        report_bound(per_group, work, args.batch)


def timed_operations(run: Path) -> tuple[float, list[tuple[dict, float]]]:
    """The timed span's seconds per step (the steps after the first) and each trace row with its seconds inside
    that span."""
    with open(run / "steps.csv", newline="") as fh:
        steps = list(csv.DictReader(fh))
    first_end, last_end = float(steps[0]["end_s"]), float(steps[-1]["end_s"])
    with open(run / "trace.csv", newline="") as fh:
        rows = [
            (row, min(float(row["end_s"]), last_end) - max(float(row["start_s"]), first_end))
            for row in csv.DictReader(fh)
        ]
    n = len(steps) - 1
    return (last_end - first_end) / n, [(row, seconds / n) for row, seconds in rows if seconds > 0]


def trainer_profile(run: Path) -> dict[str, float]:
    """Seconds per step the trainer's device (cpu0) spent in each (role, phase) over the timed steps (after the
    first), and what is left of the span: "other" (the driver's own Python, queue waits, idle)."""
    span, operations = timed_operations(run)
    out: dict[str, float] = {}
    for row, seconds in operations:
        if row["device"] == "cpu0":
            key = f"{row['role']} {row['phase']}"
            out[key] = out.get(key, 0.0) + seconds
    out["other"] = span - sum(out.values())
    return out


def device_work(run: Path) -> dict[str, float]:
    """Seconds per step each device spent in operations over the timed steps."""
    out: dict[str, float] = {}
    for row, seconds in timed_operations(run)[1]:
        out[row["device"]] = out.get(row["device"], 0.0) + seconds
    return out


def report_trainer(trainer: dict[str, list[dict[str, float]]]) -> None:
    print("trainer's core (cpu0), seconds per step by operation (median over repeats; other: waits, Python)")
    for name, profiles in trainer.items():
        keys = sorted({k for p in profiles for k in p}, key=lambda k: -statistics.median(p.get(k, 0) for p in profiles))
        parts = ", ".join(f"{k} {statistics.median(p.get(k, 0.0) for p in profiles):.2f}" for k in keys)
        print(f"  {name:<28} {parts}")


def report_bound(per_group: dict[str, list[float]], work: dict[str, list[dict[str, float]]], batch: int) -> None:
    """An async step takes at least the busiest device's own work (its operations, per step): sync's step over it
    bounds async's gain if every wait were hidden. A trainer whose one-core work alone takes sync's whole step leaves
    generation nothing to hide behind."""
    sync_step = statistics.median(per_group["sync"]) * batch
    for name, runs in work.items():
        if name == "sync":
            continue
        per_device = {d: statistics.median(r.get(d, 0.0) for r in runs) for d in sorted({d for r in runs for d in r})}
        busiest = max(per_device, key=per_device.get)
        parts = ", ".join(f"{d} {w:.2f}" for d, w in per_device.items())
        print(
            f"  {name}: own work a step {parts} s against sync's step {sync_step:.2f} s: gain <= "
            f"{sync_step / per_device[busiest]:.2f}x if every wait were hidden ({busiest} the busiest)"
        )


def report(per_group: dict[str, list[float]], summaries: dict[str, list[dict]], args) -> None:
    base = statistics.median(per_group["sync"])
    print(
        f"{args.preset}, B {args.batch}, AlpacaEval lengths capped at {args.max_new_tokens}, {args.steps} steps, "
        f"{args.repeats} repeats interleaved; seconds per trained group after the first step"
    )
    print(f"{'variant':<28} {'s/group':>8} {'spread':>15} {'vs sync':>8} {'mean lag':>9}  busy fraction per device")
    for name, values in per_group.items():
        median = statistics.median(values)
        busy = {}
        for summary in summaries[name]:
            for device, frac in summary["utilization"].items():
                busy.setdefault(device, []).append(frac)
        busy_text = ", ".join(f"{d} {statistics.median(f):.0%}" for d, f in sorted(busy.items()))
        lag = statistics.fmean(s["mean_policy_lag"] for s in summaries[name])
        spread = f"{min(values):.3f}-{max(values):.3f}"
        print(f"{name:<28} {median:8.3f} {spread:>15} {base / median:7.2f}x {lag:9.2f}  {busy_text}")


if __name__ == "__main__":
    main()
