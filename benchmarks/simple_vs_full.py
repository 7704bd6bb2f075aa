"""The full framework layer against the frozen simple one (``docs/simulator.md``, "A model no bigger than its data"),
leave-one-group-out, paired by run and stage: each run's every step predicted by each layer fitted on all steps of
the runs outside its group (:func:`oppo.sim.logs.shared.run_group`).

    python benchmarks/simple_vs_full.py                  # the five shared runs and the Megatron excerpt (~3 min)
    python benchmarks/simple_vs_full.py --runs small --max-steps 8   # the smoke test's size: 3 runs, 8 steps each

Prints one row per run and stage (and the step and the stage-weighted error per run): the median absolute relative
error of the full layer, of the simple one, and simple - full; then, per pass kind, the paired median difference
over the runs and the cells where the simple layer is as good or better. Exits 0.
"""

import argparse
from pathlib import Path

import numpy as np

from oppo.cli import format_table
from oppo.sim.cost.fit import FOLDED
from oppo.sim.logs.device import resolve_gpu
from oppo.sim.logs.fit import fit_layer, logged_run, with_layer
from oppo.sim.logs.read import TrainingLog, load_run_log
from oppo.sim.logs.report import replay_errors
from oppo.sim.logs.shared import run_group
from oppo.sim.logs.simple import fit_simple, kind_of
from oppo.sim.setup.toml_file import load_setup

DATA = Path(__file__).resolve().parents[1] / "tests" / "sim" / "data"
RUNS = {
    "shared": (
        ("verl_qwen2.5_0.5b_resp512.log.gz", "verl-qwen2.5-0.5b-gsm8k"),
        ("verl_qwen2.5_0.5b_resp256.log.gz", "verl-qwen2.5-0.5b-gsm8k-cap256"),
        ("verl_gemma_2_2b.log.gz", "verl-gemma-2-2b-gsm8k"),
        ("verl_deepseek_7b_ppo_8xmi300x.csv.gz", "verl-deepseek-llm-7b-ppo-8xmi300x"),
        ("verl_qwen2_7b_gpg.log.gz", "verl-qwen2-7b-gpg-8gpu"),
        ("verl_qwen2_7b_grpo_megatron_excerpt.log.gz", "verl-qwen2-7b-grpo-megatron-16gpu"),
        ("verl_qwen2_7b_gpg_megatron.log.gz", "verl-qwen2-7b-gpg-megatron-8gpu"),
    ),
}
RUNS["small"] = RUNS["shared"][:3]


def runs_of(which: str, max_steps: int, fit_frac: float = 0.6):
    out = []
    for log_name, setup_name in RUNS[which]:
        log = load_run_log(DATA / log_name)
        if max_steps:
            log = TrainingLog(log.source, tuple(log.steps[:max_steps]))
        setup = resolve_gpu(load_setup(setup_name), log, fit_frac)
        out.append(logged_run(setup, log, fit_frac))
    return out


def predicted(run, layer) -> dict:
    """The run's report under ``layer`` (stages it lacks keep the setup's own terms, as leave-one-out's do)."""
    if run.setup.reward is not None and "ref" in layer:  # a reward model scores with the forward passes' terms
        layer = layer | {"reward": layer["ref"]}
    return replay_errors(with_layer(run.setup, layer), run.log, 0, run.replayed)[0]


def compare(runs) -> list[dict]:
    rows = []
    for run in runs:
        strangers = [r for r in runs if run_group(r.setup) != run_group(run.setup)]
        if not strangers:
            continue
        rule = run.setup.reward is None
        full = predicted(run, fit_layer(strangers, whole=True, rule=rule, pinned=FOLDED))
        simple = predicted(run, fit_simple(strangers))
        cells = [("step", full["step"]["median_abs_err"], simple["step"]["median_abs_err"])]
        cells.append(("stage_weighted", full["step"]["stage_weighted_err"], simple["step"]["stage_weighted_err"]))
        cells += [
            (s, full["stages"][s]["median_abs_err"], simple["stages"][s]["median_abs_err"]) for s in full["stages"]
        ]
        for stage, f, s in cells:
            rows.append({"run": run.name, "stage": stage, "full": f, "simple": s, "simple - full": s - f})
    return rows


def kinds_summary(rows: list[dict]) -> list[dict]:
    out = []
    for kind in ("step", "stage_weighted", "gen", "forward", "training", "rule"):
        cells = [r for r in rows if (r["stage"] if kind in ("step", "stage_weighted") else _kind(r["stage"])) == kind]
        if cells:
            diff = [r["simple - full"] for r in cells]
            out.append(
                {
                    "cells": kind,
                    "n": len(cells),
                    "full median": float(np.median([r["full"] for r in cells])),
                    "simple median": float(np.median([r["simple"] for r in cells])),
                    "paired median simple - full": float(np.median(diff)),
                    "simple as good or better": sum(d <= 0 for d in diff),
                }
            )
    return out


def _kind(stage: str) -> str | None:
    if stage == "reward":
        return "rule"
    if stage == "reshard":
        return "gen"
    return kind_of(stage)


def _shown(rows: list[dict]) -> list[dict]:
    def cell(key, value):
        if key == "simple - full":
            return f"{value:+.1%}"
        return f"{value:.1%}" if isinstance(value, float) else value

    return [{k: cell(k, v) for k, v in r.items()} for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", choices=sorted(RUNS), default="shared", help="which logs (default: shared)")
    parser.add_argument("--max-steps", type=int, default=0, help="the first N steps of each log (0: all)")
    args = parser.parse_args()
    rows = compare(runs_of(args.runs, args.max_steps))
    print(format_table(_shown(rows)))
    print()
    summary = kinds_summary(rows)
    print(format_table([{k: f"{v:.1%}" if isinstance(v, float) else v for k, v in r.items()} for r in summary]))


if __name__ == "__main__":
    main()
