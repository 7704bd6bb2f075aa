"""The fitted terms, the top of the cost stack: the framework layer's stage terms (:mod:`oppo.sim.cost.framework`)
fitted to measured stage seconds, and a whole cost model fitted to the executor's own traces. Every fit here is
least squares of the relative error: non-negative and linear (:func:`nonnegative_lstsq`), or bounded and
nonlinear where compute overlaps the parameter gathers (:func:`_fit_overlapped`).

From real logs (:func:`fit_stage`, :func:`fit_problems`): a stage's seconds are linear in its terms
(:meth:`~oppo.sim.cost.framework.StageCost.seconds` of a :class:`~oppo.sim.cost.framework.StageLoad`), so given each
step's load (:mod:`oppo.sim.logfit` measures it by replaying the log on the simulator) the terms are a linear fit.

From the executor's records (``trace.csv``; :func:`fit_trace`, :class:`CalibratedCost`, ``python -m oppo.sim
calibrate --trace RUN/trace.csv --out oppo/data/profiles/NAME.json``): per role and phase, least squares on the
simulator's own features, in place of the engine and framework layers. Prefill and score rows of a role are one
forward-pass fit (``forward``): the same computation, and together they span short (prompt) and long (whole
sequence) passes. Features: see :data:`TRACE_FEATURES`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oppo.records.schema import TraceRow
from oppo.sim.cost.engine import pass_attended
from oppo.sim.cost.framework import StageCost, StageLoad

LOAD_FIELDS = tuple(f.name for f in dataclasses.fields(StageLoad))
TRACE_FEATURES = """(all linear in the coefficients):
- decode round (a trace row of ``T`` tokens over ``B`` rows, ``C`` context tokens summed over the rows at its
  start; ``it = T/B`` iterations): ``it``, ``it*B``, ``it*C + it*(it-1)/2 * B`` (the summed context of every
  iteration, growing by B per iteration) — per iteration: c0 + c1*batch + c2*summed context;
- prefill / score / train pass of ``N`` tokens over ``B`` rows with ``C`` cached tokens: 1, ``N``, attended
  (query, key) pairs ``N*(C/B + N/(2B))``."""


MIN_INVERSE = 1e-3  # 1 / efficiency at least: a stage at most 1000 times faster than its roofline
# Weight of the priors (the gather terms', an efficiency above the roofline's) against the steps' relative errors,
# per step: a log that times enough steps moves a term as far as its data says (the datasheet link, the assumed
# overlap and the default efficiency fractions are priors, never bounds); a log that cannot tell it from the
# compute terms (gathers far smaller than compute) leaves it where the prior is.
PRIOR_WEIGHT = 0.1
# Collectives whose seconds per step are, to within this share (relative residual of their column regressed on the
# others'), a combination of the other terms' columns cannot be told from them: one run's tensor-parallel
# all-reduces grow with its tokens as its compute does and its gradients' all-reduce is as constant as its
# micro-batch count (residuals 0-2e-5 on the Megatron log and a synthesised run); their link share then stays at the
# nominal figure (a prior of PRIOR_WEIGHT). Runs of three layouts leave 6-10%, and fit it free
IDENTIFIED_RESIDUAL = 0.01
# achieved / nominal link bandwidth: a numerical box for the search, 50x either side of the prior (no real link is)
GATHER_SCALE_BOUNDS = (1 / 50, 50)
PER_STEP_NAMED = ("steps", "reinit_steps", "transfer_s")  # the per-step loads that tell which terms a run pays


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0 (Lawson-Hanson active set, :func:`scipy.optimize.nnls`)."""
    from scipy.optimize import nnls  # here: a simulation that only loads a profile need not import scipy

    a = np.asarray(a, dtype=float)
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0  # columns of seconds, tokens and steps differ by orders of magnitude: solved scaled
    return nnls(a / norms, np.asarray(b, dtype=float))[0] / norms


