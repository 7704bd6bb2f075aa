"""The framework layer's terms one at a time (``docs/simulator.md``, "A model no bigger than its data"): each
fitted term pinned to its default in turn (a share at its nominal link, an exposed overlap at its prior, the rest
at 0: :data:`oppo.sim.cost.fit.Pinned`), the rest refitted, leave-one-group-out over the shared verl runs as in
``simple_vs_full.py``, paired by run and stage against the full layer.

    python benchmarks/term_ablation.py                       # the seven shared runs, every candidate (~8 min)
    python benchmarks/term_ablation.py --runs small --max-steps 8 --terms forward.per_unit_s   # the smoke test's

The rule, fixed before any ablation was run: a term is **kept** where pinning it raises the paired median error
(pinned - full) over the out-of-group cells of the stages it prices (its kind's: generation's with the reshard,
the forward passes', the training passes'); **folded** where that median is 0 or below and some cell moved;
**undecided** where no cell moved (no run outside the term's own group pays it, or it is at its default already).
The step's and the stage-weighted error's paired medians are printed beside it. Exits 0.
"""

import argparse
import sys

import numpy as np
from simple_vs_full import RUNS, predicted, runs_of

from oppo.cli import format_table
from oppo.sim.logs.fit import fit_layer
from oppo.sim.logs.shared import run_group
from oppo.sim.logs.simple import kind_of

TERMS = {
    "gen": ("per_token_s", "cache_reinit_s", "transfer_frac", "reshard_layer_s"),
    "forward": (
        "half_efficiency_tokens",
        "per_unit_s",
        "exposed_host_frac",
        "gather_bandwidth_frac",
        "exposed_gather_frac",
        "host_link_frac",
        "collective_frac",
    ),
}
TERMS["training"] = TERMS["forward"]
CANDIDATES = tuple(f"{kind}.{term}" for kind, terms in TERMS.items() for term in terms)
MOVED = 1e-4  # a cell's error moved by more than this (absolute, a share) counts as moved


def cell_kind(stage: str) -> str | None:
    """The kind of pass whose terms price a logged stage (the reshard is generation's; a rule reward none)."""
    return "gen" if stage == "reshard" else None if stage == "reward" else kind_of(stage)


def errors(runs, pinned: frozenset) -> dict[tuple[str, str], float]:
    """(run, cell) -> the median absolute relative error of each run predicted by the layer fitted outside its group
    with ``pinned`` held; cells: "step", "stage_weighted" and each logged stage."""
    out = {}
    for run in runs:
        strangers = [r for r in runs if run_group(r.setup) != run_group(run.setup)]
        if not strangers:
            continue
        report = predicted(run, fit_layer(strangers, whole=True, rule=run.setup.reward is None, pinned=pinned))
        out[run.name, "step"] = report["step"]["median_abs_err"]
        out[run.name, "stage_weighted"] = report["step"]["stage_weighted_err"]
        out |= {(run.name, stage): report["stages"][stage]["median_abs_err"] for stage in report["stages"]}
    return out


def verdict(diffs: list[float]) -> str:
    if not any(abs(d) > MOVED for d in diffs):
        return "undecided"
    return "kept" if np.median(diffs) > 0 else "folded"


def ablate(runs, candidates: list[str]) -> list[dict]:
    full = errors(runs, frozenset())
    rows = []
    for n, candidate in enumerate(candidates, start=1):
        print(f"[{n}/{len(candidates)}] {candidate}", file=sys.stderr, flush=True)
        kind, term = candidate.split(".")
        pinned = errors(runs, frozenset({(kind, term)}))
        diff = {cell: pinned[cell] - full[cell] for cell in full}
        own = [d for (_, stage), d in diff.items() if cell_kind(stage) == kind]
        steps = [d for (_, stage), d in diff.items() if stage == "step"]
        weighted = [d for (_, stage), d in diff.items() if stage == "stage_weighted"]
        rows.append(
            {
                "kind": kind,
                "term pinned": term,
                "cells": len(own),
                "pinned - full (its cells)": float(np.median(own)) if own else 0.0,
                "pinned as good": sum(d <= 0 for d in own),
                "step": float(np.median(steps)),
                "stage-weighted": float(np.median(weighted)),
                "verdict": verdict(own),
            }
        )
    return rows


def _shown(rows: list[dict]) -> list[dict]:
    return [{k: f"{v:+.1%}" if isinstance(v, float) else v for k, v in row.items()} for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", choices=sorted(RUNS), default="shared", help="which logs (default: shared)")
    parser.add_argument("--max-steps", type=int, default=0, help="the first N steps of each log (0: all)")
    parser.add_argument(
        "--terms",
        nargs="+",
        choices=CANDIDATES,
        default=list(CANDIDATES),
        metavar="KIND.TERM",
        help=f"the terms to pin, one at a time (default: all {len(CANDIDATES)}: {', '.join(CANDIDATES)})",
    )
    args = parser.parse_args()
    print(format_table(_shown(ablate(runs_of(args.runs, args.max_steps), args.terms))))


if __name__ == "__main__":
    main()
