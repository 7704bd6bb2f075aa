"""A whole cost model fitted to the executor's own records (``trace.csv``; :func:`fit_trace`,
:class:`CalibratedCost`, ``python -m oppo.sim calibrate --trace RUN/trace.csv --out oppo/data/profiles/NAME.json``):
per role and phase, least squares of the relative error on the simulator's own features, in place of the engine
and framework layers. Prefill and score rows of a role are one forward-pass fit (``forward``): the same computation,
and together they span short (prompt) and long (whole sequence) passes. Features: see :data:`TRACE_FEATURES`.
A rollout engine's own iterations (rows on its lane, ``cpu0/vllm``) are one row per iteration (``it = 1``): its
decode rows fit the per-iteration model of a continuous-batching engine directly, and its prefill passes are a
family of their own (``engine_prefill``: another implementation of the pass than the trainer's).
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oppo.records.schema import HOST, TraceRow, on_engine
from oppo.sim.cost.engine import pass_attended
from oppo.sim.cost.fit import nonnegative_lstsq

TRACE_FEATURES = """(all linear in the coefficients):
- decode round (a trace row of ``T`` tokens over ``B`` rows, ``C`` context tokens summed over the rows at its
  start; ``it = T/B`` iterations): ``it``, ``it*B``, ``it*C + it*(it-1)/2 * B`` (the summed context of every
  iteration, growing by B per iteration) — per iteration: c0 + c1*batch + c2*summed context;