def fit_stage(
    load: StageLoad, measured: np.ndarray, gen: bool, per_unit: bool = False, reshard_frac: float | None = None
) -> StageCost:
    """Fit one stage's terms to its ``measured`` seconds per step, given its ``load`` per step, so that
    :meth:`StageCost.seconds` of the load matches them (every term >= 0, least relative error; the efficiency is
    not bounded by 1: a GPU faster than its datasheet times the default fractions is no floor). With
    1 / efficiency = i:
    - forward and update stages: measured - extra ≈ i·roofline + h'·small (h' = half · i), and
      with ``per_unit`` also + per_unit·micro-batches: a launch cost per micro-batch that does not grow with the
      model, which runs of different model sizes tell apart from the model-proportional ``half`` (one run cannot:
      its micro-batch count is constant); where the stage gathers sharded parameters, also the achieved share of
      the link and the share of the overlap left exposed (:func:`_fit_overlapped`);
    - ``gen``: measured - extra ≈ i·roofline + per_token·row_tokens + the per-step terms
      (:func:`_fit_generation`; ``reshard_frac``: the reshard's share of its links, where a log times it apart).
    A rule reward timed at 0 s on some steps (under the log's resolution) is fitted on totals: its seconds over its
    sequences, unbiased by that rounding, where dropping the zeros would keep only the steps rounded up. A step of
    a GPU stage timed at 0 s has no relative error to weigh: left out."""
    if not np.any(measured):
        return StageCost()
    if not gen and is_push(load):
        return _fit_push(load, measured)
    if not gen and not np.any(load.roofline_s):  # a rule reward: CPU time per sequence scored, nothing on a GPU
        if np.all(measured > 0):
            unit = nonnegative_lstsq((load.units / measured)[:, None], (measured - load.extra_s) / measured)[0]
        else:
            seconds = np.sum(measured - np.broadcast_to(load.extra_s, measured.shape))
            unit = max(0.0, seconds / np.sum(np.broadcast_to(load.units, measured.shape)))
        return StageCost(per_unit_s=float(unit))
    timed = measured > 0
    if not timed.all():
        shape = measured.shape
        load = StageLoad(**{f: np.broadcast_to(getattr(load, f), shape)[timed] for f in LOAD_FIELDS})
        measured = measured[timed]
    if gen:
        return _fit_generation(load, measured, reshard_frac)
    collectives = has_collectives(load, measured.shape)  # Megatron's: their link's share, a column of its own
    columns = (
        [load.roofline_s, load.small_s] + ([load.units] if per_unit else []) + ([load.serial_s] if collectives else [])
    )
    x = np.stack([np.broadcast_to(c, measured.shape) for c in columns], axis=1) / measured[:, None]
    prior = StageCost()  # the gather terms' priors (sharded passes only)
    # the gathers at the priors, compute larger: their exposed share (the nonlinear fit below moves both terms)
    serial = load.extra_s + prior.exposed_gather_frac * np.asarray(load.gather_s)
    anchored = collectives and not _identified(x)
    inverse, *rest = roofline_lstsq(x, (measured - serial) / measured, anchor_last=anchored)  # 1 / efficiency
    half, unit_s = float(rest[0] / inverse), float(rest[1]) if per_unit else 0.0
    link = {"gather_bandwidth_frac": 1 / max(float(rest[-1]), 1 / GATHER_SCALE_BOUNDS[1])} if collectives else {}
    linear = StageCost(efficiency=float(1.0 / inverse), half_efficiency_tokens=half, per_unit_s=unit_s, **link)
    return _fit_overlapped(linear, load, measured, per_unit) if np.any(load.gather_s) else linear


def is_push(load: StageLoad) -> bool:
    """Whether a stage's load is a weight push: bytes over a link and no compute (a replay's round-off aside)."""
    moved = float(np.max(np.abs(load.gather_s), initial=0.0))
    return moved > 0 and float(np.max(np.abs(load.roofline_s), initial=0.0)) <= 1e-9 * moved


def _fit_push(load: StageLoad, measured: np.ndarray) -> StageCost:
    """The weights pushed to a rollout engine on GPUs of its own: the achieved share of the push's nominal link,
    ``gather_s / frac`` = measured - extra, least relative error (closed form). One term: the bytes are the same
    every step, so a per-push constant could not be told from the link's share."""
    timed = measured > 0  # a step timed 0 s (under the log's resolution) has no relative error to weigh
    ratio = np.broadcast_to(load.gather_s, measured.shape)[timed] / measured[timed]
    target = 1 - np.broadcast_to(load.extra_s, measured.shape)[timed] / measured[timed]
    inverse = float(np.sum(ratio * target) / np.sum(ratio * ratio))  # measured / nominal, > 0 for pushes that took time
    return StageCost(gather_bandwidth_frac=float(np.clip(1 / inverse, *GATHER_SCALE_BOUNDS)))


