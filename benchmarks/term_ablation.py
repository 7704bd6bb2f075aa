"""The framework layer's terms one at a time (``docs/simulator.md``, "A model no bigger than its data"): each
fitted term pinned to its default in turn (a share at its nominal link, an exposed overlap at its prior, the rest
at 0: :data:`oppo.sim.cost.fit.Pinned`), the rest refitted, leave-one-group-out over the shared verl runs as in
``simple_vs_full.py``, paired by run and stage against the full layer.

    python benchmarks/term_ablation.py --base full           # every term fitted: the ablation that chose FOLDED
    python benchmarks/term_ablation.py                       # as the bundled layer is fitted (--fold), the rest
    python benchmarks/term_ablation.py --runs small --max-steps 8 --terms forward.per_unit_s   # the smoke test's

The rule as it stands (its history below): a term is **kept** where pinning it raises the paired median error
(pinned - base, the layer it is pinned from) over the out-of-group cells of the stages it prices (its kind's:
generation's with the reshard, the forward passes', the training passes') in the runs that pay it (:func:`pays`);
**folded** where that median is 0 or below and some cell moved; **undecided** where the runs that pay it are of
one group or none (held out, that group has no run to fit it on, pinned or not) or no cell moved (fitted at its
default already). The step's and the stage-weighted error's paired medians are printed beside it. Exits 0. A fold
is made (:data:`oppo.sim.cost.fit.FOLDED`) where the rule says fold and the layer refitted with every folded term
held is no worse leave-one-group-out (step median and worst, stage-weighted) by more than a few tenths of a point.

Its history, each change made after seeing a run's verdicts (docs/simulator.md, "Term by term"):
- As first committed, before any run: the cells were every run's cells of the kind, and "undecided" was "no cell
  moved". Run so, it folded the reshard's software, which one group pays: refitting the other terms moves every
  cell a little. The one-group clause and the paying runs' cells came next; the latter turned the forward passes'
  host link to kept and the training passes' gather terms to folded.
- The check on the refitted layer came after a pass on the folded layer said fold for the training passes'
  micro-batch term (-0.2% over its cells) whose refitted layer's worst leave-one-group-out step went 33.0% -> 39.6%
  (on the current fold, 32.8% -> 39.4%): kept.
- Verdicts within half a point of 0 turn with small changes to the fit: fitting the collectives' share jointly with
  the gathers (a later fix) turned the forward passes' gathers' share from folded (-0.0%) to kept (+2.6%) and their
  micro-batch term (fitted at 0) from folded to undecided.
"""

import argparse
import sys

import numpy as np
from simple_vs_full import RUNS, predicted, runs_of

from oppo.cli import format_table
from oppo.sim.cost.fit import FOLDED
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
# the loads on which a run pays a term (a run with the kind's stages pays the others; the reshard's software: a
# run whose log times the reshard apart)
PAID_ON = {
    "cache_reinit_s": ("reinit_steps",),
    "transfer_frac": ("transfer_s",),
    "gather_bandwidth_frac": ("gather_s",),
    "exposed_gather_frac": ("gather_s", "host_copy_s"),
    "host_link_frac": ("host_s", "host_copy_s"),
    "collective_frac": ("serial_s",),
}


def cell_kind(stage: str) -> str | None:
    """The kind of pass whose terms price a logged stage (the reshard is generation's; a rule reward none)."""
    return "gen" if stage == "reshard" else None if stage == "reward" else kind_of(stage)


def pays(run, kind: str, term: str) -> bool:
    """Whether the run's replayed loads pay ``term`` of ``kind``'s stages (its fitted value prices them)."""
    if term == "reshard_layer_s":
        return any(step.stages.get("reshard", 0) > 0 for step in run.log.steps)
    loads = [load for stage, load in run.replayed.loads.items() if cell_kind(stage) == kind]
    fields = PAID_ON.get(term)
    return any(fields is None or any(np.any(getattr(load, f)) for f in fields) for load in loads)


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


def verdict(diffs: list[float], groups: int) -> str:
    """The rule (this module's docstring) on a term's paired differences, paid by runs of ``groups`` groups."""
    if groups < 2 or not any(abs(d) > MOVED for d in diffs):
        return "undecided"
    return "kept" if np.median(diffs) > 0 else "folded"


def ablate(runs, candidates: list[str], base: frozenset) -> list[dict]:
    """A row per candidate "kind.term" not in ``base`` (the terms the compared layer holds already): its cells'
    paired differences, pinned - base, and its verdict."""
    full = errors(runs, base)
    candidates = [c for c in candidates if tuple(c.split(".")) not in base]
    rows = []
    for n, candidate in enumerate(candidates, start=1):
        print(f"[{n}/{len(candidates)}] {candidate}", file=sys.stderr, flush=True)
        kind, term = candidate.split(".")
        pinned = errors(runs, base | {(kind, term)})
        diff = {cell: pinned[cell] - full[cell] for cell in full}
        paying = {run.name for run in runs if pays(run, kind, term)}
        groups = len({run_group(run.setup) for run in runs if run.name in paying})
        own = [d for (name, stage), d in diff.items() if cell_kind(stage) == kind and name in paying]
        steps = [d for (_, stage), d in diff.items() if stage == "step"]
        weighted = [d for (_, stage), d in diff.items() if stage == "stage_weighted"]
        rows.append(
            {
                "kind": kind,
                "term pinned": term,
                "groups": groups,
                "cells": len(own),
                "pinned - base (its cells)": float(np.median(own)) if own else 0.0,
                "pinned as good": sum(d <= 0 for d in own),
                "step": float(np.median(steps)),
                "stage-weighted": float(np.median(weighted)),
                "verdict": verdict(own, groups),
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
    parser.add_argument(
        "--base",
        choices=("full", "folded"),
        default="folded",
        help="the layer the terms are pinned from: every term fitted (full), or as the bundled layer is fitted, "
        "calibrate-log --fold's terms held (folded, the default: oppo.sim.cost.fit.FOLDED)",
    )
    args = parser.parse_args()
    base = frozenset() if args.base == "full" else FOLDED
    print(format_table(_shown(ablate(runs_of(args.runs, args.max_steps), args.terms, base))))


if __name__ == "__main__":
    main()