- prefill / score / train pass of ``N`` tokens over ``B`` rows with ``C`` cached tokens: 1, ``N``, attended
  (query, key) pairs ``N*(C/B + N/(2B))``."""

FAMILY = {
    "decode": "decode",
    "prefill": "forward",
    "score": "forward",
    "train_actor": "train_actor",
    "train_critic": "train_critic",
    "sync": "sync",
}


def _family(row: TraceRow) -> str:
    return "engine_prefill" if row.phase == "prefill" and on_engine(row.device) else FAMILY[row.phase]


def _features(row: TraceRow) -> list[float]:
    if row.phase == "sync":
        return [1.0, 0.0, 0.0]
    if row.phase == "decode":
        b = max(row.batch_size, 1)
        it = row.num_tokens / b
        return [it, it * b, it * row.context_tokens + it * (it - 1) / 2 * b]
    return [1.0, float(row.num_tokens), pass_attended(row.num_tokens, row.context_tokens, row.batch_size)]


@dataclass(frozen=True)
class Fit:
    coefficients: tuple[float, float, float]
    rows: int
    median_abs_err: float  # relative, on the rows it was fitted on


def fit_trace(trace: Sequence[TraceRow]) -> dict[str, dict[str, Fit]]:
    """{role: {phase: Fit}} by non-negative least squares (relative error) on each (role, phase)'s rows.

    Forward passes are fitted once over every role's rows, then scaled per role: a sync run gives a scorer
    passes of one size only (whole sequences), which cannot separate its fixed cost from its per-token cost,
    while the actor's rows (short prompt prefills and whole-sequence scoring) can. This assumes the roles share
    an architecture up to a factor, as the presets do. Rows on the host (a rule reward) are no model's pass and are
    left out.
    """
    groups: dict[tuple[str, str], list[TraceRow]] = defaultdict(list)
    for row in trace:
        if row.device == HOST:  # a rule reward scoring on the driver: no pass of a model (its 1 ms rows would
            continue  # make the passes' shared fit a constant per pass)
        if row.end_s > row.start_s and row.phase in FAMILY and (row.num_tokens > 0 or row.phase == "sync"):
            groups[(row.role, _family(row))].append(row)
    forward = [r for (_, phase), rows in groups.items() if phase == "forward" for r in rows]
    shared = _fit(forward) if forward else None
    fits: dict[str, dict[str, Fit]] = defaultdict(dict)
    for (role, phase), rows in sorted(groups.items()):
        coef = _fit(rows) if phase != "forward" else shared * _scale(shared, rows)
        x, y = _xy(rows)
        err = np.abs(x @ coef - y) / y
        fits[role][phase] = Fit(tuple(float(c) for c in coef), len(rows), float(np.median(err)))
    return dict(fits)


def _xy(rows: list[TraceRow]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([_features(r) for r in rows]), np.array([r.end_s - r.start_s for r in rows])


# Where the rows cannot tell a pass's terms apart, the one its physics names first: a forward or training pass's
# seconds grow with its tokens (its FLOPs), then with its attended pairs; a constant per pass only where the rows
# say so. Passes whose sizes span less than SPAN_TO_SEPARATE (a sync run's scorers on vLLM: whole sequences only,
# the short prompt prefills being the engine's) cannot separate a fixed cost from a per-token one, and noise then
# picks either: a constant fitted to one size charged a 32-token streamed chunk the whole sequence's 7.2 s (a vLLM
# `oppo` run predicted 71 s a step against 49 s measured). There the pass is priced per token.
PASS_PREFERENCE = (1, 2, 0)
SPAN_TO_SEPARATE = 2.0


def _fit(rows: list[TraceRow]) -> np.ndarray:
    x, y = _xy(rows)
    groups = np.array([r.step for r in rows])
    if rows[0].phase in ("decode", "sync"):
        return supported_lstsq(x / y[:, None], np.ones_like(y), groups=groups)
    tokens = x[:, 1]
    if tokens.max() < SPAN_TO_SEPARATE * tokens.min():  # one size: the physics' first term alone
        coef = np.zeros(x.shape[1])
        coef[PASS_PREFERENCE[0]] = nonnegative_lstsq(x[:, [PASS_PREFERENCE[0]]] / y[:, None], np.ones_like(y))[0]
        return coef
    return supported_lstsq(x / y[:, None], np.ones_like(y), groups=groups, prefer=PASS_PREFERENCE)


HELD_OUT_FOLDS = 10  # folds of the cross-validation that picks a fit's columns (one group each below this many)
SIMPLER_WITHIN = 1.1  # a model with fewer columns wins while its held-out error is within 10% of the best


def supported_lstsq(
    a: np.ndarray, b: np.ndarray, groups: np.ndarray | None = None, prefer: Sequence[int] = ()
) -> np.ndarray:
    """:func:`nonnegative_lstsq` on the columns the rows support: every subset of the non-zero columns is scored by
    its held-out error (at most :data:`HELD_OUT_FOLDS` folds; ``groups``, e.g. each row's step, are held out whole,
    so that rows of one step never predict each other), and of the fewest columns within :data:`SIMPLER_WITHIN` of
    the best, the subset with the least error is kept (with ``prefer``, an order of the columns: the subset of
    the most preferred columns among those within :data:`SIMPLER_WITHIN` of the best); the other columns are 0. A
    subset needs a row to spare when one is held out, so ``n`` rows support at most ``n - 2`` columns.

    A run that never varies a load cannot tell its terms apart: a sync run decodes every step at one batch size
    and nearly the same context, so its per-iteration, per-row and per-context decode terms are (nearly) collinear,
    and a plain fit may put the whole cost on the context term, which then charges a run with longer contexts
    (carried sequences) far too much. Held out, such a term predicts no better than the simpler model, so it is
    left at 0 and the prediction elsewhere says what the calibration measured."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n, k = a.shape
    columns = [j for j in range(k) if np.any(a[:, j])]
    largest = min(len(columns), n - 2)  # a subset is scored on n - 1 rows with one to spare
    if largest < 1:
        return nonnegative_lstsq(a, b)  # too few rows to hold any out
    labels = np.unique(groups, return_inverse=True)[1] if groups is not None else np.arange(n)
    folds = labels % min(labels.max() + 1, HELD_OUT_FOLDS)
    if len(np.unique(folds)) < 2:
        return nonnegative_lstsq(a, b)  # one group: nothing to hold out
    subsets = [s for size in range(1, largest + 1) for s in itertools.combinations(columns, size)]
    errors = dict(zip(subsets, (_held_out_error(a[:, list(s)], b, folds) for s in subsets)))
    best = min(errors.values())
    size = min(len(s) for s, e in errors.items() if e <= best * SIMPLER_WITHIN)
    rank = {column: i for i, column in enumerate(prefer)}
    good = [s for s in subsets if len(s) == size and (errors[s] <= best * SIMPLER_WITHIN or not prefer)]
    chosen = min(good, key=lambda s: (sorted(rank.get(c, k) for c in s), errors[s]))
    coef = np.zeros(k)
    coef[list(chosen)] = nonnegative_lstsq(a[:, list(chosen)], b)
    return coef