def has_collectives(load: StageLoad, shape: tuple) -> bool:
    """Whether the stage's passes run collectives on their critical path worth a term (above a replay's round-off)."""
    serial = np.broadcast_to(load.serial_s, shape)
    return bool(np.max(serial, initial=0.0) > 1e-6 * np.max(np.broadcast_to(load.roofline_s, shape), initial=0.0))


def _identified(x: np.ndarray) -> bool:
    """Whether the last column of ``x`` is more than ``IDENTIFIED_RESIDUAL`` (relative) away from every combination
    of the others: the steps tell it apart (collinear, no fit can split it from them)."""
    others, last = x[:, :-1], x[:, -1]
    coefficients = np.linalg.lstsq(others, last, rcond=None)[0]
    return bool(np.linalg.norm(last - others @ coefficients) > IDENTIFIED_RESIDUAL * np.linalg.norm(last))


def roofline_lstsq(x: np.ndarray, target: np.ndarray, anchor_last: bool = False) -> np.ndarray:
    """Non-negative least squares of ``x · c ≈ target`` whose first column is the roofline's, its coefficient the
    inverse efficiency: at least the roofline (an inverse of 1) costs nothing, faster than it (a GPU above its
    datasheet times the default fractions) pays a prior of ``PRIOR_WEIGHT`` per step per unit below 1, so the data
    move it there when they insist and a near-collinear fit cannot wander there. inverse = 1 + up - down, both
    >= 0, the prior on ``down``. ``anchor_last``: the last column's coefficient is pulled to 1 with the same
    weight (seconds at a nominal link: 1 / its achieved share, where the steps cannot tell it from the
    efficiency)."""
    n, others = len(target), x[:, 1:]
    roofline = x[:, :1]
    augmented = np.hstack([roofline, -roofline, others])
    priors = np.zeros((1 + anchor_last, augmented.shape[1]))
    priors[0, 1] = PRIOR_WEIGHT * np.sqrt(n)
    targets = [0.0]
    if anchor_last:
        priors[1, -1] = PRIOR_WEIGHT * np.sqrt(n)
        targets.append(PRIOR_WEIGHT * np.sqrt(n))
    rhs = np.append(target - roofline[:, 0], targets)
    up, down, *rest = nonnegative_lstsq(np.vstack([augmented, priors]), rhs)
    return np.array([max(1.0 + up - down, MIN_INVERSE), *rest])


def unnamed_steps(load: StageLoad, shape: tuple = ()) -> np.ndarray:
    """The steps of runs that declare no named per-step cost of the rollout engine (they alone fit ``fixed_s``)."""
    steps, reinit, transfer = (np.broadcast_to(getattr(load, f), shape or np.shape(load.steps)) for f in PER_STEP_NAMED)
    return steps * (reinit == 0) * (transfer == 0)


def _fit_generation(load: StageLoad, measured: np.ndarray, reshard_frac: float | None) -> StageCost:
    """Generation's terms: efficiency, per-token seconds and the per-step costs, each charged to the runs that
    declare it: the reshard into the engine at its links' achieved share (``reshard_frac`` where a log times it
    apart, else the prior 1: the nominal links); a KV-cache re-initialisation (``cache_reinit_s``, seconds) where
    a run declares ``reinit``; sleep mode's weight moves where it declares ``sleep`` (their links' achieved share,
    ``transfer_frac``, fitted); the unnamed ``fixed_s`` only on runs that declare neither, so a run that does not
    pay a named cost is not charged another's. Where the reshard at its prior alone exceeds what a step pays once
    (the per-step seconds left would be negative), its links' share is fitted instead: the prior is no floor."""
    shape = measured.shape
    roofline, rows = np.broadcast_to(load.roofline_s, shape), np.broadcast_to(load.row_tokens, shape)
    reinit = np.broadcast_to(load.reinit_steps, shape)
    reshard, transfer = np.broadcast_to(load.reshard_s, shape), np.broadcast_to(load.transfer_s, shape)
    named = {"cache_reinit_s": reinit, "transfer": transfer, "fixed_s": unnamed_steps(load, shape)}
    named = {term: column for term, column in named.items() if np.any(column)}
    base = measured - load.extra_s

    def solve(reshard_column: bool) -> dict[str, float]:
        extra = {"reshard": reshard} if reshard_column else {}
        columns = {"inverse": roofline, "per_token_s": rows, **named, **extra}
        target = base if reshard_column else base - reshard / (reshard_frac or 1.0)
        x = np.stack(list(columns.values()), axis=1) / measured[:, None]
        return dict(zip(columns, roofline_lstsq(x, target / measured), strict=True))

    def solve_cornered() -> dict[str, float]:
        """The engine's weight moves (reshard and sleep's, one share: within a run both are constant per step, so
        no fit could split them) priced at a fitted share, the other per-step terms at 0."""
        x = np.stack([roofline, rows, reshard + transfer], axis=1) / measured[:, None]
        inverse, per_token, moves = roofline_lstsq(x, base / measured)
        zero = dict.fromkeys((t for t in named if t != "transfer"), 0.0)
        return {"inverse": inverse, "per_token_s": per_token, "reshard": moves, "transfer": moves, **zero}

    terms = solve(reshard_column=False)
    cornered = not any(terms[t] for t in named)  # every per-step term at 0: the nominal reshard left nothing
    if reshard_frac is None and np.any(reshard) and cornered:
        terms = solve_cornered()
    # a coefficient on seconds at the nominal links is 1 / the achieved share; 0 (the moves cost nothing the
    # steps show) gives the largest share, 1000
    moves = {term: 1 / max(terms.pop(term, 1.0), 1e-3) for term in ("reshard", "transfer")}
    share = {
        "reshard_frac": reshard_frac or moves["reshard"],
        "transfer_frac": moves["transfer"] if np.any(transfer) else 1.0,
    }
    inverse = terms.pop("inverse")
    return StageCost(efficiency=float(1 / inverse), **{t: float(v) for t, v in (terms | share).items()})


