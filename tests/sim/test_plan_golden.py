"""The planner's answer is the committed one: two small plans (PPO over every policy, GRPO with groups of four) whose
every simulation's figures, to the last bit, and whose ``plan.csv`` rows are in ``golden_plan.json``. A change that
speeds up the simulator or the scheduling core must leave them as they are; a change that moves them on purpose
rewrites the file (``python -m tests.sim.test_plan_golden``) and shows the diff of its rows for review. The setup is
``tiny-cpu``, priced by its executor run's records profile: a refit of the framework or shared-layer costs (the
calibrated and paper setups') does not move it. Written with numpy 2.3.5 and scipy 1.17.1 (the Δ controller's Beta
quantiles): a library upgrade that moves it is checked as for the records' digests (``test_records_digest.py``)."""

import dataclasses
import hashlib
import json
from pathlib import Path

from oppo.core.policies import POLICIES
from oppo.sim.setup.toml_file import load_setup
from oppo.sim.study.plan import PLAN_KEYS, Rungs, Space, plan, plan_rows

GOLDEN = Path(__file__).with_name("golden_plan.json")
RUNGS = Rungs(steps=(8, 16), seeds=(1, 2))


def golden_plans() -> dict:
    """name -> the plan: every policy (Δ bounds of a quarter and all of B, both adaptive controllers) at B = 16,
    and the group-sampling policies with GRPO, G = 4 (groups of several samples: the core's other paths); 72
    simulations in all, about a second."""
    setup = dataclasses.replace(load_setup("tiny-cpu"), batch=16)
    ppo = Space(policies=POLICIES, delta_fractions=(0.25, 1.0), controllers=("slope", "tail"), staleness=(1, 2))
    grpo = Space(policies=("sync", "oppo", "april", "tailbatch"), delta_fractions=(0.5,), controllers=("tail",))
    return {
        "ppo": plan(setup, ppo, budget=80, seed=2, rungs=RUNGS),
        "grpo": plan(setup, grpo, schedule={"algo": "grpo", "group_size": 4}, budget=40, seed=4, rungs=RUNGS),
    }


def answer(result) -> dict:
    """A plan's rows (as ``plan.csv`` holds them) and the sha256 of every simulation's :data:`PLAN_KEYS` at full
    precision (``repr``), in the plan's order."""
    figures = [
        [e.candidate.label, e.rung, e.steps, [[repr(float(s[k])) for k in PLAN_KEYS] for s in e.summaries]]
        for e in result.evaluated
    ]
    digest = hashlib.sha256(json.dumps(figures).encode()).hexdigest()
    return {
        "simulations": result.budget_used,
        "figures_sha256": digest,
        "rows": json.loads(json.dumps(plan_rows(result))),
    }


def test_the_plans_answer_is_the_committed_one():
    assert GOLDEN.is_file(), f"missing committed golden file {GOLDEN}"
    golden = json.loads(GOLDEN.read_text())
    got = {name: answer(result) for name, result in golden_plans().items()}
    assert got.keys() == golden.keys()
    for name in golden:
        assert got[name]["rows"] == golden[name]["rows"], f"{name}: plan.csv rows differ"
        assert got[name] == golden[name], f"{name}: a simulation's figures differ (beyond the rows' rounding)"


if __name__ == "__main__":  # rewrite the golden file from this tree (after an intended change only)
    GOLDEN.write_text(json.dumps({name: answer(r) for name, r in golden_plans().items()}, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
