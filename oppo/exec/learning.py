"""Learning studies: the variants a study compares (sync, oppo, async K with or without decoupled PPO), the executor
options of each, a GRPO study on a task with answers (:class:`TaskStudy`), and each run's records read back as one
row per step (``benchmarks/staleness.py``, ``benchmarks/real_task_learning.py`` and the notebooks run them;
:func:`oppo.records.plots.learning_plot` draws them)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from oppo.exec.config import (
    ExecConfig,
    ModelConfig,
    PPOConfig,
    RolloutConfig,
    TaskConfig,
    default_schedule,
    load_config,
)

VARIANTS = ("sync", "oppo", "async1", "async2", "async4", "async1-decoupled", "async2-decoupled", "async4-decoupled")
COLUMNS = ("step", "end_s", "samples", "reward", "rule_score", "held_out_reward", "held_out_rule_score")


def variant_options(name: str) -> dict[str, str]:
    """``sync``, ``oppo``, ``asyncK`` or ``asyncK-decoupled``, each optionally ``@hf`` or ``@vllm`` (the rollout
    engine; default hf), as executor options (option name -> value)."""
    name, _, engine = name.partition("@")
    if engine not in ("", "hf", "vllm"):
        raise ValueError(f"unknown rollout engine {engine!r} in variant {name}@{engine}: hf or vllm")
    base, _, correction = name.partition("-")
    if base.startswith("async") and base.removeprefix("async").isdigit():
        options = {"policy": "async", "staleness": base.removeprefix("async")}
    elif base in ("sync", "oppo"):
        options = {"policy": base}
    else:
        raise ValueError(f"unknown variant {name!r}: sync, oppo, asyncK or asyncK-decoupled")
    if correction not in ("", "decoupled"):
        raise ValueError(f"unknown variant {name!r}: the only correction is -decoupled")
    return options | ({"offpolicy": "decoupled"} if correction else {}) | ({"rollout-engine": engine} if engine else {})


def variant_flags(name: str) -> list[str]:
    return [text for key, value in variant_options(name).items() for text in (f"--{key}", value)]


def read_run(run: Path) -> list[dict]:
    """One row per step: when it ended (run seconds), samples trained so far, the trained samples' mean reward and
    rule score, and the held-out scores of the weights after it (None: not evaluated after that step). The first
    row's ``start`` holds the held-out scores before any update (``summary.json`` ``held_out_start``; None where
    the run has none), the others' None."""
    with open(run / "steps.csv", newline="") as fh:
        steps = list(csv.DictReader(fh))
    with open(run / "metrics.csv", newline="") as fh:
        metrics = list(csv.DictReader(fh))
    rows, trained = [], 0
    for step, metric in zip(steps, metrics):
        trained += int(step["finished"])
        held = {k: float(metric[k]) for k in ("held_out_reward", "held_out_rule_score")}
        rows.append(
            {
                "step": int(step["step"]),
                "end_s": float(step["end_s"]),
                "samples": trained,
                "reward": float(step["mean_reward"]),
                "rule_score": float(metric["rule_score"]),
            }
            | {k: None if math.isnan(v) else v for k, v in held.items()}
            | {"start": None}
        )
    summary_file = run / "summary.json"
    start = json.loads(summary_file.read_text()).get("held_out_start") if summary_file.is_file() else None
    if rows and start:
        rows[0]["start"] = {"held_out_reward": start["reward"], "held_out_rule_score": start["rule_score"]}
    return rows


def write_learning_csv(path: Path, runs: dict[str, list[list[dict]]]) -> None:
    """``learning.csv``: every step of every run (variant, seed, then :data:`COLUMNS`; blank: not evaluated)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["variant", "seed", *COLUMNS])
        for variant, seeds in runs.items():
            for seed, rows in enumerate(seeds):
                for r in rows:
                    writer.writerow([variant, seed, *("" if r[c] is None else r[c] for c in COLUMNS)])


def summary(runs: dict[str, list[list[dict]]], last: int = 10) -> list[dict]:
    """Per variant, lists over seeds: the mean reward of the last ``last`` steps' trained samples, the last
    held-out reward and rule score (empty where a run never evaluated), and the run's seconds."""
    table = []
    for variant, seeds in runs.items():
        evaluated = [[r for r in rows if r["held_out_reward"] is not None] for rows in seeds]
        table.append(
            {
                "variant": variant,
                "reward": [statistics.fmean(r["reward"] for r in rows[-last:]) for rows in seeds],
                "held_out_reward": [rows[-1]["held_out_reward"] for rows in evaluated if rows],
                "held_out_rule_score": [rows[-1]["held_out_rule_score"] for rows in evaluated if rows],
                "seconds": [rows[-1]["end_s"] for rows in seeds],
            }
        )
    return table


