"""How far to trust a prediction, as the commands print it: the interval of a prediction on a calibrated setup
(:func:`interval`, widened by the axes it extrapolates on, :mod:`oppo.sim.logs.trust`) and the one-line note
beside the records (:func:`trust_note`; an uncalibrated setup's says it has no bound)."""

from __future__ import annotations

from dataclasses import dataclass

from oppo.core.config import ScheduleConfig
from oppo.sim.cost.fit import SHARED_TERMS
from oppo.sim.cost.stage import IDENTITY
from oppo.sim.logs.trust import (
    BASES,
    PRICING_NOTES,
    as_run,
    borrows_shared_terms,
    calibration_of,
    extrapolations,
    held_out_inside,
    outside_span,
)
from oppo.sim.setup.presets import Setup


@dataclass(frozen=True)
class Interval:
    """How far to trust a prediction: ``step``, the relative half-width of its sync step's interval (None: no bound),
    widened from the calibration's own by the runs that lay outside the others' span on each axis it extrapolates
    on; ``coverage``, the share of calibration runs whose median step error lies inside it (None: not measured, or
    one run);
    ``extrapolates``, those axes; ``unbounded``, the ones no calibration run lay outside on; ``stages``, each
    stage's half-width, widened by as much as the step's (none where unbounded). ``coverage`` is measured out of
    sample (``held_out``) where the record holds each run's held-out interval: the share of runs whose median step
    error falls inside the interval the runs outside its group give (widened as this one is)."""

    step: float | None
    coverage: float | None
    extrapolates: tuple[str, ...]
    unbounded: tuple[str, ...]
    stages: dict[str, float]
    held_out: bool = False  # the coverage measured out of sample: each run against its other groups' interval
    runs_inside: tuple[int, int] = (0, 0)  # the runs inside it (out of sample where held_out) and the runs counted

    def as_dict(self) -> dict:
        return {
            "step": self.step,
            "coverage": self.coverage,
            "coverage_measured": "out_of_sample" if self.held_out else "in_sample",
            "extrapolates": list(self.extrapolates),
            "stages": self.stages,
        }


def interval(setup: Setup, *schedules: ScheduleConfig | None) -> Interval | None:
    """The interval of a prediction on a calibrated ``setup`` run with ``schedules`` (none given: the setup's own;
    several: compare's policies, the widest), None where uncalibrated."""
    c = calibration_of(setup)
    if not c.runs:
        return None
    found = [a for s in schedules or (None,) for a, _ in outside_span(as_run(setup, s), c)]
    axes = tuple(dict.fromkeys(a for a in found if a not in PRICING_NOTES))
    widen = dict(zip(c.axes, c.axis_err))
    unbounded = tuple(a for a in axes if a not in widen)
    if unbounded:
        return Interval(None, None, axes, unbounded, {})
    step = max([c.step_err, *(widen[a] for a in axes)])
    inside = held_out_inside(c, c.step_err, max([widen[a] for a in axes], default=0.0))
    held_out = inside is not None  # each run against the interval its other groups give
    if not held_out:  # in sample (a record from before), or none: one run's median always lies inside its own quantile
        inside = [e <= step for e in c.run_step_err] if c.run_step_err and c.basis != "within" else []
    coverage = sum(inside) / len(inside) if inside else None
    stages = {s: e + step - c.step_err for s, e in zip(c.stages, c.stage_err)}  # widened as the step is
    return Interval(step, coverage, axes, (), stages, held_out, (sum(inside), len(inside)))


def interval_record(setup: Setup) -> dict:
    """``fidelity.json``'s ``interval`` of a prediction on ``setup``: :meth:`Interval.as_dict`, or for an
    uncalibrated setup the same keys with no bound."""
    bound = interval(setup)
    if bound is None:
        return {
            "step": None,
            "coverage": None,
            "coverage_measured": None,
            "extrapolates": ["uncalibrated"],
            "stages": {},
        }
    return bound.as_dict()


def _percent(x: float) -> str:
    return f"{x:.{0 if x >= 0.1 else 1}%}"