def terms_fitted(load: StageLoad, gen: bool, per_unit: bool = False, reshard_timed: bool = False) -> list[str]:
    """The terms :func:`fit_stage` fits for a stage with this load (the others keep their priors or defaults)."""
    if not gen and is_push(load):
        return ["gather_bandwidth_frac"]
    if not gen and not np.any(load.roofline_s):
        return ["per_unit_s"]  # a rule reward: CPU seconds per sequence
    if gen:
        named = {
            "cache_reinit_s": np.any(load.reinit_steps),
            "transfer_frac": np.any(load.transfer_s),
            "fixed_s": np.any(unnamed_steps(load)),
            "reshard_frac": reshard_timed,
        }
        return ["efficiency", "per_token_s", *(term for term, used in named.items() if used)]
    gathers = ["gather_bandwidth_frac", "exposed_gather_frac"] if np.any(load.gather_s) else []
    shape = np.shape(load.roofline_s)
    if has_collectives(load, shape):
        columns = [load.roofline_s, load.small_s, *([load.units] if per_unit else []), load.serial_s]
        if _identified(np.stack([np.broadcast_to(c, shape) for c in columns], axis=1)):
            gathers = ["gather_bandwidth_frac"]  # Megatron's collectives, where the steps tell them apart
    return ["efficiency", "half_efficiency_tokens", *(["per_unit_s"] if per_unit else []), *gathers]


def _fit_overlapped(start: StageCost, load: StageLoad, measured: np.ndarray, per_unit: bool) -> StageCost:
    """The terms of a stage whose passes gather sharded parameters: ``max(compute, gathers) + exposed ·
    min(compute, gathers)`` is not linear in the terms, so they are fitted by bounded nonlinear least squares of
    the relative error (:func:`scipy.optimize.least_squares`) from the linear fit ``start``, with weak priors pulling
    the gather terms to :class:`StageCost`'s defaults. Parameters: 1 / efficiency, half / efficiency,
    per_unit_s (with ``per_unit``), exposed_gather_frac, log gather_bandwidth_frac."""
    from scipy.optimize import least_squares

    prior = StageCost()
    n = len(measured)

    def cost(theta: np.ndarray) -> StageCost:
        inverse, h, u, exposed, log_scale = (float(v) for v in theta)
        return StageCost(
            efficiency=1 / inverse,
            half_efficiency_tokens=h / inverse,
            per_unit_s=u if per_unit else 0.0,
            exposed_gather_frac=min(max(exposed, 0.0), 1.0),
            gather_bandwidth_frac=float(np.exp(log_scale)),
        )

    def residuals(theta: np.ndarray) -> np.ndarray:
        fitted = cost(theta)
        errors = (fitted.seconds(load) - measured) / measured
        weight = PRIOR_WEIGHT * np.sqrt(n)  # per step, so the prior weighs the same against any number of steps
        priors = [weight * (fitted.exposed_gather_frac - prior.exposed_gather_frac), weight * theta[4]]
        priors.append(weight * max(0.0, 1.0 - theta[0]))  # faster than the roofline: as in roofline_lstsq
        return np.concatenate([errors, priors])

    i0 = 1 / start.efficiency
    theta0 = np.array([i0, start.half_efficiency_tokens * i0, start.per_unit_s, prior.exposed_gather_frac, 0.0])
    low, high = np.log(GATHER_SCALE_BOUNDS)
    bounds = ([MIN_INVERSE, 0, 0, 0, low], [np.inf, np.inf, np.inf if per_unit else 1e-12, 1, high])
    best = None
    for scale0 in (0.0, low / 2, high / 2):  # max() has kinks: start from a slow, the nominal and a fast link
        theta0[4] = scale0
        found = least_squares(residuals, np.clip(theta0, bounds[0], bounds[1]), bounds=bounds, x_scale="jac")
        best = found if best is None or found.cost < best.cost else best
    return cost(best.x)


