import json

import numpy as np
import pytest

from oppo.records import TraceRow
from oppo.sim.calibrate import CalibratedCost, fit_trace, load_profile, save_profile
from oppo.sim.costs import pass_attended


def synthetic_trace(seed=0):
    """Rows timed by known coefficients: decode c=(1e-3, 2e-4, 1e-6), forward (2e-3, 5e-6, 1e-8)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(60):
        b, it, ctx = int(rng.integers(2, 32)), int(rng.integers(1, 64)), int(rng.integers(10, 4000))
        t = it * 1e-3 + it * b * 2e-4 + 1e-6 * (it * ctx + it * (it - 1) / 2 * b)
        rows.append(TraceRow(0, "cpu0", "actor", "decode", 0.0, t * rng.normal(1, 0.002), b, it * b, ctx))
        n, c = int(rng.integers(8, 5000)), int(rng.integers(0, 3000))
        t = 2e-3 + 5e-6 * n + 1e-8 * pass_attended(n, c, b)
        phase = "prefill" if rng.random() < 0.5 else "score"
        rows.append(TraceRow(0, "cpu0", "reward", phase, 0.0, t * rng.normal(1, 0.002), b, n, c))
    return rows


def test_fit_recovers_coefficients_and_roundtrips(tmp_path):
    fits = fit_trace(synthetic_trace())
    np.testing.assert_allclose(fits["actor"]["decode"].coefficients, (1e-3, 2e-4, 1e-6), rtol=0.05)
    np.testing.assert_allclose(fits["reward"]["forward"].coefficients, (2e-3, 5e-6, 1e-8), rtol=0.05)
    path = tmp_path / "p.json"
    save_profile(fits, path, "synthetic")
    cost = CalibratedCost(load_profile(path)["actor"])
    assert cost.decode_s(4, 100) == pytest.approx(1e-3 + 4 * 2e-4 + 1e-4, rel=0.05)
    assert json.loads(path.read_text())["roles"]["reward"]["forward"]["rows"] == 60


def test_committed_profiles_load():
    for name in ("tiny-cpu", "small-cpu"):
        from oppo.sim.costs import PROFILE_DIR

        profile = load_profile(PROFILE_DIR / f"{name}.json")
        assert {"decode", "forward", "train_actor"} <= set(profile["actor"])


def test_bad_profile(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match="not a cost profile"):
        load_profile(tmp_path / "x.json")
