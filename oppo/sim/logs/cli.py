"""``python -m oppo.sim setup-from-log | calibrate-log | validate-log``: a real run's log as a setup, a fitted
framework layer and a prediction checked against every logged step.

python -m oppo.sim setup-from-log run.log.gz --gpu h100 --out runs/setup.toml
python -m oppo.sim calibrate-log --log run.log.gz --out runs/cal             # setup read from the log itself
python -m oppo.sim validate-log --log run.log.gz --setup runs/cal/setup.toml --out runs/val
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from oppo.cli import format_table
from oppo.records.io import atomic_write_text, write_json
from oppo.sim.logs.interval import interval, interval_record, trust_note
from oppo.sim.logs.read import load_run_log
from oppo.sim.logs.trust import calibration, held_out_inside
from oppo.sim.setup.presets import Setup
from oppo.sim.setup.toml_file import load_setup, setup_toml


def add_log_commands(sub) -> None:
    """The log commands' parsers, under ``python -m oppo.sim``."""
    find = sub.add_parser(
        "setup-from-log",
        help="write the setup of a verl run from its console log's launch command and printed configuration",
    )
    find.add_argument("log", help="verl console log (plain or .gz) holding its launch command or configuration")
    find.add_argument("--gpu", help="the run's GPU (default: unknown, read back from the log's MFU when used)")
    _model_option(find)
    find.add_argument("--out", required=True, help="setup TOML to write")
    for name, what in (
        ("calibrate-log", "fit a setup's framework layer to a real run's per-step log, validate on the rest"),
        ("validate-log", "predict every step of a real run's log with a setup as it is (no fitting)"),
    ):
        log = sub.add_parser(name, help=what)
        several = name == "calibrate-log"  # several --log/--setup pairs: one framework layer for every run
        log.add_argument(
            "--log",
            required=True,
            action="append" if several else None,
            help="verl console log (plain or .gz), or per-step CSV / JSON-lines"
            + ("; repeat with a --setup each for one layer fitted across runs" if several else ""),
        )
        log.add_argument(
            "--setup",
            action="append" if several else None,
            help="the run's setup: a preset, a bundled run setup (e.g. verl-qwen2.5-0.5b-gsm8k) or a .toml file "
            "(default: read from the log's own launch command and configuration, as setup-from-log does)"
            + ("; none, or one per --log" if several else ""),
        )
        log.add_argument(
            "--gpu",
            help="the run's GPU, where the setup is read from the log (default: unknown, read back from the log's MFU)",
        )
        _model_option(log)
        log.add_argument(
            "--out",
            required=True,
            help="directory for fidelity.json, fidelity.png and setup.toml (several logs: framework.toml)",
        )
        if name == "calibrate-log":
            log.add_argument("--fit-frac", type=float, default=0.6, help="share of the steps fitted (default: 0.6)")
            log.add_argument(
                "--fold",
                action="store_true",
                help="hold the terms the shared verl runs cannot carry at their defaults, as the bundled layer does "
                "(oppo.sim.cost.fit.FOLDED; default: fit every term the steps tell apart)",
            )


def _model_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-config",
        help="the actor's config.json, or a model name of the catalog, where the log's model.path is none it knows "
        "(a local checkpoint)",
    )


def cmd_calibrate_log(args: argparse.Namespace) -> None:
    from oppo.sim.logs.device import resolve_gpu
    from oppo.sim.logs.fit import calibrated, logged_run

    if args.setup and len(args.log) != len(args.setup):
        raise ValueError(f"{len(args.log)} --log but {len(args.setup)} --setup: give each log its setup, in order")
    if len(args.log) > 1:
        _calibrate_shared(args)
        return
    log = load_run_log(args.log[0])
    chosen, found = run_setup(args.log[0], args.setup[0] if args.setup else None, args)
    setup = resolve_gpu(chosen, log, args.fit_frac)
    run = logged_run(setup, log, args.fit_frac)  # the whole log replayed once: fitted on its first steps, then checked
    fitted = calibrated(run, _pinned(args))
    fidelity = _log_fidelity(fitted, log, run.n_fit, Path(args.out), run.replayed)
    errors = {stage: [e] for stage, e in fidelity.items()}
    record = calibration([setup], errors, basis="within")
    fitted = dataclasses.replace(fitted, framework=dataclasses.replace(fitted.framework, calibration=record))
    print(trust_note(fitted))
    out = Path(args.out)
    if args.setup:
        base = args.setup[0] if not args.setup[0].endswith(".toml") else str(Path(args.setup[0]).resolve())
        atomic_write_text(out / "setup.toml", setup_toml(fitted, base))
    else:  # the setup read from the log, beside the calibrated one that starts from it
        atomic_write_text(out / "log_setup.toml", found.toml())
        atomic_write_text(out / "setup.toml", setup_toml(fitted, str((out / "log_setup.toml").resolve())))
    print(f"-> {Path(args.out) / 'setup.toml'} (use it anywhere a setup is: --setup {Path(args.out) / 'setup.toml'})")