def add_study_args(parser) -> None:
    """``--data``, ``--val-data`` and one option per :class:`TaskStudy` knob, its default shown."""
    parser.add_argument("--data", required=True)
    parser.add_argument("--val-data", required=True)
    for field in dataclasses.fields(TaskStudy):
        if field.name not in ("data", "val_data"):
            flag = "--" + field.name.replace("_", "-")
            parser.add_argument(
                flag, type=type(field.default), default=field.default, help=f"(default: {field.default})"
            )


def study_from(args) -> TaskStudy:
    """The study the command line asks for; a data file that is not there ends the command (exit 2, one line)."""
    for flag in ("data", "val_data"):
        if not Path(getattr(args, flag)).is_file():
            hint = "python -m oppo.exec.tasks.arithmetic --out DIR makes the addition task's"
            print(f"error: --{flag.replace('_', '-')} {getattr(args, flag)}: no such file ({hint})", file=sys.stderr)
            raise SystemExit(2)
    return TaskStudy(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TaskStudy)})


@dataclass(frozen=True)
class TaskStudy:
    """GRPO on a task with answers, one run per variant and seed: held-out accuracy (greedy) before training and
    every ``eval_every`` steps, a checkpoint as often (a run of hours resumes). The defaults suit SmolLM2-135M on
    the arithmetic task on a CPU core (``docs/executor.md``, "Real tasks")."""

    data: str
    val_data: str
    reward_fn: str = "gsm8k"
    preset: str = "smollm2"
    steps: int = 30
    batch: int = 2  # prompts per step
    group_size: int = 8
    max_new_tokens: int = 48
    max_prompt_tokens: int = 96
    lr: float = 1e-5
    temperature: float = 0.7
    kl_coef: float = 0.05  # k3 in the loss
    eval_every: int = 10
    eval_prompts: int = 100
    threads: int = 1
    rollout_log_probs: str = "recompute"  # engine: the sampled tokens' log-probs as the old ones (no pass)
    rollout_is: str = "none"  # token, sequence: truncated importance sampling over the engine-trainer gap

    def config(self, variant: str, seed: int) -> ExecConfig:
        options = variant_options(variant)
        schedule = default_schedule(
            policy=options["policy"],
            algo="grpo",
            batch=self.batch,
            group_size=self.group_size,
            max_new_tokens=self.max_new_tokens,
            staleness=int(options.get("staleness", 1)),
        )
        task = TaskConfig(
            data=self.data,
            val_data=self.val_data,
            reward_fn=self.reward_fn,
            max_prompt_tokens=self.max_prompt_tokens,
            eval_every=self.eval_every,
            eval_prompts=self.eval_prompts,
            eval_decoding="greedy",
        )
        offpolicy = options.get("offpolicy", "none")
        ppo = PPOConfig(
            epochs=1, minibatches=1, lr=self.lr, temperature=self.temperature, kl_coef=self.kl_coef, offpolicy=offpolicy
        )
        return ExecConfig(
            schedule=schedule,
            model=ModelConfig(preset=self.preset, threads=self.threads),
            ppo=ppo,
            task=task,
            rollout=RolloutConfig(
                rollout_engine=options.get("rollout-engine", "hf"),
                rollout_log_probs=self.rollout_log_probs,
                rollout_is=self.rollout_is,
            ),
            steps=self.steps,
            seed=seed,
            save_every=self.eval_every,
        )

    def run(self, variant: str, seed: int, out: Path, train) -> list[dict]:
        """Run ``variant`` at ``seed`` into ``out`` with ``train`` (:func:`oppo.exec.train.train`, given: this module
        stays below the command line): go on from its checkpoint, or keep a finished run as it is, where ``out``
        holds this very run (another config there is an error: a study with other knobs needs another folder); its
        rows (:func:`read_run`). A run stopped (Ctrl-C, a failure) ends the study with the run's exit code."""
        config = self.config(variant, seed)
        stored = out / "config.json"
        if stored.is_file() and dataclasses.replace(load_config(stored), steps=config.steps) != config:
            raise ValueError(f"{out} holds a run of another config: give the study another output folder")
        summary = out / "summary.json"
        if not (summary.is_file() and json.loads(summary.read_text())["steps"] >= config.steps):
            code = train(config, out, resume=(out / "checkpoint" / "manifest.json").is_file())
            if code:
                raise SystemExit(code)
        return read_run(out)


def accuracy_table(runs: dict[str, list[list[dict]]]) -> list[dict]:
    """Per variant, over seeds: held-out accuracy before training and after the last evaluation, and run seconds."""
    table = []
    for variant, seeds in runs.items():
        evaluated = [[r for r in rows if r["held_out_rule_score"] is not None] for rows in seeds]
        table.append(
            {
                "variant": variant,
                "start": [rows[0]["start"]["held_out_rule_score"] for rows in seeds],
                "final": [rows[-1]["held_out_rule_score"] for rows in evaluated],
                "seconds": [rows[-1]["end_s"] for rows in seeds],
            }
        )
    return table
