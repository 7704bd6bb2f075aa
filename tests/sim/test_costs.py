import numpy as np
import pytest

from oppo.sim.costs import Efficiency, RooflineCost, fit_roofline, gpu_efficiencies
from oppo.sim.hardware import ENGINES, GPUS, MODELS


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_known_coefficients(seed):
    rng = np.random.default_rng(seed)
    c, a, b = 3e-5, 1 / 1.5e12, 1 / 2e14  # fixed s, s/byte, s/FLOP
    bytes_read = rng.uniform(1e8, 5e8, 400)
    flops = bytes_read * rng.uniform(1, 4000, 400)
    seconds = (c + np.maximum(a * bytes_read, b * flops)) * rng.normal(1, 0.01, 400)
    fc, fa, fb = fit_roofline(bytes_read, flops, seconds)
    assert fa == pytest.approx(a, rel=0.03) and fb == pytest.approx(b, rel=0.03)
    assert fc == pytest.approx(c, abs=1e-5)


def test_profile_fits_are_physical_and_accurate():
    fits = gpu_efficiencies()
    assert {"a100", "h100", "a40", "h200", "gh200", "a100-40gb"} <= set(fits)
    for fit in fits.values():
        assert 0.3 < fit.efficiency.bandwidth_frac <= 1.0
        assert 0.3 < fit.efficiency.flops_frac <= 1.0
        assert fit.heldout_median_abs_err < 0.10


def test_decode_is_bandwidth_bound_and_prefill_compute_bound():
    cost = RooflineCost(MODELS["qwen2.5-7b"], GPUS["h100"], 1, ENGINES["vllm"], Efficiency())
    one, many = cost.decode_s(1, 100), cost.decode_s(64, 6400)
    assert many < 2 * one  # batching decode is nearly free: weights are read once per iteration
    assert cost.prefill_s(8192, 8192 * 512) > 3 * cost.prefill_s(2048, 2048 * 512)  # compute grows with tokens
    h200 = RooflineCost(MODELS["qwen2.5-7b"], GPUS["h200"], 1, ENGINES["vllm"], Efficiency())
    assert h200.decode_s(1, 100) < one  # more bandwidth, faster decode