def _pinned(args: argparse.Namespace) -> frozenset:
    """The terms ``--fold`` holds at their defaults (none without it)."""
    from oppo.sim.cost.fit import FOLDED

    return FOLDED if args.fold else frozenset()


def _calibrate_shared(args: argparse.Namespace) -> None:
    """One framework layer fitted across several runs: ``framework.toml``, and per run its within-run and
    leave-one-run-out errors (``fidelity.json``, ``fidelity.png``)."""
    from oppo.records import plots
    from oppo.sim.logs.device import resolve_gpu
    from oppo.sim.logs.fit import fitted_terms, logged_run
    from oppo.sim.logs.shared import run_group, shared_fidelity, summary
    from oppo.sim.setup.toml_file import framework_toml

    logs = [load_run_log(log) for log in args.log]
    setups = args.setup or [None] * len(args.log)
    runs = [
        logged_run(resolve_gpu(run_setup(path, s, args)[0], log, args.fit_frac), log, args.fit_frac)
        for path, log, s in zip(args.log, logs, setups, strict=True)
    ]
    pinned = _pinned(args)
    layer, report, errors, basis = shared_fidelity(runs, pinned)
    groups = [run_group(run.setup) for run in runs]
    record = calibration([run.setup for run in runs], errors, basis=basis, groups=groups)
    coverage = {run.name: float(np.mean(e <= record.step_err)) for run, e in zip(runs, errors["step"], strict=True)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sources = "\n".join(f"  {run.name}: {run.log.source} ({run.n_fit} of {len(run.log.steps)} steps)" for run in runs)
    atomic_write_text(
        out / "framework.toml",
        framework_toml(layer, f"one framework layer fitted by python -m oppo.sim calibrate-log on\n{sources}", record),
    )
    overall = summary(report)
    terms = fitted_terms(runs, pinned)
    cells = {name: sorted(set(entry["within"]["stages"]) & set(terms)) for name, entry in report.items()}
    write_json(
        out / "fidelity.json",
        {
            "runs": report,
            "summary": overall,
            # the contract's keys (step, coverage: the share of runs whose median step error lies inside it, the
            # axes a prediction extrapolates on: none for the runs themselves, stages), and how it was made
            "interval": interval(record_setup(runs[0].setup, record)).as_dict()
            | {"basis": basis, "quantile": record.coverage, "coverage_by_run_steps": coverage}
            | {"axes": dict(zip(record.axes, record.axis_err, strict=True))},
            "fitted_terms": terms,
            # how much the fit rests on: its terms off their priors (stages that share a family share its terms,
            # counted once) and the run-stage cells (a stage a run's log times) they are fitted on
            "fitted_term_count": sum(len(family) for family in {id(v): v for v in terms.values()}.values()),
            "cells": cells,
            "cell_count": sum(map(len, cells.values())),
            "fit_frac": args.fit_frac,
        },
    )
    plots.fidelity_matrix(report, out / "fidelity.png")
    rows = []
    for name, entry in report.items():
        for kind, fid in entry.items():
            cells = {"run": name, "errors": kind, "step": f"{fid['step']['median_abs_err']:.1%}"}
            cells["stage_weighted"] = f"{fid['step']['stage_weighted_err']:.1%}"
            cells |= {stage: f"{r['median_abs_err']:.1%}" for stage, r in fid["stages"].items()}
            rows.append(cells)
    stages = dict.fromkeys(k for r in rows for k in r if k not in ("run", "errors", "step", "stage_weighted"))
    columns = ["run", "errors", "step", "stage_weighted", *stages]
    print(format_table([{c: r.get(c, "-") for c in columns} for r in rows]))
    for kind, measures in overall.items():
        figures = (f"{m} median {v['median']:.1%} worst {v['worst']:.1%}" for m, v in measures.items())
        print(f"{kind}: " + ", ".join(figures))
    inside = sum(e <= record.step_err for e in record.run_step_err)
    held_out = held_out_inside(record, record.step_err)
    out_of_sample = (
        f"; out of sample, {sum(held_out)} of {len(held_out)} inside the ± the runs outside their group give "
        f"({', '.join(f'±{h:.1%}' for h in record.held_out_step_err)})"
        if held_out
        else ""
    )
    print(
        f"interval: ±{record.step_err:.1%} of a step holds {record.coverage:.0%} of the steps predicted "
        f"{basis.replace('_', '-')} (by run: {', '.join(f'{v:.0%}' for v in coverage.values())}); "
        f"{inside} of {len(runs)} runs' median step error inside it (in sample){out_of_sample}"
    )
    print(
        f'-> {out / "framework.toml"} (a setup takes it with [framework] base = "{out / "framework.toml"}"), '
        f"{out / 'fidelity.json'}, {out / 'fidelity.png'}"
    )


def cmd_validate_log(args: argparse.Namespace) -> None:
    from oppo.sim.logs.device import resolve_gpu

    log = load_run_log(args.log)
    _log_fidelity(resolve_gpu(run_setup(args.log, args.setup, args)[0], log), log, 0, Path(args.out))


def _log_fidelity(setup, log, first: int, out: Path, replayed=None) -> dict:
    """Predict the log's steps with ``setup`` (from step ``first``; ``replayed``: the log's replay, if made already):
    ``fidelity.json``, ``fidelity.png`` and the table; returns each stage's absolute relative error per validated
    step."""
    from oppo.records import plots
    from oppo.sim.logs.report import replay_errors, step_errors

    report, measured, predicted = replay_errors(setup, log, first, replayed)
    out.mkdir(parents=True, exist_ok=True)
    note = trust_note(setup)
    if note:
        report["prediction_note"] = note
        report["interval"] = interval_record(setup)
    write_json(out / "fidelity.json", report | {"log": log.source, "setup": setup.name})
    plots.plot_fidelity(measured, predicted, first, out / "fidelity.png", f"{setup.name} on {Path(log.source).name}")
    rows = [
        {
            "stage": name,
            "measured_s": round(r["measured_s"], 3),
            "predicted_s": round(r["predicted_s"], 3),
            "median_abs_err": f"{r['median_abs_err']:.1%}",
        }
        for name, r in [*_step_rows(report), *report["stages"].items()]
    ]
    print(f"{setup.name}: fitted on {first} steps, validated on {report['validate_steps']} (medians)")
    print(format_table(rows))
    if note:
        print(note)
    return step_errors(measured, predicted, first)


def cmd_setup_from_log(args: argparse.Namespace) -> None:
    found = _log_setup(args.log, args.gpu, args.model_config)
    out = Path(args.out)
    if out.suffix != ".toml":
        raise ValueError(f"--out {out}: a setup is a .toml file")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, found.toml())
    rows = [{"setup key": u.key, "value": u.value, "from": u.origin, "verl": u.verl} for u in found.used]
    print(format_table(rows))
    costly = [(k, v, why) for k, v, why in found.ignored if why != "no cost in the model"]
    free = [k for k, _, why in found.ignored if why == "no cost in the model"]
    for key, value, why in costly:
        print(f"ignored {key}={value}: {why}")
    print(f"ignored, no cost in the model ({len(free)}): {', '.join(free)}")
    print(f"-> {out} (use it anywhere a setup is: --setup {out})")


