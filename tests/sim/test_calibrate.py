import itertools
import json

import numpy as np
import pytest

from oppo.records.schema import TraceRow, engine_lane
from oppo.sim.cost.engine import pass_attended
from oppo.sim.cost.fit import nonnegative_lstsq
from oppo.sim.cost.profile import CalibratedCost, fit_trace, load_profile, save_profile


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


def _one_batch_decode_rows(seed, steps=3, rounds=8, batch=8, width=32, noise=0.05):
    """A sync run's decode rows: one batch size, 16-iteration rounds from the prompt's context up, timed by a
    per-iteration cost alone (2e-2 s, as a GPU's overhead-bound decode), each row 5% noisy."""
    rng = np.random.default_rng(seed)
    return [
        TraceRow(s, "cpu0", "actor", "decode", 0.0, 16 * 2e-2 * rng.normal(1, noise), batch, 16 * batch, ctx)
        for s in range(steps)
        for ctx in ((width + 16 * k) * batch for k in range(rounds))
    ]


def test_a_term_the_rows_cannot_tell_apart_is_not_fitted_to_noise():
    """A run that decodes at one batch size, with per-iteration cost only, predicts a round at 4x its longest context
    (carried sequences) within 10% on all but 2 of 30 noise draws. A plain non-negative fit puts the noise's
    correlation with the context on the context term (6 of 30 draws off by 12-24%: the GPU run's 80% error)."""
    batch, context = 8, (32 + 400) * 8
    errors = []
    for seed in range(30):
        fits = fit_trace(_one_batch_decode_rows(seed))
        far = CalibratedCost({"decode": fits["actor"]["decode"].coefficients})
        errors.append(abs(float(far.decode_s(batch, context)) / 2e-2 - 1))
    assert sum(e > 0.10 for e in errors) <= 2, np.round(sorted(errors), 3)
    assert np.median(errors) < 0.02


def test_committed_profiles_load():
    from oppo.sim.cost.gpu import PROFILE_DIR
    from oppo.sim.cost.profile import TRACE_FEATURES

    for name in ("tiny-cpu", "small-cpu"):
        profile = load_profile(PROFILE_DIR / f"{name}.json")
        assert {"decode", "forward", "train_actor"} <= set(profile["actor"])
        stored = json.loads((PROFILE_DIR / f"{name}.json").read_text())["features"]
        assert stored == TRACE_FEATURES  # the text save_profile writes today


def test_bad_profile(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match="not a cost profile"):
        load_profile(tmp_path / "x.json")


def best_nonnegative_residual(a: np.ndarray, b: np.ndarray) -> float:
    """The exact NNLS optimum by enumeration: the solution is the unconstrained least squares on its support, so
    the best residual over the column subsets whose least squares is non-negative is the optimum."""
    best = float(np.linalg.norm(b))  # the empty subset: all zeros
    for size in range(1, a.shape[1] + 1):
        for subset in itertools.combinations(range(a.shape[1]), size):
            sol, *_ = np.linalg.lstsq(a[:, subset], b, rcond=None)
            if (sol >= 0).all():
                best = min(best, float(np.linalg.norm(a[:, subset] @ sol - b)))
    return best


def test_nonnegative_lstsq_is_the_exact_optimum_on_random_problems():
    """5,000 random 6 x 3 problems: the residual equals the enumerated optimum (to 1e-9 relative), the
    coefficients are >= 0."""
    rng = np.random.default_rng(0)
    worse = []
    for i in range(5000):
        a, b = rng.normal(size=(6, 3)), rng.normal(size=6)
        coef = nonnegative_lstsq(a, b)
        assert (coef >= 0).all()
        got, best = float(np.linalg.norm(a @ coef - b)), best_nonnegative_residual(a, b)
        if got > best * (1 + 1e-9) + 1e-12:
            worse.append((i, got, best))
    assert not worse, f"{len(worse)} of 5000 fits worse than the optimum, e.g. {worse[:3]}"