def _held_out_error(a: np.ndarray, b: np.ndarray, folds: np.ndarray) -> float:
    """Mean |residual| of each fold's rows under the fit on the other folds."""
    residuals = np.empty_like(b)
    for fold in np.unique(folds):
        out = folds == fold
        residuals[out] = a[out] @ nonnegative_lstsq(a[~out], b[~out]) - b[out]
    return float(np.mean(np.abs(residuals)))


def _scale(coef: np.ndarray, rows: list[TraceRow]) -> float:
    """The factor that best fits ``rows`` with the shape ``coef`` (median ratio of measured to predicted)."""
    x, y = _xy(rows)
    predicted = x @ coef
    return float(np.median(y / predicted)) if (predicted > 0).all() else 1.0


def save_profile(fits: dict[str, dict[str, Fit]], path: str | Path, source: str) -> None:
    data = {
        "source": source,
        "features": TRACE_FEATURES,
        "roles": {
            role: {
                phase: {"coefficients": f.coefficients, "rows": f.rows, "median_abs_err": f.median_abs_err}
                for phase, f in phases.items()
            }
            for role, phases in fits.items()
        },
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def load_profile(path: str | Path) -> dict[str, dict[str, tuple[float, float, float]]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"cost profile not found: {path}")
    try:
        roles = json.loads(path.read_text())["roles"]
        return {r: {p: tuple(v["coefficients"]) for p, v in phases.items()} for r, phases in roles.items()}
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a cost profile ({err})") from None


@dataclass(frozen=True)
class CalibratedCost:
    """The simulator's cost protocol from fitted coefficients of one role (see module doc for features)."""

    phases: dict  # phase -> (c0, c1, c2)

    def decode_s(self, batch, context_tokens):
        c0, c1, c2 = self.phases.get("decode", (0.0, 0.0, 0.0))
        return c0 + c1 * np.asarray(batch, dtype=float) + c2 * np.asarray(context_tokens, dtype=float)

    def _pass(self, phase: str, tokens: float, attended: float) -> float:
        c0, c1, c2 = self.phases.get(phase, (0.0, 0.0, 0.0))
        return c0 + c1 * tokens + c2 * attended if tokens > 0 else 0.0

    def prefill_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        return self._pass("engine_prefill" if "engine_prefill" in self.phases else "forward", tokens, attended)

    def score_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        return self._pass("forward", tokens, attended)

    def train_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        phase = "train_actor" if "train_actor" in self.phases else "train_critic"
        return self._pass(phase, tokens, attended)

    def sync_s(self) -> float:
        return self.phases["sync"][0] if "sync" in self.phases else 0.0

    def transfer_s(self) -> float:
        """The measured weight sync (a remote role's load_state_dict), or 0 where none was measured."""
        return self.sync_s()

    def fixed_s(self, stages: tuple[str, ...]) -> float:
        return 0.0  # measured per operation: no per-step framework terms

    def update_host_s(self) -> float:
        return 0.0  # the executor keeps every role on its devices


def calibrated_costs(path: str | Path, roles: Sequence[str]) -> dict[str, CalibratedCost]:
    profile = load_profile(path)
    # a rollout engine on its own devices runs the actor's generation: the actor's costs
    return {role: CalibratedCost(profile.get("actor" if role == "rollout" else role, {})) for role in roles}
