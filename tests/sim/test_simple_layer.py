"""The frozen simple layer (``oppo/sim/logs/simple.py``, ``docs/simulator.md``: a roofline with one efficiency per
pass kind, the host's time per micro-batch, a per-step constant for generation) and the benchmark that compares it
with the full layer leave-one-group-out, at its smallest size."""

import subprocess
import sys
from pathlib import Path

import pytest

from oppo.sim.cost.stage import StageLoad
from oppo.sim.logs.simple import simple_terms

ROOT = Path(__file__).resolve().parents[2]


def test_the_simple_layer_divides_every_nominal_second_by_one_efficiency_and_sums():
    """Compute, gathers, serial collectives, host copies and the engine's moves at their nominal figures, all over
    the kind's efficiency, summed (no overlap, no micro-batch term), plus the host's time per unit and the per-step
    constant."""
    terms = simple_terms(inverse=2.0, per_unit_s=0.01, fixed_s=3.0)
    load = StageLoad(
        roofline_s=1.0, small_s=5.0, gather_s=0.5, serial_s=0.25, host_s=0.1, host_copy_s=0.2, units=10.0,
        steps=1.0, reshard_s=0.3, transfer_s=0.4, reshard_layers=28.0, reinit_steps=1.0,
    )  # fmt: skip
    nominal = 1.0 + 0.5 + 0.25 + 0.1 + 0.2 + 0.3 + 0.4
    assert terms.seconds(load) == pytest.approx(2.0 * nominal + 10 * 0.01 + 3.0, rel=1e-12)


def test_the_comparison_runs_at_its_smallest_size():
    """Three runs (two Qwen2.5-0.5B siblings and Gemma-2-2B), their first 8 steps: each run predicted by both layers
    fitted outside its group, a row per run and stage, and the summary per pass kind."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "simple_vs_full.py"), "--runs", "small", "--max-steps", "8"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    for run in ("verl-qwen2.5-0.5b-gsm8k", "verl-qwen2.5-0.5b-gsm8k-cap256", "verl-gemma-2-2b-gsm8k"):
        assert any(line.startswith(run) and " step " in f"{line} " for line in lines), run
    assert any(line.startswith("training") for line in lines) and any(line.startswith("gen") for line in lines)
