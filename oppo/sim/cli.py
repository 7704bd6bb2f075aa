"""``python -m oppo.sim``: run, compare, sweep and plan scheduling policies in simulation.

python -m oppo.sim run --setup paper-7b-h200 --policy oppo --steps 200 --out runs/oppo
python -m oppo.sim run --config runs/oppo/config.json --out runs/again          # the same run again
python -m oppo.sim compare --setup paper-7b-h200 --policies sync,intra,inter,oppo --steps 200
python -m oppo.sim sweep --setup paper-7b-h200 --chunks 100,250,500,1000,3000 --out runs/sweep --workers 2
python -m oppo.sim plan --setup paper-7b-h200 --lengths alpaca_eval --max-lag 0.5 --out runs/plan
python -m oppo.sim fit-gpus
python -m oppo.sim calibrate-log --log run.log.gz --setup verl-qwen2.5-0.5b-gsm8k --out runs/cal
python -m oppo.sim compare --setup runs/cal/setup.toml --policies sync,intra,inter,oppo \\
    --streamed-scorers reference,critic
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import sys
from pathlib import Path

from tqdm import tqdm

from oppo.catalog.lengths import LengthTrace, load_lengths
from oppo.cli import add_config_args, format_table, given_options, layered_schedule, run_cli
from oppo.core.config import POLICIES, ScheduleConfig, to_dict
from oppo.core.policies import policy_spec
from oppo.records.io import atomic_write_text, one_writer, write_json, write_run
from oppo.records.optrace import cycle_collector_paused
from oppo.records.stored_config import check_sources, config_from_dict, load_stored_config, with_provenance
from oppo.records.tracking import add_tracking_args, track_run, trackers_from
from oppo.sim.logs.cli import LOG_COMMANDS, add_log_commands
from oppo.sim.logs.interval import interval, trust_note
from oppo.sim.logs.trust import extrapolations
from oppo.sim.model.async_pipeline import AsyncConfig
from oppo.sim.model.trainer import SimConfig
from oppo.sim.setup.presets import PRESETS, Setup
from oppo.sim.setup.toml_file import load_setup, setup_from_dict
from oppo.sim.study.experiments import Run, compare_rows, config_dict, run_config, summarize_config, sweep_config
from oppo.sim.study.pool import IN_PROCESS, Pool, add_pool_args, evaluate, pool_from
from oppo.sim.study.table import resume_arg, table_for

# schedule fields whose default comes from the setup (Setup.schedule)
SCHEDULE_FROM_SETUP = (
    "algo",
    "group_size",
    "batch",
    "max_new_tokens",
    "chunk_candidates",
    "window_tokens",
    "check_tokens",
    "delta_max",
    "delta_init",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m oppo.sim", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="simulate one policy and write its records")
    _common(run)
    run.add_argument("--out", required=True, help="output directory (summary.json, steps.csv, trace.csv, PNGs)")
    add_tracking_args(run)
    compare = sub.add_parser(
        "compare",
        help="simulate several policies side by side; print a table ranked by work done (finished samples / s)",
    )
    _common(compare, policy=False)
    compare.add_argument("--policies", default="sync,intra,inter,oppo,tppo", help="comma-separated policies")
    compare.add_argument("--out", help="optional directory for compare.csv and plots")
    add_pool_args(compare)
    sweep = sub.add_parser("sweep", help="step time against fixed chunk sizes or fixed Δ")
    _common(sweep, policy_shown="intra with --chunks, inter with --deltas")
    sweep.add_argument("--chunks", help="comma-separated chunk sizes (tokens)")
    sweep.add_argument("--deltas", help="comma-separated Δ values (prompts)")
    sweep.add_argument(
        "--out",
        help="directory for sweep.csv and sweep.png (and the journal of finished simulations --resume reads: "
        "journal.jsonl, command.json)",
    )
    resume_arg(sweep, "sweep")
    add_pool_args(sweep)
    plan = sub.add_parser(
        "plan", help="search policies, chunk, Δ bound and controller, staleness and GPU split for the most work / s"
    )
    # the planner searches the async split, not the rollout options, on the setup given (runs re-run with run --config)
    _common(plan, policy=False, rollout=False, config=False)
    # the plan's own options default to None, their defaults set by _plan_defaults: --resume tells an option given
    # (compared with the interrupted command's) from one left out (the interrupted command's value)
    plan.add_argument("--policies", help="policies searched (default: all)")
    plan.add_argument(
        "--knobs",
        choices=("schedule", "framework"),
        help="schedule: the policies' knobs; framework: also the rollout engine's tensor-parallel size and memory "
        "share and the update's micro-batch, each configuration screened for memory, and the best's verl "
        "overrides written to DIR/best/verl_overrides.txt (default: schedule)",
    )
    plan.add_argument("--objective", help="samples (finished samples / s) or tokens (tokens / s) (default: samples)")
    plan.add_argument(
        "--max-lag",
        type=float,
        help="bound on the steady mean policy lag (versions) of the samples trained in the second half of the steps",
    )
    plan.add_argument("--budget", type=int, help="simulations at most, all rungs and seeds (default: 400)")
    plan.add_argument("--rung-steps", help="steps simulated at each rung (default: 40,100,200)")
    plan.add_argument("--rung-seeds", help="seeds simulated at each rung (default: 1,2,3)")
    plan.add_argument(
        "--no-memory-screen",
        action="store_true",
        default=None,
        help="keep configurations the GPU-memory estimate would skip (a run known to fit, e.g. with offload)",
    )
    plan.add_argument(
        "--fresh-seeds",
        type=int,
        help="re-simulate the best and the baselines on this many seeds the search never used, for a gain that "
        "was not chosen on its own noise (0: none; default: 3; outside --budget: up to 3 x N more simulations)",
    )
    plan.add_argument(
        "--out",
        help="directory for plan.csv, pareto.png and best/config.json (and the journal of finished simulations "
        "--resume reads: journal.jsonl, command.json)",
    )
    resume_arg(plan, "plan")
    add_pool_args(plan)
    sub.add_parser("fit-gpus", help="fit GPU efficiencies to the operator profiles; print held-out error")
    add_log_commands(sub)
    cal = sub.add_parser("calibrate", help="fit a cost profile to an executor run's trace.csv")
    cal.add_argument("--trace", required=True, help="trace.csv of an oppo.exec run")
    cal.add_argument("--out", required=True, help="profile JSON to write (e.g. oppo/data/profiles/tiny-cpu.json)")
    return parser


DEFAULTS = {"setup": "paper-7b-h200", "steps": 100, "seed": 0}


def _common(
    parser: argparse.ArgumentParser,
    policy: bool = True,
    rollout: bool = True,
    config: bool = True,
    policy_shown: str | None = None,
) -> None:
    if config:
        parser.add_argument("--config", help="re-run a run: its RUN_DIR/config.json (options given beside it override)")
    parser.add_argument("--setup", help=f"preset ({', '.join(PRESETS)}) or a .toml file (default: {DEFAULTS['setup']})")
    parser.add_argument("--steps", type=int, help=f"PPO steps to simulate (default: {DEFAULTS['steps']})")
    parser.add_argument(
        "--seed", type=int, help=f"random seed for lengths and reward noise (default: {DEFAULTS['seed']})"
    )
    parser.add_argument(
        "--lengths",
        help="response-length trace: a CSV file (plain or .gz; column response_tokens) "
        "or a bundled trace (alpaca_eval, gsm8k, hh_rlhf_harmless)",
    )
    parser.add_argument("--lengths-model", help="keep only trace rows whose 'model' column equals this")
    parser.add_argument("--timeline-steps", default="0,1,2", help="steps drawn in timeline.png")
    skip = () if policy else ("policy",)
    shown = dict.fromkeys(SCHEDULE_FROM_SETUP, "the setup's") | ({"policy": policy_shown} if policy_shown else {})
    add_config_args(parser, ScheduleConfig, skip=skip, shown=shown)
    if rollout:
        add_config_args(parser, AsyncConfig)


def _stored(args: argparse.Namespace) -> dict:
    """The stored config of ``--config`` (empty without one)."""
    path = getattr(args, "config", None)  # plan takes none
    return load_stored_config(path) if path else {}


def _configs(args: argparse.Namespace, policies: list[str | None], async_only: bool = False) -> list[SimConfig]:
    """One config per policy (None: the stored run's policy, else the default): options given on the command
    line over the stored run's settings (``--config``) over the setup's and the simulator's defaults."""
    stored, where = _stored(args), str(args.config)
    given = given_options(ScheduleConfig, args, skip=("policy",))
    steps = _pick(args.steps, stored.get("steps"), DEFAULTS["steps"])
    seed = _pick(args.seed, stored.get("seed"), DEFAULTS["seed"])
    setup = _setup(args)
    rollout_stored = config_from_dict(AsyncConfig, stored.get("rollout", {}), f"{where}: [rollout]")
    rollout = dataclasses.replace(rollout_stored, **given_options(AsyncConfig, args))
    base = config_from_dict(ScheduleConfig, stored.get("schedule", {}), f"{where}: [schedule]") if stored else None
    configs = []
    for policy in policies:
        schedule = layered_schedule(given | ({"policy": policy} if policy else {}), base, setup.schedule)
        # run and sweep take the options as given (refused but for async); compare gives them to async only
        options = rollout if not async_only or schedule.asynchronous else AsyncConfig()
        configs.append(SimConfig(schedule, setup, steps, seed, options))
    return configs


def _setup(args: argparse.Namespace) -> Setup:
    """The setup simulated: ``--setup``, else the stored run's (``--config``), else the default. A ``gpu =
    "unknown"`` setup has no device to simulate on until calibrated on its log: said here, before any simulation."""
    stored = _stored(args)
    if args.setup or not stored:
        setup = load_setup(args.setup or DEFAULTS["setup"])
    else:
        setup = setup_from_dict(stored.get("setup"), f"{args.config}: [setup]")
    setup.gpu_datasheet()
    return setup


def _trust(setup: Setup, *schedules: ScheduleConfig) -> str | None:
    """A calibrated setup's interval and what extrapolates as ``schedules`` run it (their batch, cap, algorithm and
    group size: the flags' values, not the setup's; the GPUs each policy sets aside), made before the command's work
    (a setup whose costs cannot be built fails here, one line) and said once it is done (:func:`_say`): a command that
    stops on bad input prints its one line, no note."""
    setup.costs()
    return trust_note(setup, *schedules)


def _say(note: str | None) -> None:
    """The trust note on stderr, beside the records."""
    if note:
        print(note, file=sys.stderr)


def _pick(*values):
    return next(v for v in values if v is not None)


def _trace(args: argparse.Namespace):
    """The length trace given, or the stored run's (checked unchanged), or None (the setup's length model)."""
    stored = _stored(args)
    if args.lengths:
        return load_lengths(args.lengths, model=args.lengths_model)
    if stored.get("lengths"):
        check_sources(stored.get("sources", {}), {"lengths": stored["lengths"]}, str(args.config))
        return load_lengths(stored["lengths"], model=args.lengths_model or stored.get("lengths_model"))
    if args.lengths_model:
        raise ValueError("--lengths-model needs --lengths")
    return None


def _run(config: SimConfig, trace, label: str) -> Run:
    """Simulate with a progress bar (shown on a terminal only)."""
    with tqdm(total=config.steps, desc=label, unit="step", disable=None, leave=False) as bar:
        return run_config(config, trace, progress=lambda _: bar.update())


def cmd_run(args: argparse.Namespace) -> None:
    # One run, its records kept until its files and plots are made: they make no reference cycles (~100k containers
    # at 1000 x 512, the operations with their member and end-time lists), so the cyclic garbage collector would
    # only rescan them as they grow. It is back on once they are freed.
    with cycle_collector_paused():
        # imported here, not where the records are made: importing matplotlib leaves reference cycles through the
        # importing frames (pyparsing's exceptions), which would keep that frame's records alive until collected
        from oppo.records import plots

        _run_and_write(args, plots)


def _run_and_write(args: argparse.Namespace, plots) -> None:
    trackers = trackers_from(args)
    trace = _trace(args)
    (config,) = _configs(args, [args.policy])
    note = _trust(config.setup, config.schedule)
    r = _run(config, trace, config.schedule.policy)
    result, summary, wall_s = r.result, r.summary, r.summary["wall_s"]
    write_run(args.out, result.steps, result.trace, result.trained, summary)
    write_json(Path(args.out) / "config.json", with_provenance(summary["config"]))
    chosen = [int(s) for s in args.timeline_steps.split(",") if s]
    plots.timeline(
        result.trace, Path(args.out) / "timeline.png", chosen, f"{config.setup.name} / {config.schedule.policy}"
    )
    plots.reward_curves({config.schedule.policy: result.steps}, Path(args.out) / "rewards.png")
    track_run(args.out, trackers, backend="sim")
    print(
        f"{config.schedule.policy}: mean step {summary['mean_step_s']:.2f} s, p99 {summary['p99_step_s']:.2f} s, "
        f"utilization {summary['mean_utilization']:.1%}, mean deferrals {summary['mean_deferrals']:.2f}, "
        f"final reward {summary['final_reward']:.2f} ({len(result.steps)} steps in {wall_s:.2f} s) -> {args.out}"
    )
    _say(note)


def compare_policies(configs: list[SimConfig], trace, pool: Pool = IN_PROCESS) -> list[dict]:
    """Simulate each config (where ``pool`` says, with a progress bar); return their summaries in order."""
    return evaluate(summarize_config, [(config, trace) for config in configs], pool, desc="policies")


def cmd_compare(args: argparse.Namespace) -> None:
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:
        policy_spec(p)  # an unknown name: one line naming the registered ones
    trace = _trace(args)
    _setup(args)  # a setup no policy can simulate (no device) is one error, not one per policy
    configs, skipped = [], []
    for policy in policies:  # a policy that cannot run these settings is left out, saying why
        try:
            configs += _configs(args, [policy], async_only=True)
        except ValueError as err:
            skipped.append(f"{policy}: {err}")
    if not configs:
        raise ValueError("no policy can run these settings (" + "; ".join(skipped) + ")")
    note = _trust(configs[0].setup, *(c.schedule for c in configs))
    summaries = compare_policies(configs, trace, pool_from(args))
    rows = compare_rows(summaries)
    print(format_table(rows))
    for line in skipped:
        print(f"left out {line}")
    if args.out:
        from oppo.records import plots

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        _write_csv(out / "compare.csv", rows)
        plots.utilization_bars({s["policy"]: s["utilization"] for s in summaries}, out / "utilization.png")
        plots.step_breakdown({s["policy"]: s["phase_s_per_step"] for s in summaries}, out / "breakdown.png")
        plots.reward_curves({s["policy"]: s["_steps"] for s in summaries}, out / "rewards.png")
        plots.speed_vs_staleness(rows, out / "staleness.png", f"{summaries[0]['config']['setup']['name']}")
    _say(note)


def _write_csv(path: Path, rows: list[dict]) -> None:
    """A table as CSV, written beside ``path`` and renamed onto it once complete (a kill leaves no half table)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, text.getvalue())


def cmd_sweep(args: argparse.Namespace) -> None:
    from oppo.records import plots

    table = table_for(args, "sweep")
    if bool(args.chunks) == bool(args.deltas):
        raise ValueError("sweep needs exactly one of --chunks or --deltas")
    knob, text = ("chunk", args.chunks) if args.chunks else ("delta", args.deltas)
    values = [int(v) for v in text.split(",") if v]
    (base,) = _configs(args, [args.policy or ("intra" if knob == "chunk" else "inter")])
    note = _trust(base.setup, base.schedule)
    trace = _trace(args)
    with table.journal(args, config_dict(base, trace)) as journal:
        rows = sweep_config(base, knob, values, trace, pool_from(args), journal)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / "sweep.csv", rows)
    label = f"{knob} ({base.schedule.policy})"
    plots.sweep_plot(values, [r["mean_step_s"] for r in rows], label, out / "sweep.png")
    table.resumed(journal)
    print(format_table(rows))
    _say(note)


PLAN_DEFAULTS = {
    "policies": ",".join(POLICIES),
    "knobs": "schedule",
    "objective": "samples",
    "budget": 400,
    "rung_steps": "40,100,200",
    "rung_seeds": "1,2,3",
    "fresh_seeds": 3,
    "no_memory_screen": False,
}


def cmd_plan(args: argparse.Namespace) -> None:
    from oppo.records import plots
    from oppo.sim.study import plan as planner

    table = table_for(args, "plan")
    for k, v in PLAN_DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    policies = tuple(p for p in args.policies.split(",") if p)
    for p in policies:
        policy_spec(p)  # an unknown name: one line naming the registered ones
    if args.fresh_seeds < 0:
        raise ValueError(f"--fresh-seeds must be >= 0, got {args.fresh_seeds}")
    setup, trace = load_setup(args.setup or DEFAULTS["setup"]), _trace(args)
    setup.gpu_datasheet()  # a gpu = "unknown" setup has no device until calibrated on its log
    schedule = given_options(ScheduleConfig, args, skip=("policy",))
    sized = {k: schedule.pop(k) for k in ("batch", "max_new_tokens") if k in schedule}  # the setup's own knobs
    setup = dataclasses.replace(setup, **sized) if sized else setup
    note = _trust(setup, setup.schedule(**schedule))
    rungs = planner.Rungs(_ints(args.rung_steps, "--rung-steps"), _ints(args.rung_seeds, "--rung-seeds"))
    seed = _pick(args.seed, DEFAULTS["seed"])
    source = trace.source() if trace is not None else LengthTrace.NO_SOURCE
    inputs = {"setup": to_dict(setup), "schedule": schedule} | source
    with table.journal(args, inputs) as journal:
        result = planner.plan(
            setup,
            planner.Space(policies, framework=args.knobs == "framework"),
            trace,
            schedule,
            args.objective,
            args.max_lag,
            args.budget,
            seed,
            rungs,
            pool_from(args),
            memory_screen=not args.no_memory_screen,
            journal=journal,
        )
        key = planner.OBJECTIVES[args.objective]
        rows = planner.plan_rows(result)
        fresh = planner.fresh_seeds(seed, rungs, args.fresh_seeds)  # simulated before any file is written (Ctrl-C)
        pool = pool_from(args)
        confirmed = planner.confirm(result, setup, trace, schedule, fresh, pool, journal) if fresh else []
    out = Path(args.out)
    (out / "best").mkdir(parents=True, exist_ok=True)
    _write_csv(out / "plan.csv", rows)
    plots.pareto_plot(rows, out / "pareto.png", key, args.max_lag, f"plan on {setup.name}")
    best = planner.best_config(result, setup, trace, schedule, seed)
    write_json(out / "best" / "config.json", table.provenance_of(best))
    table.resumed(journal)
    _print_plan(result, rows, key, setup, schedule)
    _say(note)
    if args.knobs == "framework":
        _write_overrides(result, setup, setup.schedule(**schedule), out / "best" / "verl_overrides.txt")
    for c in confirmed:
        print(
            f"  vs {c.baseline.label} on {len(fresh)} fresh seeds ({fresh[0]}..{fresh[-1]}): "
            f"{c.median:.3f}x, per seed {min(c.ratios):.3f}x to {max(c.ratios):.3f}x"
        )
    print(
        f"-> {out / 'plan.csv'}, {out / 'pareto.png'}; re-run the best: python -m oppo.sim run --config "
        f"{out / 'best' / 'config.json'} --out DIR"
    )


def _write_overrides(result, setup: Setup, schedule: ScheduleConfig, path: Path) -> None:
    """The best configuration's framework knobs as verl overrides, one ``key=value`` a line."""
    from oppo.sim.study.knobs import verl_overrides

    best, _ = result.best()
    chosen = best.candidate.setup_for(setup)
    lines = verl_overrides(setup, chosen, best.candidate.policy)
    atomic_write_text(path, "".join(f"{line}\n" for line in lines))
    print(f"verl overrides of the best ({len(lines)}; none: the run's own knobs are the best found): {path}")
    for line in lines:
        print(f"  {line}")
    outside = extrapolations(chosen, schedule)
    if outside:
        print("  the best extrapolates: " + "; ".join(outside))
    if best.candidate.policy not in ("sync", "async"):
        config = path.parent / "config.json"
        print(f"  ({best.candidate.policy} has no verl trainer: its schedule runs with oppo.sim run --config {config})")


def _interval_of(setup: Setup, candidate, schedule: dict):
    """The interval of a planned candidate's prediction (None: an uncalibrated setup): on the setup as the candidate
    places and tunes it, with its schedule."""
    from oppo.sim.study import plan as planner

    config = planner.sim_config(setup, candidate, schedule, 1, 0)
    return interval(config.setup, config.schedule)


def _print_plan(result, rows: list[dict], key: str, setup, schedule: dict) -> None:
    from oppo.sim.study import plan as planner

    last = max(r["steps"] for r in rows)
    print(f"{result.budget_used} simulations; {len(result.skipped)} configurations skipped (do not fit GPU memory)")
    print(f"Pareto front ({last} steps, mean over seeds):")
    shown = (*planner.KNOBS, "samples_per_s", "samples_per_s_spread", "tokens_per_s", "steady_lag", "mean_step_s")
    print(format_table([{k: r[k] for k in shown} for r in rows if r["pareto"]]))
    best, met = result.best()
    if not met:
        print(f"no configuration reaches a steady lag <= {result.max_lag:g}; the closest:")
    m, spread = best.mean(key), best.spread(key)
    print(
        f"best{'' if result.max_lag is None else f' under steady lag {result.max_lag:g}'}: {best.candidate.label} "
        f"({key} {m:.4g} ± {spread:.2g} over {len(best.summaries)} seeds, steady lag {best.mean(planner.LAG):.3f})"
    )
    for base in planner.baselines(setup, schedule):
        other = result.baseline(base)
        if other is None:
            print(f"  vs {base.label}: not simulated (skipped by the memory screen)")
            continue
        gain = m / other.mean(key)
        err = gain * (spread / m + other.spread(key) / other.mean(key))
        print(
            f"  vs {base.label} (the setup's defaults), on the seeds it was chosen with (optimistic): {gain:.3f}x "
            f"± {err:.3f} (half-ranges over {len(best.summaries)} seeds, added)"
        )
        bounds = [_interval_of(setup, c, schedule) for c in (best.candidate, base)]
        if None in bounds:
            continue  # uncalibrated: no interval to give
        if any(b.step is None for b in bounds):
            axes = ", ".join(dict.fromkeys(a for b in bounds for a in b.unbounded))
            print(f"    no range from the calibration: the predictions extrapolate on {axes}, which it cannot bound")
            continue
        e = max(b.step for b in bounds)  # each end of the ratio off by up to its interval, in opposite directions
        low, high = gain * (1 - e) / (1 + e), gain * (1 + e) / max(1 - e, 1e-9)
        print(
            f"    with the calibration's ±{e:.0%} on each prediction (the wider of the two's intervals): "
            f"{low:.2f}x-{high:.2f}x at worst (both ends off in opposite directions; errors of one setup "
            "mostly share their sign)"
        )
    if setup.gpu == "cpu-core":
        flags = " ".join(planner.exec_flags(planner.sim_config(setup, best.candidate, schedule, 1, 0).schedule))
        print(f"  on the executor: python -m oppo.exec.train --preset {setup.name} {flags}")


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v)
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None


