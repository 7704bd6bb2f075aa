"""``python -m oppo.exec.train``: PPO training with real models, scheduled by the oppo core.

    python -m oppo.exec.train --preset tiny-cpu --mode oppo --steps 200 --batch 8 --seed 0 --out runs/exec-oppo
    python -m oppo.exec.train --preset hf --actor ckpt/actor --reward ckpt/rm --mode oppo --out runs/hf

Writes summary.json, steps.csv, trace.csv, sequences.csv, metrics.csv, config.json and curves.png to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from oppo.cli import run_cli
from oppo.config import ScheduleConfig, add_config_args, config_from_args, given_options, to_dict
from oppo.exec.config import ExecConfig, ModelConfig, PPOConfig, TaskConfig, default_schedule


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m oppo.exec.train", description=__doc__.split("\n")[0])
    parser.add_argument("--mode", default="oppo", help="scheduling policy: sync, intra, inter, oppo, tppo")
    parser.add_argument("--steps", type=int, default=ExecConfig.steps, help="PPO steps (default: 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of prompts, sampling and minibatches")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--placement", default="colocated", help="colocated (one process) or disaggregated (Ray)")
    parser.add_argument("--ray-address", help="disaggregated: join this Ray cluster instead of starting one")
    parser.add_argument("--remote-roles", default="reward", help="disaggregated: scorer roles in Ray actors, one "
                        "device per comma-separated entry; '+' shares a device, e.g. reward+reference,critic")  # fmt: skip
    parser.add_argument("--lengths", help="force response lengths from this trace (EOS at the traced length)")
    parser.add_argument("--lengths-model", help="keep only trace rows whose 'model' column equals this")
    for cls in (ModelConfig, PPOConfig, TaskConfig):
        add_config_args(parser, cls)
    add_config_args(parser, ScheduleConfig, skip=("policy",), shown=to_dict(default_schedule()))
    parser.set_defaults(**{f.name: None for f in dataclasses.fields(ScheduleConfig)})
    return parser


def config_from(args: argparse.Namespace) -> ExecConfig:
    schedule = default_schedule(policy=args.mode, **given_options(ScheduleConfig, args, skip=("policy",)))
    return ExecConfig(
        schedule=schedule,
        model=config_from_args(ModelConfig, args),
        ppo=config_from_args(PPOConfig, args),
        task=config_from_args(TaskConfig, args),
        steps=args.steps,
        seed=args.seed,
        placement=args.placement,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from(args)  # validates before anything is loaded or written
    from oppo.lengths import load_lengths

    lengths = load_lengths(args.lengths, model=args.lengths_model) if args.lengths else None
    remote = tuple(r for r in args.remote_roles.split(",") if r)
    unknown = {role for entry in remote for role in entry.split("+")} - {"reward", "reference", "critic"}
    if unknown:
        raise ValueError(f"unknown remote role(s) {sorted(unknown)}; choose among reward, reference, critic")
    return train(config, Path(args.out), lengths, ray_address=args.ray_address, remote_roles=remote)


def train(config: ExecConfig, out: Path, lengths=None, ray_address=None, remote_roles=("reward",)) -> int:
    """Run ``config.steps`` steps, writing records to ``out`` as it goes (kept on Ctrl-C)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    from oppo.exec.models import load_roles
    from oppo.exec.runner import Executor
    from oppo.exec.timing import Recorder

    hf_logging.disable_progress_bar()
    torch.manual_seed(config.seed)
    start = time.perf_counter()
    roles = load_roles(config.model)
    recorder = Recorder()
    if config.placement == "disaggregated":
        from oppo.exec.placement import DisaggregatedExecutor, WorkerDied

        executor = DisaggregatedExecutor(config, roles, recorder, lengths, ray_address, remote_roles)
    else:
        executor, WorkerDied = Executor(config, roles, recorder, lengths), ()
    log = RunLog(out, config, lengths)
    code = 0
    try:
        with tqdm(total=config.steps, desc=config.schedule.policy, unit="step", disable=None) as bar:
            for _ in range(config.steps):
                outcome, metrics = executor.step()
                log.add(outcome, metrics)
                bar.update()
                bar.set_postfix(reward=f"{metrics.mean_reward:.3f}", step_s=f"{outcome.record.step_s:.2f}")
                if len(log.steps) % 10 == 0:
                    log.write(recorder.rows, time.perf_counter() - start)
    except KeyboardInterrupt:
        print(f"interrupted after {len(log.steps)} steps: records so far kept in {out}", file=sys.stderr)
        code = 130
    except WorkerDied as err:
        print(f"error: {err}; records of {len(log.steps)} steps kept in {out}", file=sys.stderr)
        code = 1
    finally:
        if hasattr(executor, "close"):
            executor.close()
    summary = log.write(recorder.rows, time.perf_counter() - start, final=True)
    print(
        f"{config.schedule.policy}: {summary['steps']} steps, mean step {summary['mean_step_s']:.3f} s, "
        f"reward first-10 {log.mean_reward(first=True):.3f} -> last-10 {log.mean_reward(first=False):.3f}, "
        f"mean deferrals {summary['mean_deferrals']:.2f} -> {out}"
    )
    return code


class RunLog:
    """Accumulates the run's records and writes the contract files (atomically, so a crash keeps a whole set)."""

    def __init__(self, out: Path, config: ExecConfig, lengths) -> None:
        from oppo.records import write_json

        self.out, self.config = out, config
        self.steps, self.trained, self.metrics = [], [], []
        out.mkdir(parents=True, exist_ok=True)
        self.config_dict = to_dict(config) | {"lengths": lengths.name if lengths is not None else None}
        write_json(out / "config.json", self.config_dict)

    def add(self, outcome, metrics) -> None:
        self.steps.append(outcome.record)
        self.trained.extend(outcome.trained)
        self.metrics.append(metrics)

    def mean_reward(self, first: bool, n: int = 10) -> float:
        chosen = self.steps[:n] if first else self.steps[-n:]
        return sum(s.mean_reward for s in chosen) / max(len(chosen), 1)

    def write(self, trace, wall_s: float, final: bool = False) -> dict:
        from oppo.exec.runner import StepMetrics
        from oppo.records import phase_breakdown, summarize, write_rows, write_run

        summary = summarize(self.config.schedule.policy, self.steps, trace, self.trained, self.config_dict, wall_s)
        summary["phase_s_per_step"] = phase_breakdown(trace, len(self.steps))
        summary["reward_first10"], summary["reward_last10"] = self.mean_reward(True), self.mean_reward(False)
        write_run(self.out, self.steps, trace, self.trained, summary)
        write_rows(self.out / "metrics.csv", self.metrics, StepMetrics)
        if final and self.steps:
            from oppo import plots

            plots.reward_curves({self.config.schedule.policy: self.steps}, self.out / "curves.png", time_axis=False)
        return summary


def entry() -> None:
    sys.exit(run_cli(main))


if __name__ == "__main__":
    entry()
