"""The fitted-terms layer (oppo.sim.cost.fit) on hand-made loads: what it does with steps a relative fit cannot
weigh, and which runs it fits together."""

import numpy as np
import pytest

from oppo.sim.cost.fit import fit_stage
from oppo.sim.cost.framework import StageCost, StageLoad


def test_a_step_timed_at_zero_seconds_does_not_break_the_relative_fit():
    """A rule reward logged as 0.0 s in a step (the timer's rounding, a step that scored nothing) has no relative
    error to weigh: the fit leaves that step out and recovers the per-sequence cost from the others."""
    units = np.array([512.0, 512.0, 480.0, 512.0, 500.0])  # sequences scored per step
    measured = units * 8e-5
    measured[2] = 0.0
    load = StageLoad(units=units, steps=np.ones(5))
    with np.errstate(all="raise"):  # a division by the zero step would raise here
        cost = fit_stage(load, measured, gen=False)
    assert cost.per_unit_s == pytest.approx(8e-5, rel=1e-9)


def test_a_gpu_stage_with_a_step_timed_at_zero_fits_the_other_steps():
    truth = StageCost(efficiency=0.5, half_efficiency_tokens=1000.0)
    roofline = np.array([1.0, 1.2, 0.9, 1.1, 1.3, 1.05])
    small = roofline / np.array([400.0, 800.0, 300.0, 600.0, 1000.0, 500.0])  # roofline s per micro-batch token
    load = StageLoad(roofline_s=roofline, small_s=small, units=np.ones(6), steps=np.ones(6))
    measured = truth.seconds(load)
    measured[0] = 0.0
    with np.errstate(all="raise"):
        cost = fit_stage(load, measured, gen=False)
    assert cost.efficiency == pytest.approx(0.5, rel=1e-6)
    assert cost.half_efficiency_tokens == pytest.approx(1000.0, rel=1e-6)


def test_a_stage_timed_at_zero_in_every_step_fits_no_cost():
    load = StageLoad(units=np.full(3, 512.0), steps=np.ones(3))
    assert fit_stage(load, np.zeros(3), gen=False) == StageCost()