def cmd_fit_gpus(args: argparse.Namespace) -> None:
    from oppo.catalog.gpus import GPUS
    from oppo.sim.cost.gpu import gpu_efficiencies

    print("gpu        bw_frac  flops_frac  train_frac  layer_overhead_us  rows  heldout_median_err  heldout_p90_err")
    for name, fit in gpu_efficiencies().items():
        e, gpu, source = fit.efficiency, GPUS[name], GPUS[fit.gpu]
        # a GPU without a profile: its source's fractions, the FLOP/s ones x the ratio of their matmul ceilings
        scaled = name != fit.gpu and gpu.matmul_flops and source.matmul_flops
        ratio = f" x {gpu.matmul_frac / source.matmul_frac:.3f} matmul ceiling" if scaled else ""
        print(
            f"{name:<10} {e.bandwidth_frac:7.3f}  {e.flops_frac:10.3f}  {e.train_flops_frac:10.3f}  "
            f"{e.layer_overhead_s * 1e6:17.1f}  {fit.rows:4d}  {fit.heldout_median_abs_err:18.1%}  "
            f"{fit.heldout_p90_abs_err:15.1%}  (from {fit.gpu}{ratio})"
        )


def cmd_calibrate(args: argparse.Namespace) -> None:
    from oppo.records.io import read_rows
    from oppo.records.schema import TraceRow
    from oppo.sim.cost.profile import fit_trace, save_profile

    if not Path(args.trace).is_file():
        raise FileNotFoundError(f"trace not found: {args.trace}")
    fits = fit_trace(read_rows(args.trace, TraceRow))
    if not fits:
        raise ValueError(f"{args.trace}: no operations to fit")
    save_profile(fits, args.out, source=str(args.trace))
    print("role       phase          rows   c0            c1            c2            median_err")
    for role, phases in fits.items():
        for phase, f in phases.items():
            c = "  ".join(f"{x:12.4g}" for x in f.coefficients)
            print(f"{role:<10} {phase:<13} {f.rows:5d}  {c}  {f.median_abs_err:9.1%}")
    print(f"-> {args.out}")


COMMANDS = {
    "run": cmd_run,
    "compare": cmd_compare,
    "sweep": cmd_sweep,
    "plan": cmd_plan,
    "fit-gpus": cmd_fit_gpus,
    "calibrate": cmd_calibrate,
} | LOG_COMMANDS


# Commands whose --out is a folder of their own: one process writes it at a time.
FOLDER_COMMANDS = ("run", "compare", "sweep", "plan", "calibrate-log", "validate-log")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    folder = getattr(args, "out", None) or getattr(args, "resume", None)
    if args.command in FOLDER_COMMANDS and folder:
        with one_writer(folder):
            COMMANDS[args.command](args)
    else:
        COMMANDS[args.command](args)
    return 0


def entry() -> None:
    sys.exit(run_cli(main))