def fit_problems(
    problems: dict[tuple[str, ...], tuple[list[StageLoad], list[np.ndarray]]], reshard_frac: float | None = None
) -> dict[str, StageCost]:
    """One set of terms per problem: its stages (a logged stage timing several of ours shares one set) -> the loads
    and measured seconds per step of every run that times it, fitted at once (``reshard_frac``: generation's, where
    logs time the reshard into the engine apart)."""
    layer: dict[str, StageCost] = {}
    for parts, (loads, measured) in problems.items():
        several = len(loads) > 1  # runs of different shapes separate a per-micro-batch cost from the proportional
        gen = parts == ("gen",)
        frac = reshard_frac if gen else None
        cost = fit_stage(concat_loads(loads), np.concatenate(measured), gen=gen, per_unit=several, reshard_frac=frac)
        layer |= dict.fromkeys(parts, cost)
    return layer


def sum_loads(loads: list[StageLoad]) -> StageLoad:
    """The load of several stages timed as one (the same terms price each)."""
    return StageLoad(**{f: sum(getattr(load, f) for load in loads) for f in LOAD_FIELDS})


def slice_load(load: StageLoad, part: slice) -> StageLoad:
    return StageLoad(**{f: np.asarray(getattr(load, f))[part] for f in LOAD_FIELDS})


def concat_loads(loads: list[StageLoad]) -> StageLoad:
    return StageLoad(**{f: np.concatenate([np.asarray(getattr(load, f)) for load in loads]) for f in LOAD_FIELDS})


# ---------------------------------------------------------------------------------------------------------
# The executor's traces: a whole cost model fitted
# ---------------------------------------------------------------------------------------------------------

FAMILY = {
    "decode": "decode",
    "prefill": "forward",
    "score": "forward",
    "train_actor": "train_actor",
    "train_critic": "train_critic",
    "sync": "sync",
}


HOST = "host"  # the executor's device name for work on the driver's CPU (a rule reward), not a model's device


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
            groups[(row.role, FAMILY[row.phase])].append(row)
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


def _fit(rows: list[TraceRow]) -> np.ndarray:
    x, y = _xy(rows)
    return supported_lstsq(x / y[:, None], np.ones_like(y), groups=np.array([r.step for r in rows]))


HELD_OUT_FOLDS = 10  # folds of the cross-validation that picks a fit's columns (one group each below this many)
SIMPLER_WITHIN = 1.1  # a model with fewer columns wins while its held-out error is within 10% of the best


def supported_lstsq(a: np.ndarray, b: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
    """:func:`nonnegative_lstsq` on the columns the rows support: every subset of the non-zero columns is scored by
    its held-out error (at most :data:`HELD_OUT_FOLDS` folds; ``groups``, e.g. each row's step, are held out whole,
    so that rows of one step never predict each other), and of the fewest columns within :data:`SIMPLER_WITHIN` of
    the best, the subset with the least error is kept; the other columns are 0. A subset needs a
    row to spare when one is held out, so ``n`` rows support at most ``n - 2`` columns.

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
    chosen = min((s for s in subsets if len(s) == size), key=errors.__getitem__)
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
        return self._pass("forward", tokens, attended)

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


def calibrated_costs(path: str | Path, roles: Sequence[str]) -> dict[str, CalibratedCost]:
    profile = load_profile(path)
    # a rollout engine on its own devices runs the actor's generation: the actor's costs
    return {role: CalibratedCost(profile.get("actor" if role == "rollout" else role, {})) for role in roles}
