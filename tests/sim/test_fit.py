"""The fitted-terms layer (oppo.sim.cost.fit) on hand-made loads: what it does with steps a relative fit cannot
weigh, and which runs it fits together."""

import dataclasses

import numpy as np
import pytest

from oppo.sim.cost.fit import LOAD_FIELDS, fit_stage, terms_fitted
from oppo.sim.cost.stage import StageCost, StageLoad


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


def test_a_weight_push_fits_its_links_share_on_the_steps_it_timed():
    """verl's weight push (a load of bytes over a link, no compute): its achieved share is the nominal seconds over
    the measured, steps read 0.00 s left out (no division by them); nothing else is fitted."""
    nominal = np.full(5, 0.076)  # s at the nominal link per push
    measured = np.array([0.0, 0.25, 0.26, 0.24, 0.25])
    load = StageLoad(gather_s=nominal, roofline_s=np.full(5, 1e-18), steps=np.ones(5))  # a replay's round-off
    with np.errstate(all="raise"):
        cost = fit_stage(load, measured, gen=False)
    assert cost.gather_bandwidth_frac == pytest.approx(0.076 / 0.25, rel=0.02)
    assert (cost.efficiency, cost.per_unit_s, cost.half_efficiency_tokens) == (1.0, 0.0, 0.0)


@pytest.mark.parametrize("share", [0.5, 2.0])
def test_the_push_links_nominal_figure_is_no_floor(share):
    """The push's nominal link (the engine's 200 GB/s) is a prior: a link at half and at twice it is recovered."""
    nominal = np.array([0.076, 0.076, 0.152, 0.152])  # s at the nominal link (two model sizes)
    load = StageLoad(gather_s=nominal, steps=np.ones(4))
    cost = fit_stage(load, nominal / share, gen=False)
    assert cost.gather_bandwidth_frac == pytest.approx(share, rel=1e-9)
    assert cost.seconds(StageLoad(gather_s=0.3, steps=1.0)) == pytest.approx(0.3 / share, rel=1e-9)


def test_a_stage_timed_at_zero_in_every_step_fits_no_cost():
    load = StageLoad(units=np.full(3, 512.0), steps=np.ones(3))
    assert fit_stage(load, np.zeros(3), gen=False) == StageCost()


def sleep_mode_steps(resharded: float = 0.0):
    """60 steps of a sleep-mode run: 20-40 s of decode at the roofline, its rows, sleep's moves (0.6 s at the
    nominal host link) and a reshard's bytes at the nominal links (``resharded`` s, untimed); measured at half
    the roofline's speed plus 30 s a step that no term of the engine names."""
    roofline = np.random.default_rng(0).uniform(20.0, 40.0, 60)
    ones = np.ones(60)
    load = StageLoad(roofline_s=roofline, row_tokens=roofline * 2e4, steps=ones, transfer_s=0.6 * ones)
    load = dataclasses.replace(load, reshard_s=resharded * ones, reshard_layers=28.0 * ones if resharded else 0.0)
    return load, roofline / 0.5 + resharded + 30.0


@pytest.mark.parametrize("resharded", [0.0, 0.05])
def test_a_sleep_mode_runs_unexplained_decode_seconds_are_not_priced_as_a_slower_host_link(resharded):
    """Sleep mode's weight moves are the one per-step term a sleep-mode run pays, so fitted free they took whatever
    its decode terms left: 30 s a step of it priced the moves at 2% of the link, and every sleep-mode run predicted
    with the layer paid 50 times its moves (a 7B model at tensor parallel 1: 1.2 s of moves at the link, 60 s
    charged). Their share is a link's prior: the excess stays with the decode's terms. With an untimed reshard
    beside them (verl's hybrid engine under vLLM >= 0.7), neither share is dragged there either."""
    load, measured = sleep_mode_steps(resharded)
    cost = fit_stage(load, measured, gen=True)
    assert cost.transfer_frac > 0.5  # fitted free: 0.02
    assert cost.reshard_frac == 1.0  # the bytes at the nominal links
    assert cost.seconds(StageLoad(transfer_s=1.2)) < 2 * 1.2


def test_a_nominal_reshard_longer_than_a_step_pays_once_has_its_share_fitted():
    """A run that re-initialises its KV cache and reshards without timing it: where the reshard's bytes at the
    nominal links (5 s) alone exceed what a step pays once (1 s), the per-step terms fit 0 and the reshard's share
    is fitted instead (the datasheets' links are no floor)."""
    roofline = np.random.default_rng(0).uniform(20.0, 40.0, 60)
    ones = np.ones(60)
    load = StageLoad(roofline_s=roofline, row_tokens=roofline * 2e4, steps=ones, reinit_steps=ones)
    load = dataclasses.replace(load, reshard_s=5.0 * ones, reshard_layers=28.0 * ones)
    cost = fit_stage(load, roofline / 0.5 + 1.0, gen=True)
    assert cost.cache_reinit_s == 0.0
    assert cost.reshard_frac == pytest.approx(5.0, rel=0.05)


