"""The fitted terms, the top of the cost stack: the framework layer's stage terms (:mod:`oppo.sim.cost.framework`)
fitted to measured stage seconds (a whole cost model fitted to the executor's own traces is
:mod:`oppo.sim.cost.profile`'s). Every fit here is least squares of the relative error: non-negative and linear
(:func:`nonnegative_lstsq`), or bounded and nonlinear where compute overlaps the parameter gathers
(:func:`_fit_overlapped`).

From real logs (:func:`fit_stage`, :func:`fit_problems`): a stage's seconds are linear in its terms but for two
overlaps with compute, the gathers' and the host's (:meth:`~oppo.sim.cost.stage.StageCost.seconds` of a
:class:`~oppo.sim.cost.stage.StageLoad`), so given each step's load (:mod:`oppo.sim.logs.fit` measures it by
replaying the log on the simulator) the terms are a linear fit, refined by a bounded nonlinear one where an
overlap is fitted.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from oppo.sim.cost.stage import StageCost, StageLoad

LOAD_FIELDS = tuple(f.name for f in dataclasses.fields(StageLoad))


MIN_INVERSE = 1e-3  # 1 / efficiency at least: a stage at most 1000 times faster than its roofline
# Weight of the priors (the gather terms', an efficiency above the roofline's) against the steps' relative errors,
# per step: a log that times enough steps moves a term as far as its data says (the datasheet link, the assumed
# overlap and the default efficiency fractions are priors, never bounds); a log that cannot tell it from the
# compute terms (gathers far smaller than compute) leaves it where the prior is.
PRIOR_WEIGHT = 0.1
# Weight of the links' priors in the overlapped fit (the gathers' log share and exposed overlap, the host link's
# share), per step: a tenth of PRIOR_WEIGHT. At PRIOR_WEIGHT a link at a quarter of its nominal figure cost the
# prior as much as a 14% error on every step did, so a family of passes sharing one set of terms (SHARED_TERMS)
# settled 3-7% off its own steps near the nominal link (synthesised runs, tests/sim/test_floors.py)
LINK_PRIOR_WEIGHT = 0.01
# Collectives whose seconds per step are, to within this share (relative residual of their column regressed on the
# others'), a combination of the other terms' columns cannot be told from them: one run's tensor-parallel
# all-reduces grow with its tokens as its compute does and its gradients' all-reduce is as constant as its
# micro-batch count (residuals 0-2e-5 on the Megatron log and a synthesised run). Runs of three layouts leave 6-10%.
# The share is fitted behind its prior either way (PRIOR_WEIGHT per step of the runs that have collectives); this
# names it among a layer's fitted terms only where the steps could move it
IDENTIFIED_RESIDUAL = 0.01
# Weight of the host share's pull to 1 (its sum with compute), per step: a tie-breaker on the ridge where no run's
# passes wait on the host, far under the steps' errors where one does (0.1 held a synthesised share of 0.2 at 1)
HOST_PRIOR_WEIGHT = 1e-3
# achieved / nominal link bandwidth: a numerical box for the search, 50x either side of the prior (no real link is)
GATHER_SCALE_BOUNDS = (1 / 50, 50)
# Sleep mode's weight moves (2 x the engine's weights over the host link, 0.5-2% of a step) are priced at their link
# with a link's prior, LINK_PRIOR_WEIGHT (roofline_lstsq's anchored columns): fitted free, the share was the one
# per-step term only the sleep-mode run paid, and it took that run's unexplained decode seconds (0.029 of the link
# across the five shared runs: 21 s a step for the GPG run's 0.6 s of moves; 0.014, 43 s, on its own log), then
# charged to every sleep-mode run the layer predicted
SLEEP_PRIOR = "transfer"
PER_STEP_NAMED = ("steps", "reinit_steps", "transfer_s")  # the per-step loads that tell which terms a run pays
# Stages that share one set of terms: the training framework's forward passes, and its training passes, run the same
# kernels through the same loop (micro-batching, hooks, gathers) for every role; what differs between the roles is
# the load (the model, its head: an LM head's V x H or a critic's H x 1), which the roofline prices. Per-stage terms
# were free multipliers: without the two Qwen2.5-0.5B runs, Gemma-2-2B's updates alone could not tell the host's time
# per micro-batch from compute, and the layer put 297 ms a micro-batch on update_actor (the 0.5B updates predicted
# 83-87% too slow) and 60 ms on update_critic
TRAINING_STAGES = ("update_actor", "update_critic")
SHARED_TERMS = (("ref", "values", "old_log_prob"), TRAINING_STAGES)
KIND_NAMES = ("forward", "training")  # SHARED_TERMS's families by name ("gen" and a lone stage are their own)
# Terms held at their StageCost defaults (0, or a link at its nominal share) instead of fitted, as (kind, term):
# an ablation pins one (benchmarks/term_ablation.py); the layer fits every other term as it would
Pinned = frozenset[tuple[str, str]]
# The terms the seven shared verl runs cannot carry: pinned in turn, each left the out-of-group error of the stages it
# prices, in the runs that pay it, as low or lower (paired median over those runs and stages, pinned - fitted: -1.3
# to 0.0 points; python benchmarks/term_ablation.py --base full, leave-one-group-out, 2026-11-29), and the layer
# refitted with all six held was as good leave-one-group-out (docs/simulator.md, "Term by term"). Generation's
# per-token seconds were fitted at 0 already. Held at their defaults where a fit is asked to (calibrate-log --fold,
# as the bundled layer's header runs it); a fit of a user's runs fits every term their steps tell apart
FOLDED: Pinned = frozenset(
    {
        ("gen", "per_token_s"),
        ("gen", "transfer_frac"),
        ("forward", "exposed_gather_frac"),
        ("forward", "collective_frac"),
        ("training", "gather_bandwidth_frac"),
        ("training", "exposed_gather_frac"),
    }
)


def kind_of(parts: tuple[str, ...]) -> str:
    """The kind of pass a problem's stages are, for :data:`Pinned`: "gen", a family of :data:`SHARED_TERMS` by its
    :data:`KIND_NAMES` name, else its stages joined by "+"."""
    named = (name for name, family in zip(KIND_NAMES, SHARED_TERMS, strict=True) if set(parts) <= set(family))
    return next(named, "+".join(parts))


def shared_terms(parts: tuple[str, ...]) -> tuple[str, ...]:
    """The stages whose terms a logged stage's fit sets: its family of :data:`SHARED_TERMS` where it times one
    stage of one, else its own stages."""
    return next((family for family in SHARED_TERMS if len(parts) == 1 and parts[0] in family), parts)


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0 (Lawson-Hanson active set, :func:`scipy.optimize.nnls`)."""
    from scipy.optimize import nnls  # here: a simulation that only loads a profile need not import scipy

    a = np.asarray(a, dtype=float)
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0  # columns of seconds, tokens and steps differ by orders of magnitude: solved scaled
    return nnls(a / norms, np.asarray(b, dtype=float))[0] / norms