def test_a_rule_rewards_rows_on_the_host_are_no_forward_pass():
    """A real task's sync run: the actor's and the reference's forward passes cost 6.7 ms a token, the rule reward
    scores each finished sequence on the host in ~1 ms. The passes' shared fit must stay per token, so that a
    streamed chunk of 128 tokens costs what its tokens do: pooled with the host's rows (1 ms for ~100 tokens) the fit
    became a constant of ~9 s a pass, and 104 chunks of the reference cost 1,145 s predicted against 281 s measured."""
    rng = np.random.default_rng(0)
    rows = []
    for step in range(20):
        for role, phase, tokens in (("actor", "prefill", 1000), ("actor", "score", 1650), ("reference", "score", 1650)):
            n = int(tokens * rng.normal(1, 0.04))
            rows.append(TraceRow(step, "cpu0", role, phase, 0.0, 6.7e-3 * n * rng.normal(1, 0.05), 16, n, 0))
        for _ in range(2):
            rows.append(TraceRow(step, "host", "reward", "score", 0.0, 1e-3 * rng.normal(1, 0.2), 8, 100, 0))
    fits = fit_trace(rows)
    reference = CalibratedCost({"forward": fits["reference"]["forward"].coefficients})
    chunk = reference.prefill_s(128, pass_attended(128, 16 * 900, 16))
    assert chunk == pytest.approx(6.7e-3 * 128, rel=0.25)
    assert "reward" not in fits  # a rule on the host: no model's pass to price


@pytest.mark.parametrize("device", ["cpu0", "cuda:0"])
def test_a_rollout_engines_iterations_fit_its_own_decode_and_prefill_not_the_trainers_passes(device):
    """An engine lane's rows (one per iteration) recover a per-iteration decode model c0 + c1 B + c2 C, and its
    prefill passes (10x cheaper a token than the trainer's forward here) are priced apart from the trainer's."""
    rng, lane = np.random.default_rng(3), engine_lane(device, "vllm")
    decode = (4e-2, 2e-3, 1e-5)  # s per iteration, per running request, per context token in the KV caches
    rows = []
    for step in range(12):
        for batch in (4, 8, 16):
            for ctx in (200, 800, 1600):
                t = decode[0] + decode[1] * batch + decode[2] * ctx
                rows.append(TraceRow(step, lane, "actor", "decode", 0.0, t * rng.normal(1, 0.01), batch, batch, ctx))
        for n in (100, 400, 1600):
            rows.append(TraceRow(step, lane, "actor", "prefill", 0.0, 2e-4 * n * rng.normal(1, 0.01), 4, n, 0))
            for role in ("actor", "reference"):
                rows.append(TraceRow(step, device, role, "score", 0.0, 2e-3 * n * rng.normal(1, 0.01), 4, n, 0))
    fits = fit_trace(rows)
    np.testing.assert_allclose(fits["actor"]["decode"].coefficients, decode, rtol=0.1)
    cost = CalibratedCost({p: f.coefficients for p, f in fits["actor"].items()})
    assert cost.prefill_s(1000, 0.0) == pytest.approx(0.2, rel=0.05)  # the engine's pass
    assert cost.score_s(1000, 0.0) == pytest.approx(2.0, rel=0.05)  # the trainer's


def test_passes_of_one_size_are_priced_per_token_not_as_a_constant():
    """A sync run's scorers on vLLM see whole sequences only (the short prompt prefills are the engine's): the rows
    cannot separate a fixed cost from a per-token one, so a pass is priced by its tokens, and a streamed chunk of an
    eighth of the tokens costs an eighth (a constant charged it the whole pass)."""
    rng = np.random.default_rng(5)
    rows = []
    for step in range(8):
        n = int(rng.integers(900, 1100))  # ~16 sequences of ~60 tokens, every step
        for role in ("actor", "reference"):
            rows.append(TraceRow(step, "cpu0", role, "score", 0.0, 7.2 * rng.normal(1, 0.03), 16, n, 0))
    cost = CalibratedCost({p: f.coefficients for p, f in fit_trace(rows)["reference"].items()})
    whole = cost.score_s(1000, 0.0)
    assert whole == pytest.approx(7.2, rel=0.05) and cost.prefill_s(125, 0.0) == pytest.approx(whole / 8, rel=0.05)