def test_a_pinned_term_stays_at_its_default_and_the_rest_refit():
    """An ablation's pin: the forward passes' host time per micro-batch held at 0, the efficiency takes its
    seconds; unpinned, the same rows fit it (the fit's two terms told apart by two micro-batch counts)."""
    roofline, units = np.array([10.0, 20.0, 10.0, 20.0]), np.array([4.0, 4.0, 16.0, 16.0])
    load = StageLoad(roofline_s=roofline, units=units)
    measured = roofline / 0.5 + 0.2 * units
    free = fit_stage(load, measured, gen=False, per_unit=True, host_overlap=False)
    pinned = fit_stage(load, measured, gen=False, per_unit=True, host_overlap=False, pinned=frozenset({"per_unit_s"}))
    assert free.per_unit_s == pytest.approx(0.2, rel=1e-3) and free.efficiency == pytest.approx(0.5, rel=1e-3)
    assert pinned.per_unit_s == 0.0 and 0.4 < pinned.efficiency < 0.49  # 0.5 less the host time it absorbs


def test_a_family_of_fsdp_and_megatron_rows_fits_the_collectives_share_with_its_other_terms():
    """FSDP rows (gathers overlapping compute, slower than the link and more exposed than the prior) beside Megatron
    rows (collectives at the datasheet's link) in one family: the overlapped fit moves the collectives' share with
    the gather terms, so the known terms come back and the steps are predicted to 0.5%. Held at the linear fit's
    share (gathers at their priors there), the share came back 2.2 and the host's time 0.36 s (0.2)."""
    rng = np.random.default_rng(0)
    n = 6
    fsdp, megatron = np.r_[np.ones(n), np.zeros(n)], np.r_[np.zeros(n), np.ones(n)]
    load = StageLoad(
        roofline_s=rng.uniform(5, 20, 2 * n),
        gather_s=fsdp * rng.uniform(3, 12, 2 * n),
        serial_s=megatron * rng.uniform(2, 6, 2 * n),
        units=rng.integers(4, 16, 2 * n).astype(float),
    )
    truth = StageCost(efficiency=0.5, per_unit_s=0.2, gather_bandwidth_frac=0.5, exposed_gather_frac=0.3)
    measured = truth.seconds(load)
    fitted = fit_stage(load, measured, gen=False, per_unit=True, host_overlap=False)
    assert fitted.collective_frac == pytest.approx(1.0, rel=0.02) and fitted.per_unit_s == pytest.approx(0.2, rel=0.05)
    assert np.max(np.abs(fitted.seconds(load) / measured - 1)) < 0.005


def test_one_pass_on_floats_is_priced_as_the_same_pass_in_an_array():
    """The simulator prices one pass of floats by the builtins' max and min, the fit arrays of steps by numpy's:
    the same seconds (exactly: max and min pick one operand), and a float back for the simulator's timeouts."""
    cost = StageCost(efficiency=0.6, per_unit_s=0.3, exposed_host_frac=0.4, gather_bandwidth_frac=0.7)
    for compute, units, gather in [(2.0, 3.0, 1.0), (0.5, 10.0, 4.0), (1.0, 1.0, 0.0)]:
        one = StageLoad(roofline_s=compute, units=units, gather_s=gather, host_copy_s=0.1 * gather)
        steps = StageLoad(**{f: np.array([getattr(one, f)] * 2) for f in LOAD_FIELDS})
        seconds = cost.seconds(one)
        assert type(seconds) is float and seconds == cost.seconds(steps)[0]
    # a float beside an array broadcasts (StageLoad's contract): each step as its own pass of floats
    mixed = cost.seconds(StageLoad(roofline_s=2.0, units=np.array([1.0, 20.0]), gather_s=np.array([0.5, 9.0])))
    each = [cost.seconds(StageLoad(roofline_s=2.0, units=u, gather_s=g)) for u, g in [(1.0, 0.5), (20.0, 9.0)]]
    assert list(mixed) == each


def test_the_terms_named_fitted_are_the_ones_the_fit_moves():
    """``terms_fitted`` names the host's overlap only where ``fit_stage`` fits it: not for a stage whose logged
    seconds sum several of ours (``host_overlap`` false), nor with the host's time per micro-batch pinned."""
    roofline, units = np.array([10.0, 20.0, 10.0, 20.0]), np.array([4.0, 4.0, 16.0, 16.0])
    load, measured = StageLoad(roofline_s=roofline, units=units), roofline / 0.5 + 0.2 * units
    assert "exposed_host_frac" in terms_fitted(load, measured, gen=False, per_unit=True)
    assert "exposed_host_frac" not in terms_fitted(load, measured, gen=False, per_unit=True, host_overlap=False)
    pinned = terms_fitted(load, measured, gen=False, per_unit=True, pinned=frozenset({"per_unit_s"}))
    assert "exposed_host_frac" not in pinned and "per_unit_s" not in pinned