def _log_setup(log: str, gpu: str | None, model: str | None = None):
    from oppo.sim.logs.setup_from_log import setup_from_log

    return setup_from_log(log, gpu, model)


def run_setup(log: str, setup: str | None, args: argparse.Namespace) -> tuple[Setup, object | None]:
    """The setup of the run ``log`` records, and the :class:`LogSetup` it was read as (None for a ``--setup``):
    ``setup`` checked against the log's own configuration where it has one (a setup that contradicts it is
    refused), else the setup read from the log (``args.gpu``, ``args.model_config``)."""
    from oppo.sim.logs.verl_config import contradictions

    if setup is None:
        found = _log_setup(log, args.gpu, args.model_config)
        return found.setup(), found
    if args.gpu or args.model_config:
        raise ValueError("--gpu and --model-config are for a setup read from the log; a --setup names its own")
    chosen = load_setup(setup)
    clash = contradictions(chosen, log)
    if clash:
        raise ValueError(f"--setup {setup} contradicts {log}'s own configuration: {clash}")
    return chosen, None


LOG_COMMANDS = {
    "setup-from-log": cmd_setup_from_log,
    "calibrate-log": cmd_calibrate_log,
    "validate-log": cmd_validate_log,
}


def record_setup(setup: Setup, record) -> Setup:
    """``setup`` carrying the calibration ``record`` (what a calibrated setup file holds)."""
    return dataclasses.replace(setup, framework=dataclasses.replace(setup.framework, calibration=record))


def _step_rows(report: dict) -> list[tuple[str, dict]]:
    """The step's row; an asynchronous trainer's step (``async_step``, as ``async`` predicts it, generation beside
    the trainer) is no sum of its stages, so their sum (``step`` in fidelity.json) gets a row of its own."""
    if "async_step" in report:
        return [("step (async)", report["async_step"]), ("stages summed", report["step"])]
    return [("step", report["step"])]
