"""Do two source trees simulate the same records? Every policy, PPO and GRPO, several seeds and setups (a
calibrated verl setup, vLLM engines, a separate reward device), run with ``python -m oppo.sim run`` in this tree
and in another one (e.g. an unpacked ``git archive`` of main); the record files are compared byte for byte.

    python benchmarks/sim_records_match.py --other /tmp/oppo-main [--steps 30] [--cases oppo-7b,grpo-7b]
    python benchmarks/sim_records_match.py --digest [--tree DIR]   # sha256 of the small cases' records

Compared: ``steps.csv``, ``sequences.csv``, ``trace.csv``, ``trace.json`` and ``summary.json`` without its
wall-clock field (``wall_s``). Prints one line per case (``same`` or the files that differ) and exits 1 if any
differs. ``--digest`` prints the records' sha256 per small case as JSON (``tests/sim/records_digest.json`` holds
them as produced by the code before the simulator was sped up; ``tests/sim/test_records_digest.py`` checks them).
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from oppo.cli import directory

ROOT = Path(__file__).resolve().parents[1]
FILES = ("steps.csv", "sequences.csv", "trace.csv", "trace.json", "summary.json")
POLICIES = ("sync", "intra", "inter", "oppo", "tppo", "april", "tailbatch", "async")
VERL = "verl-qwen2.5-0.5b-gsm8k"  # calibrated on a real verl log; vLLM engine, colocated on one GPU
DEEPSEEK = "verl-deepseek-llm-7b-ppo-8xmi300x"  # vLLM, rollout tensor parallel 4, rule reward, PPO critic


def cases(steps: int) -> dict[str, list[str]]:
    """Case name -> ``run`` arguments (without ``--out``)."""
    alpaca = ["--setup", "paper-7b-h200", "--lengths", "alpaca_eval", "--batch", "32"]
    out = {f"{p}-7b": [*alpaca, "--policy", p, "--steps", str(steps)] for p in POLICIES}
    out |= {
        f"{p}-7b-grpo": [
            *alpaca,
            "--policy",
            p,
            "--algo",
            "grpo",
            "--group-size",
            "4",
            "--batch",
            "8",
            "--steps",
            str(steps),
        ]
        for p in POLICIES
        if p != "tppo"
    }  # fmt: skip (tppo: no groups)
    out |= {f"oppo-7b-seed{s}": [*alpaca, "--policy", "oppo", "--seed", str(s), "--steps", str(steps)] for s in (1, 2)}
    out["oppo-7b-auto"] = [*alpaca, "--policy", "oppo", "--chunk", "auto", "--delta", "auto", "--steps", str(steps)]
    out["oppo-7b-lognormal"] = ["--setup", "paper-7b-h200", "--policy", "oppo", "--steps", str(steps)]
    out |= {f"{p}-3b": ["--setup", "paper-3b-a100", "--policy", p, "--steps", str(steps)] for p in ("sync", "oppo")}
    out |= {f"{p}-verl": ["--setup", VERL, "--policy", p, "--batch", "64", "--steps", str(steps)] for p in POLICIES}
    out["oppo-verl-grpo"] = ["--setup", VERL, "--policy", "oppo", "--algo", "grpo", "--group-size", "4"]
    out["oppo-verl-grpo"] += ["--batch", "16", "--seed", "3", "--steps", str(steps)]
    out |= {f"{p}-deepseek": ["--setup", DEEPSEEK, "--policy", p, "--batch", "128", "--steps", str(steps)]
            for p in ("sync", "oppo", "async")}  # fmt: skip
    out["tppo-longcot"] = ["--setup", "long-cot-7b-h200", "--policy", "tppo", "--batch", "16", "--steps", str(steps)]
    return out


DIGEST_CASES = ("oppo-7b", "tailbatch-7b-grpo", "async-verl", "oppo-deepseek")
DIGEST_STEPS = 6

RUNNER = """
import json, sys
from oppo.sim.cli import main
for name, argv in json.loads(sys.argv[1]).items():
    code = main(["run", *argv, "--out", f"{sys.argv[2]}/{name}", "--timeline-steps", ""])
    if code:
        sys.exit(f"{name}: exit {code}")
"""


def simulate(tree: Path, chosen: dict[str, list[str]], out: Path) -> subprocess.Popen:
    """Start one interpreter importing ``oppo`` from ``tree`` that runs every case into ``out/<case>``."""
    env = os.environ | {"PYTHONPATH": str(tree), "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-c", RUNNER, json.dumps(chosen), str(out)]
    return subprocess.Popen(cmd, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def record_bytes(run_dir: Path, name: str, tree: Path) -> bytes:
    """A record file's bytes; summary.json without its wall-clock seconds, the tree's path written <tree> (a
    setup's model file is stored by its path)."""
    data = (run_dir / name).read_bytes()
    if name == "summary.json":
        summary = json.loads(data)
        summary.pop("wall_s")
        data = json.dumps(summary, indent=2, sort_keys=True).encode().replace(str(tree).encode(), b"<tree>")
    return data


def digests(run_dir: Path, tree: Path) -> dict[str, str]:
    return {name: hashlib.sha256(record_bytes(run_dir, name, tree)).hexdigest() for name in FILES}


def _wait(process: subprocess.Popen, tree: Path) -> None:
    _, err = process.communicate()
    if process.returncode:
        sys.exit(f"{tree}: the simulations failed:\n{err.strip()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--other", type=directory, help="source tree to compare with (holds oppo/)")
    parser.add_argument("--steps", type=int, default=30, help="steps per case")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--digest", action="store_true", help="print the small cases' record digests as JSON")
    parser.add_argument("--tree", type=directory, default=ROOT, help="with --digest: the tree to run (default: this)")
    args = parser.parse_args()
    every = cases(DIGEST_STEPS if args.digest else args.steps)
    names = DIGEST_CASES if args.digest else args.cases.split(",") if args.cases else list(every)
    unknown = sorted(set(names) - set(every))
    if unknown or not (args.digest or args.other):
        parser.error(f"unknown cases {unknown}" if unknown else "give --other DIR or --digest")
    chosen = {name: every[name] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        if args.digest:
            _wait(simulate(args.tree.resolve(), chosen, Path(tmp)), args.tree)
            print(json.dumps({name: digests(Path(tmp) / name, args.tree.resolve()) for name in chosen}, indent=2))
            return
        trees = {"this": ROOT, "other": args.other.resolve()}
        jobs = {label: simulate(tree, chosen, Path(tmp) / label) for label, tree in trees.items()}  # both at once
        for label, job in jobs.items():
            _wait(job, trees[label])
        differ = 0
        for name in chosen:
            mine, theirs = (Path(tmp) / label / name for label in trees)
            bad = [f for f in FILES if record_bytes(mine, f, trees["this"]) != record_bytes(theirs, f, trees["other"])]
            rows = sum(1 for _ in open(mine / "trace.csv")) - 1
            print(f"{name:<22} {rows:>8} trace rows  {'differ: ' + ', '.join(bad) if bad else 'same'}")
            differ += bool(bad)
    print(f"{len(chosen) - differ} of {len(chosen)} cases the same byte for byte")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
