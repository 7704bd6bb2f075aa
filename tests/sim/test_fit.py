"""The fitted-terms layer (oppo.sim.cost.fit) on hand-made loads: what it does with steps a relative fit cannot
weigh, and which runs it fits together."""

import numpy as np
import pytest

from oppo.sim.cost.fit import fit_stage
from oppo.sim.cost.framework import StageCost, StageLoad


def test_a_rule_reward_rounded_to_zero_on_some_steps_is_fitted_on_totals():
    """A fast rule reward logged to 10 ms (verl prints two decimals) reads 0.00 on the steps under 5 ms: no
    division by those zeros, and no bias from fitting only the steps rounded up (which would overstate the cost by
    about half here); the totals recover the per-sequence cost to the rounding's average error."""
    rng = np.random.default_rng(0)
    units = rng.uniform(400.0, 1600.0, 400)  # sequences scored per step: 2.4-9.6 ms of true time at 6 us each
    measured = np.round(units * 6e-6, 2)
    assert 0.2 < np.mean(measured == 0) < 0.5
    load = StageLoad(units=units, steps=np.ones(units.size))
    with np.errstate(all="raise"):  # a division by a zero step would raise here
        cost = fit_stage(load, measured, gen=False)
    assert cost.per_unit_s == pytest.approx(6e-6, rel=0.15)  # rounding half-up of a skewed spread: +11% here
    rounded_up = measured > 0
    assert np.mean(measured[rounded_up] / units[rounded_up]) > 1.3 * 6e-6  # what dropping the zeros would fit


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