class TimedReshard(NamedTuple):
    """A reshard into the rollout engine that a log times apart (verl's ``timing_s/reshard``): the achieved share
    of its bytes' links and its software's seconds per layer (:meth:`StageCost.moves_s`)."""

    frac: float
    layer_s: float


def fit_stage(
    load: StageLoad,
    measured: np.ndarray,
    gen: bool,
    per_unit: bool = False,
    reshard: TimedReshard | None = None,
    host_overlap: bool = True,
    fastest: float = 1.0,
    pinned: frozenset[str] = frozenset(),
) -> StageCost:
    """Fit one stage's terms to its ``measured`` seconds per step, given its ``load`` per step, so that
    :meth:`StageCost.seconds` of the load matches them (every term >= 0, least relative error; the efficiency is
    not bounded by 1: a GPU faster than its datasheet times the default fractions is no floor; a prior pulls
    1 / efficiency up to ``fastest`` only, the roofline's rate, or for a training roofline at an assumed fraction
    of the peak the GPU's measured matmul ceiling, :attr:`~oppo.sim.cost.engine.RooflineCost.train_ceiling_share`).
    With 1 / efficiency = i:
    - forward and update stages: measured - extra ≈ i·roofline + h'·small (h' = half · i), and
      with ``per_unit`` the host's time per micro-batch (Python, hooks, kernel launches: per_unit·micro-batches),
      which runs ahead of the GPU, so a pass costs the larger of the two plus ``exposed_host_frac`` of the smaller:
      it does not grow with the model, and runs of different model sizes tell it apart from the model-proportional
      ``half`` (one run cannot: its micro-batch count is constant), a small model's many short micro-batches
      waiting on the host, a large one's hiding it (:func:`_fit_overlapped`); where the stage gathers sharded
      parameters, also the achieved share of the link and the share of the overlap left exposed;
    - ``gen``: measured - extra ≈ i·roofline + per_token·row_tokens + the per-step terms
      (:func:`_fit_generation`; ``reshard``: the reshard's terms, where a log times it apart).
    ``pinned``: terms held at their defaults, the rest fitted as they would be (an ablation's).
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
        return _fit_generation(load, measured, reshard, pinned)
    collectives = has_collectives(load, measured.shape)  # Megatron's: their link's share, a column of its own
    shared = collectives and "collective_frac" not in pinned
    per_unit = per_unit and "per_unit_s" not in pinned and units_identified(load, measured)
    copied = bool(np.any(load.host_s))  # an offloaded role's copies around a call: the host link's share
    loaded = copied and "host_link_frac" not in pinned
    small = np.zeros_like(measured) if "half_efficiency_tokens" in pinned else load.small_s
    columns = (
        [load.roofline_s, small]
        + ([load.units] if per_unit else [])
        + ([load.host_s] if loaded else [])
        # Megatron's collectives at 1 / share = 1 + slower - faster, each pulled to 0 (the nominal seconds move to
        # the target)
        + ([load.serial_s, -np.asarray(load.serial_s)] if shared else [])
    )
    x = np.stack([np.broadcast_to(c, measured.shape) for c in columns], axis=1) / measured[:, None]
    prior = StageCost()  # the gather terms' priors (sharded passes only)
    # the gathers at the priors, compute larger: their exposed share (the nonlinear fit below moves both terms)
    serial = load.extra_s + prior.exposed_gather_frac * (np.asarray(load.gather_s) + load.host_copy_s)
    serial = serial + (load.serial_s if collectives else 0.0) + (load.host_s if copied and not loaded else 0.0)
    # the host link's share: constant per step as the micro-batch count, so within a run it cannot be told from
    # the micro-batch term: held at its prior unless the steps insist (a load faster than the nominal link)
    anchored = [2 + per_unit] if loaded else []
    # Megatron's collectives behind the datasheet link's prior, either way (PRIOR_WEIGHT per step of its runs): two
    # real logs cannot carry a free share (free, the 16-GPU excerpt put it at the box's bound, collectives for
    # nothing; slower free, the twin's few seconds of them took its unexplained forward time and priced the
    # excerpt's 185% slow)
    either_way = [x.shape[1] - 2, x.shape[1] - 1] if shared else []
    target = (measured - serial) / measured
    inverse, *rest = roofline_lstsq(x, target, anchored, fastest=fastest, penalised=either_way)
    half, unit_s = float(rest[0] / inverse), float(rest[1]) if per_unit else 0.0
    link = {"collective_frac": _share(1.0 + rest[-2] - rest[-1])} if shared else {}
    host = {"host_link_frac": _share(rest[1 + per_unit])} if loaded else {}
    linear = StageCost(efficiency=float(1.0 / inverse), half_efficiency_tokens=half, per_unit_s=unit_s, **link, **host)
    # the host's time may hide behind compute; not fitted in a family with Megatron's rows: fitted there (on the
    # seven shared runs, their host time hiding as FSDP's may), leave-one-group-out's step median went 10.2% -> 5.2%
    # but its stage-weighted median 15.0% -> 19.0% and the values stage's 80% quantile 19% -> 78%
    hidden = per_unit and host_overlap and not collectives and "exposed_host_frac" not in pinned
    prefetched = np.any(load.gather_s) or np.any(load.host_copy_s)  # gathers (and copies) overlapping compute
    fitted = (
        _fit_overlapped(linear, load, measured, per_unit, hidden, fastest, pinned) if prefetched or hidden else linear
    )
    # the pinned terms exactly at their defaults (the nonlinear search holds them within 1e-12 of them)
    return dataclasses.replace(fitted, **{term: getattr(StageCost(), term) for term in pinned})


def units_identified(load: StageLoad, measured: np.ndarray) -> bool:
    """Whether the timed steps tell the host's time per micro-batch from the proportional terms: its column (the
    micro-batches of each row) is no combination of the roofline's and the half-efficiency term's, relative to the
    measured seconds as the fit weighs them (a family's stages of one run may not tell it: their micro-batch counts
    alike and constant, their rooflines in proportion)."""
    timed = measured > 0
    columns = [np.broadcast_to(c, measured.shape)[timed] for c in (load.roofline_s, load.small_s, load.units)]
    return bool(timed.any()) and _identified(np.stack(columns, axis=1) / measured[timed, None])


def _share(coefficient: float) -> float:
    """The achieved share of a nominal link from a fitted coefficient on its seconds (1 / the share; 0, the
    steps show no time for it: the fastest share the search allows)."""
    return 1 / max(float(coefficient), 1 / GATHER_SCALE_BOUNDS[1])


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
    # no time beyond the rest (inverse <= 0): the fastest share the bounds allow
    return StageCost(gather_bandwidth_frac=float(np.clip(1 / max(inverse, 1e-12), *GATHER_SCALE_BOUNDS)))


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


def roofline_lstsq(
    x: np.ndarray,
    target: np.ndarray,
    anchored: list[int] | tuple = (),
    anchor_weight: float = PRIOR_WEIGHT,
    fastest: float = 1.0,
    penalised: list[int] | tuple = (),
) -> np.ndarray:
    """Non-negative least squares of ``x · c ≈ target`` whose first column is the roofline's, its coefficient the
    inverse efficiency: at least ``fastest`` (1: the roofline's own rate) costs nothing, faster (a GPU above its
    datasheet times the default fractions) pays a prior of ``PRIOR_WEIGHT`` per step per unit below it, so the data
    move it there when they insist and a near-collinear fit cannot wander there. inverse = fastest + up - down,
    both >= 0, the prior on ``down``. ``anchored``: columns of ``x`` whose coefficients are pulled to 1 with
    ``anchor_weight`` per step (seconds at a nominal link: 1 / its achieved share, where the steps cannot tell it
    from the efficiency or the micro-batch term); ``penalised``: columns whose coefficients are pulled to 0 with
    ``PRIOR_WEIGHT`` per step that has them (nonzero: a family's other runs' rows neither add to the prior nor take
    from it)."""
    n, others = len(target), x[:, 1:]
    roofline = x[:, :1]
    augmented = np.hstack([roofline, -roofline, others])
    weight, anchor = PRIOR_WEIGHT * np.sqrt(n), anchor_weight * np.sqrt(n)
    priors = np.zeros((1 + len(anchored) + len(penalised), augmented.shape[1]))
    priors[0, 1] = weight
    for row, column in enumerate(anchored, start=1):
        priors[row, column + 1] = anchor  # x's column c is the augmented one's c + 1
    for row, column in enumerate(penalised, start=1 + len(anchored)):
        priors[row, column + 1] = PRIOR_WEIGHT * np.sqrt(np.count_nonzero(x[:, column]))
    rhs = np.append(target - fastest * roofline[:, 0], [0.0] + [anchor] * len(anchored) + [0.0] * len(penalised))
    up, down, *rest = nonnegative_lstsq(np.vstack([augmented, priors]), rhs)
    return np.array([max(fastest + up - down, MIN_INVERSE), *rest])


def unnamed_steps(load: StageLoad, shape: tuple = ()) -> np.ndarray:
    """The steps of runs that declare no named per-step cost of the rollout engine (they alone fit ``fixed_s``)."""
    steps, reinit, transfer = (np.broadcast_to(getattr(load, f), shape or np.shape(load.steps)) for f in PER_STEP_NAMED)
    return steps * (reinit == 0) * (transfer == 0)


def _fit_generation(
    load: StageLoad, measured: np.ndarray, reshard: TimedReshard | None, pinned: frozenset[str] = frozenset()
) -> StageCost:
    """Generation's terms: efficiency, per-token seconds and the per-step costs, each charged to the runs that
    declare it: the reshard into the engine at its terms (``reshard`` where a log times it apart, else its bytes at
    the nominal links and no software time); a KV-cache re-initialisation (``cache_reinit_s``, seconds) where
    a run declares ``reinit``; sleep mode's weight moves where it declares ``sleep`` (their links' achieved share,
    ``transfer_frac``, fitted behind a link's prior: :data:`SLEEP_PRIOR`); the unnamed ``fixed_s`` only on runs that
    declare neither, so a run that does not pay a named cost is not charged another's. Where the reshard at its
    prior alone exceeds what a step pays once (the free per-step terms all fitted at 0), its links' share is fitted
    instead: the prior is no floor. (A run that sleeps has no free per-step term: there the untimed reshard's bytes
    at the nominal links, 0.05-0.3 s for a 7B model, stay a floor.)"""
    shape = measured.shape
    roofline, rows = np.broadcast_to(load.roofline_s, shape), np.broadcast_to(load.row_tokens, shape)
    reinit = np.broadcast_to(load.reinit_steps, shape)
    resharded, transfer = np.broadcast_to(load.reshard_s, shape), np.broadcast_to(load.transfer_s, shape)
    layers = np.broadcast_to(load.reshard_layers, shape)
    timed = reshard or TimedReshard(frac=1.0, layer_s=0.0)
    named = {"cache_reinit_s": reinit, "transfer": transfer, "fixed_s": unnamed_steps(load, shape)}
    held = (pinned & {"cache_reinit_s", "fixed_s"}) | ({"transfer"} if "transfer_frac" in pinned else set())
    named = {term: column for term, column in named.items() if np.any(column) and term not in held}
    # a pinned sleep mode's moves at their nominal link
    base = measured - load.extra_s - (transfer if "transfer" in held else 0.0)
    rows = np.zeros(shape) if "per_token_s" in pinned else rows

    def fit(columns: dict[str, np.ndarray], target: np.ndarray) -> dict[str, float]:
        """Each column's coefficient (the first the roofline's), sleep mode's moves pulled to their nominal link
        (:data:`SLEEP_PRIOR`)."""
        x = np.stack(list(columns.values()), axis=1) / measured[:, None]
        anchored = [list(columns).index(SLEEP_PRIOR)] if SLEEP_PRIOR in columns else []
        terms = roofline_lstsq(x, target / measured, anchored, anchor_weight=LINK_PRIOR_WEIGHT)
        return dict(zip(columns, terms, strict=True))

    def solve() -> dict[str, float]:
        """The reshard at its share (timed apart, else the prior 1), every other term fitted."""
        target = base - resharded / timed.frac - layers * timed.layer_s
        return fit({"inverse": roofline, "per_token_s": rows, **named}, target)

    free = [term for term in named if term != SLEEP_PRIOR]  # the per-step terms fitted without a prior

    def solve_cornered() -> dict[str, float]:
        """The reshard's links at a fitted share, sleep mode's moves still behind their prior, the free per-step
        terms at 0."""
        columns = {"inverse": roofline, "per_token_s": rows, "reshard": resharded}
        columns |= {SLEEP_PRIOR: transfer} if SLEEP_PRIOR in named else {}
        return fit(columns, base) | dict.fromkeys(free, 0.0)

    terms = solve()
    cornered = bool(free) and not any(terms[t] for t in free)  # each at 0: the nominal reshard left nothing
    if reshard is None and np.any(resharded) and cornered and "reshard_frac" not in pinned:
        terms = solve_cornered()
    # a coefficient on seconds at the nominal links is 1 / the achieved share; 0 (the moves cost nothing the
    # steps show) gives the largest share, 1000
    moves = {term: 1 / max(terms.pop(term, 1.0), 1e-3) for term in ("reshard", "transfer")}
    share = {
        "reshard_frac": reshard.frac if reshard else moves["reshard"],
        "reshard_layer_s": timed.layer_s,
        "transfer_frac": moves["transfer"] if np.any(transfer) else 1.0,
    }
    inverse = terms.pop("inverse")
    return StageCost(efficiency=float(1 / inverse), **{t: float(v) for t, v in (terms | share).items()})


def terms_fitted(
    load: StageLoad,
    measured: np.ndarray,
    gen: bool,
    per_unit: bool = False,
    reshard: TimedReshard | None = None,
    pinned: frozenset[str] = frozenset(),
    host_overlap: bool = True,
) -> list[str]:
    """The terms :func:`fit_stage` fits for a stage with this load and these measured seconds (the others keep
    their priors or defaults; ``reshard``: a timed reshard's terms, which name what it moved off its prior;
    ``pinned``: held at their defaults; ``host_overlap`` false: the host's overlap not fitted, as there)."""
    hidden = host_overlap and "per_unit_s" not in pinned  # the host's time per micro-batch may hide
    held = pinned | (set() if hidden else {"exposed_host_frac"})
    return [term for term in _terms_fitted(load, measured, gen, per_unit, reshard) if term not in held]


def _terms_fitted(
    load: StageLoad, measured: np.ndarray, gen: bool, per_unit: bool, reshard: TimedReshard | None
) -> list[str]:
    if not gen and is_push(load):
        return ["gather_bandwidth_frac"]
    if not gen and not np.any(load.roofline_s):
        return ["per_unit_s"]  # a rule reward: CPU seconds per sequence
    if gen:
        named = {
            "cache_reinit_s": np.any(load.reinit_steps),
            "transfer_frac": np.any(load.transfer_s),
            "fixed_s": np.any(unnamed_steps(load)),
            "reshard_frac": bool(reshard and reshard.frac != 1.0),
            "reshard_layer_s": bool(reshard and reshard.layer_s > 0),
        }
        return ["efficiency", "per_token_s", *(term for term, used in named.items() if used)]
    gathered, copied = bool(np.any(load.gather_s)), bool(np.any(load.host_copy_s))
    gathers = ["gather_bandwidth_frac"] * gathered + ["exposed_gather_frac"] * (gathered or copied)
    shape = np.shape(load.roofline_s)
    host = ["per_unit_s", "exposed_host_frac"] if per_unit and units_identified(load, measured) else []
    if has_collectives(load, shape):  # a family with Megatron's rows (alone or beside FSDP's), as fit_stage does
        host = host[:1]  # the host's time added to compute, its overlap not fitted
        loaded = [load.host_s] if np.any(load.host_s) else []
        columns = [load.roofline_s, load.small_s, *([load.units] if per_unit else []), *loaded, load.serial_s]
        if _identified(np.stack([np.broadcast_to(c, shape) for c in columns], axis=1)):
            gathers = [*gathers, "collective_frac"]  # Megatron's collectives, where the steps could move the share
    host_link = ["host_link_frac"] if np.any(load.host_s) or copied else []
    return ["efficiency", "half_efficiency_tokens", *host, *gathers, *host_link]


def _fit_overlapped(
    start: StageCost,
    load: StageLoad,
    measured: np.ndarray,
    per_unit: bool,
    hidden: bool = False,
    fastest: float = 1.0,
    pinned: frozenset[str] = frozenset(),
) -> StageCost:
    """The terms of a stage whose passes gather sharded parameters: ``max(compute, gathers) + exposed ·
    min(compute, gathers)`` is not linear in the terms, so they are fitted by bounded nonlinear least squares of
    the relative error (:func:`scipy.optimize.least_squares`) from the linear fit ``start``, with weak priors pulling
    the gather terms to :class:`StageCost`'s defaults; also the fit of the host's time per micro-batch
    (``per_unit``), overlapped with compute the same way. Parameters: 1 / efficiency, half / efficiency,
    per_unit_s and exposed_host_frac (with ``per_unit``), exposed_gather_frac, log gather_bandwidth_frac (sharded
    passes), 1 / host_link_frac (an offloaded role loaded once a pass, or its shards copied in before each gather:
    its seconds at the nominal link, the coefficient pulled to 1 as in the linear fit, so that a link 20 times the
    nominal costs the prior no more than 1, where a log-scale prior would cost it 3), 1 / collective_frac
    (Megatron's rows' collectives: pulled to 1 with ``PRIOR_WEIGHT`` per step that has them, as in the linear fit).
    ``pinned``: terms held at their defaults (their parameters' bounds closed there)."""
    from scipy.optimize import least_squares

    prior = StageCost()
    n = len(measured)
    collective_rows = np.count_nonzero(np.broadcast_to(load.serial_s, measured.shape))

    def cost(theta: np.ndarray) -> StageCost:
        inverse, h, u, exposed, log_scale, host, host_link, collective = (float(v) for v in theta)
        return StageCost(
            efficiency=1 / inverse,
            half_efficiency_tokens=h / inverse,
            per_unit_s=u if per_unit else 0.0,
            exposed_gather_frac=min(max(exposed, 0.0), 1.0),
            gather_bandwidth_frac=float(np.exp(log_scale)),
            exposed_host_frac=min(max(host, 0.0), 1.0) if hidden else 1.0,
            host_link_frac=1 / host_link,
            collective_frac=1 / collective,
        )

    def residuals(theta: np.ndarray) -> np.ndarray:
        fitted = cost(theta)
        errors = (fitted.seconds(load) - measured) / measured
        weight = PRIOR_WEIGHT * np.sqrt(n)  # per step, so the prior weighs the same against any number of steps
        links = LINK_PRIOR_WEIGHT * np.sqrt(n)
        priors = [links * (fitted.exposed_gather_frac - prior.exposed_gather_frac), links * theta[4]]
        priors.append(links * (theta[6] - 1.0))  # the host link at its nominal share unless the steps insist
        priors.append(weight * max(0.0, fastest - theta[0]))  # faster than the roofline: as in roofline_lstsq
        priors.append(PRIOR_WEIGHT * np.sqrt(collective_rows) * (theta[7] - 1.0))  # the datasheet's, either way
        # the host's time summed with compute unless the steps say it hides: where no run waits on the host, the
        # share and the host time are one product (any share fits), and this tie-breaker picks the sum; where one
        # does, it weighs nothing against the steps
        priors.append(HOST_PRIOR_WEIGHT * np.sqrt(n) * (fitted.exposed_host_frac - 1.0))
        return np.concatenate([errors, priors])

    i0 = 1 / start.efficiency
    low, high = np.log(GATHER_SCALE_BOUNDS)
    # an offloaded role: its host link to fit
    loaded = bool(np.any(load.host_s) or np.any(load.host_copy_s)) and "host_link_frac" not in pinned
    host_link0 = 1 / start.host_link_frac if loaded else 1.0
    shared = has_collectives(load, measured.shape) and "collective_frac" not in pinned  # their link's share to fit
    theta0 = np.array(
        [
            *(i0, start.half_efficiency_tokens * i0, start.per_unit_s, prior.exposed_gather_frac, 0.0, 1.0),
            *(host_link0, 1 / start.collective_frac),
        ]
    )
    # the gathers of sharded parameters: their link to fit
    linked = bool(np.any(load.gather_s)) and "gather_bandwidth_frac" not in pinned
    host_links = (1 / GATHER_SCALE_BOUNDS[1], 1 / GATHER_SCALE_BOUNDS[0]) if loaded else (1 - 1e-12, 1 + 1e-12)
    half = 1e-12 if "half_efficiency_tokens" in pinned else np.inf
    exposed = (prior.exposed_gather_frac,) * 2 if "exposed_gather_frac" in pinned else (0.0, 1.0)
    collectives = (1 / GATHER_SCALE_BOUNDS[1], 1 / GATHER_SCALE_BOUNDS[0]) if shared else (1 - 1e-12, 1 + 1e-12)
    bounds = (
        [MIN_INVERSE, 0, 0, exposed[0] - 1e-12, low if linked else -1e-12, 0, host_links[0], collectives[0]],
        [
            *(np.inf, half, np.inf if per_unit else 1e-12, exposed[1] + 1e-12, high if linked else 1e-12, 1),
            *(host_links[1], collectives[1]),
        ],
    )
    # max() has kinks: start from a slow, the nominal and a fast link, and from the host's time summed and hidden
    # (at the summed fit's host time and twice it)
    links = (0.0, low / 2, high / 2) if linked else (0.0,)
    unit = start.per_unit_s
    hosts = [(1.0, unit), (0.0, unit), (0.0, 2 * unit)] if hidden else [(1.0, unit)]
    best = None
    for scale0 in links:
        for host0, unit0 in hosts:
            theta0[2], theta0[4], theta0[5] = unit0, scale0, host0
            found = least_squares(residuals, np.clip(theta0, bounds[0], bounds[1]), bounds=bounds, x_scale="jac")
            best = found if best is None or found.cost < best.cost else best
    return cost(best.x)


def per_unit_identified(runs: int, stages: int, summed: bool) -> bool:
    """Whether a problem's rows may tell the host's time per micro-batch from the model-proportional terms (where
    the columns do: :func:`units_identified`): rows of runs of different shapes may, and so may a family's stages
    (their models or heads differ, their micro-batch counts alike); one run's one stage cannot (its micro-batch
    count is constant), nor a logged stage timing several of ours as one (``summed``)."""
    return runs > 1 or (stages > 1 and not summed)


def problem_rows(summed: bool, problem: tuple) -> tuple[StageLoad, np.ndarray, bool]:
    """A problem's rows as one load and its measured seconds, and whether they may fit the host's time per
    micro-batch (:func:`per_unit_identified`)."""
    loads, measured, timed = problem
    return concat_loads(loads), np.concatenate(measured), per_unit_identified(len(loads), len(timed), summed)


def fit_problems(
    problems: dict[tuple[tuple[str, ...], bool], tuple[list[StageLoad], list[np.ndarray], set[str]]],
    reshard: TimedReshard | None = None,
    fastest: dict[tuple[str, ...], float] | None = None,
    pinned: Pinned = frozenset(),
) -> dict[str, StageCost]:
    """One set of terms per problem: (its stages, whether a row's load is their sum) -> the loads and measured
    seconds per step of every run that times it (one entry per run) and the logged stages they time, fitted at
    once. A problem's stages are a logged stage's (one of ours, or several timed as one, their loads summed:
    OpenRLHF's) or a family of :data:`SHARED_TERMS` (a row per stage). ``reshard``: generation's, where logs time
    the reshard into the engine apart; ``fastest``: a problem's least inverse efficiency free of the prior, by its
    stages (a problem whose stages are all of a family given takes its figure; 1 elsewhere: :func:`fit_stage`);
    ``pinned``: (kind, term) held at their defaults in the problems of that kind (:func:`kind_of`)."""
    layer: dict[str, StageCost] = {}
    for (parts, summed), problem in problems.items():
        load, seconds, several = problem_rows(summed, problem)
        gen = parts == ("gen",)
        # a logged stage timing several of ours (OpenRLHF's): the simulator overlaps each part's host time with its
        # own compute, a fit of their summed loads could not say how: their host time is summed
        timed = reshard if gen else None
        free = next((v for family, v in (fastest or {}).items() if set(parts) <= set(family)), 1.0)
        held = frozenset(term for kind, term in pinned if kind == kind_of(parts))
        cost = fit_stage(load, seconds, gen, several, timed, host_overlap=not summed, fastest=free, pinned=held)
        layer |= dict.fromkeys(parts, cost)
    return layer


def sum_loads(loads: list[StageLoad]) -> StageLoad:
    """The load of several stages timed as one (the same terms price each)."""
    return StageLoad(**{f: sum(getattr(load, f) for load in loads) for f in LOAD_FIELDS})


def scale_load(load: StageLoad, factor: np.ndarray) -> StageLoad:
    """The load ``factor`` times over (per step): every term is linear in the load, and the overlap of compute
    with the gathers scales with both."""
    return StageLoad(**{f: np.asarray(getattr(load, f)) * factor for f in LOAD_FIELDS})


def slice_load(load: StageLoad, part: slice) -> StageLoad:
    return StageLoad(**{f: np.asarray(getattr(load, f))[part] for f in LOAD_FIELDS})


def concat_loads(loads: list[StageLoad]) -> StageLoad:
    return StageLoad(**{f: np.concatenate([np.asarray(getattr(load, f)) for load in loads]) for f in LOAD_FIELDS})