def _coverage(bound: Interval) -> str:
    """The measured coverage printed beside a ± figure: out of sample where the record holds each run's held-out
    interval (each run against the interval the runs outside its group give), else in sample; "" where not
    measured."""
    if bound.coverage is None or (bound.extrapolates and not bound.held_out):  # widened in sample: by construction
        return ""
    inside, counted = bound.runs_inside
    if bound.held_out:
        return (
            f", measured coverage {bound.coverage:.0%} out of sample ({inside} of {counted} runs' median step error "
            "inside the ± the runs outside their group give)"
        )
    return f", measured coverage {bound.coverage:.0%} in sample ({inside} of {counted} runs)"


def _stages(bound: Interval) -> str:
    return ", ".join(f"{s} ±{_percent(e)}" for s, e in bound.stages.items())


def trust_note(setup: Setup, schedule: ScheduleConfig | None = None, *others: ScheduleConfig) -> str | None:
    """One line for a prediction on a calibrated setup run with ``schedule`` (None: the setup's own) and any
    ``others`` (compare's other policies: what only they extrapolate on is named with the policy): its interval and
    what extrapolates (uncalibrated: :func:`_uncalibrated_note`)."""
    c = calibration_of(setup)
    if not c.runs:
        return _uncalibrated_note(setup)
    basis = BASES.get(c.basis, c.basis)
    runs = f"{len(c.runs)} calibration run{'s' if len(c.runs) > 1 else ''}"
    if borrows_shared_terms(setup):
        runs = f"the shared layer's {runs}"
    bound = interval(setup, schedule, *others)
    if bound.step is None:
        why = (
            "the calibration record predates intervals: calibrate again to bound it"
            if not c.run_step_err
            else f"where none of {'its ' * (not runs.startswith('the '))}{runs} lay outside the others"
        )
        note = (
            f"note: {setup.name} predicts a sync step with no bound: extrapolates on {', '.join(bound.unbounded)}, "
            f"{why} (other policies' overlap is the model's)"
        )
    elif bound.extrapolates:  # outside the span on axes some run lay outside on: what those runs were off
        wider = f"widened from ±{_percent(c.step_err)}" if bound.step > c.step_err else f"±{_percent(c.step_err)}"
        note = (
            f"note: {setup.name} predicts a sync step to ±{_percent(bound.step)}{_coverage(bound)} ({wider} of the "
            f"{runs}' steps by the median errors of the runs that lay outside the others on "
            f"{', '.join(bound.extrapolates)}; other policies' overlap is the model's; stages {_stages(bound)})"
        )
    else:
        note = (
            f"note: {setup.name} predicts a sync step to ±{_percent(bound.step)}{_coverage(bound)} "
            f"({c.coverage:.0%} of steps, {basis} over {runs}; other policies' overlap is the model's; stages "
            f"{_stages(bound)})"
        )
    outside = extrapolations(setup, schedule)
    for other in others:
        outside += [f"{phrase} ({other.policy})" for phrase in extrapolations(setup, other) if phrase not in outside]
    return note + ("; extrapolates: " + "; ".join(outside) if outside else "; within the calibration span")


def _uncalibrated_note(setup: Setup) -> str | None:
    """A setup on the bare roofline (generation's, the forward passes' and the training passes' terms at their
    identity: a verl run's bundled setup before calibrate-log; a rule reward's CPU seconds are the shared layer's)
    predicts from priors no run checked: said, with no bound. None for a setup whose costs were fitted elsewhere (an
    executor's records profile) or whose stages a user set."""
    fw = setup.framework
    priced = ("gen", *SHARED_TERMS[0], *SHARED_TERMS[1])
    if setup.cost not in ("fitted", "analytic") or any(fw.stage(stage) != IDENTITY for stage in priced):
        return None
    return (
        f"note: {setup.name} predicts a sync step with no bound: uncalibrated (its framework stages at the roofline's "
        f"priors, the GPU's operator profiles and the engine's declared terms; no run's log fitted); calibrate-log on "
        f"its run's log, or [framework] base = the shared layer, bounds it"
    )
