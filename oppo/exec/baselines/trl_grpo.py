"""TRL 1.12's ``GRPOTrainer`` on a task with answers (``--data``, ``--reward-fn``), set as an oppo GRPO run is.

The comparison a user moving a GRPO recipe from TRL to oppo asks for: the same checkpoint, dataset, chat template,
reward function (wrapped for TRL's ``reward_funcs``), group size, lengths, sampling and CPU threads, and TRL's
options set to oppo's where their defaults differ (:func:`grpo_args`). Held-out accuracy is measured on the trained
weights by oppo's own evaluator (:class:`~oppo.exec.step.evaluation.HeldOut`, the same prompts, decoding and judge as an
oppo run's ``--eval-every``), its time kept out of the run's clock.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import time
from dataclasses import dataclass

import torch
from transformers import TrainerCallback

from oppo.exec.algos import advantages
from oppo.exec.algos.advantages import ADVANTAGE_ESTIMATORS
from oppo.exec.algos.aggregation import LOSS_AGGS
from oppo.exec.baselines import trl_without_vllm
from oppo.exec.baselines.trl_ppo import AS_OPPO_TRAINS, trl_dtype
from oppo.exec.config import ExecConfig
from oppo.exec.step.evaluation import HeldOut
from oppo.exec.tasks.verifiable import DatasetPrompts, Judge

# oppo's loss aggregations as TRL 1.12's loss_type: each LOSS_AGGS entry's TRL name. Token-mean over each minibatch
# is "bnpo" (TRL's "dapo" divides by the whole generation's tokens over steps_per_generation: the same where one
# minibatch is the whole step); the aggregations without a TRL name have no counterpart there. GRPOTrainer's KL is
# k3 in the loss (beta), its advantages group-relative, scaled or not (scale_rewards: an estimator's TRL name).


@dataclass(frozen=True)
class TRLPoint:
    step: int  # updates done
    wall_s: float  # the run's clock (held-out evaluation excluded)
    mean_reward: float  # TRL's logged reward of the step's samples (NaN before any step)
    held_out_accuracy: float  # NaN where not evaluated


def grpo_args(config: ExecConfig, out: str):
    """TRL's ``GRPOConfig`` for ``config``: one generation of ``batch`` prompts x ``group_size`` samples per step,
    ``epochs`` passes (``num_iterations``) in ``minibatches`` optimizer steps each (``steps_per_generation``)."""
    trl_without_vllm()
    from trl import GRPOConfig

    cfg, sched = config.ppo, config.schedule
    loss_type = LOSS_AGGS[cfg.loss_agg].trl
    scale_rewards = ADVANTAGE_ESTIMATORS[advantages.select("grpo", False, cfg.norm_adv_by_std)].trl
    unsupported = [
        name
        for name, bad in (
            ("loss_agg " + cfg.loss_agg, loss_type is None),
            ("kl_in reward", cfg.kl_in == "reward"),
            ("kl_estimator " + cfg.kl_estimator, cfg.kl_estimator not in ("auto", "k3")),
            ("dual_clip", cfg.dual_clip > 0),
            ("entropy_coef", cfg.entropy_coef > 0),
            ("offpolicy decoupled", cfg.offpolicy != "none"),
            ("kl_clamp", cfg.kl_clamp > 0),
            ("prompt_truncation left", config.task.prompt_truncation == "left"),  # TRL 1.12 keeps whole prompts
        )
        if bad
    ]
    if unsupported:
        raise ValueError(f"TRL's GRPOTrainer has no counterpart for {', '.join(unsupported)}")
    rows = sched.batch * sched.group_size
    if rows % cfg.minibatches:
        raise ValueError(f"TRL needs batch x group size ({rows}) divisible by minibatches ({cfg.minibatches})")
    return GRPOConfig(
        output_dir=out,
        report_to=[],
        seed=config.seed,
        num_generations=sched.group_size,
        per_device_train_batch_size=rows // cfg.minibatches,
        steps_per_generation=cfg.minibatches,
        num_iterations=cfg.epochs,
        gradient_accumulation_steps=1,
        max_steps=config.steps * updates_per_step(config),  # TRL counts optimizer steps
        max_completion_length=sched.max_new_tokens,
        learning_rate=config.learning_rates[0],
        lr_scheduler_type="constant",  # oppo's Adam runs at a constant rate (TRL's default decays linearly)
        weight_decay=0.0,
        max_grad_norm=cfg.max_grad_norm,
        beta=cfg.kl_coef,  # k3 in the loss, as oppo's GRPO default
        loss_type=loss_type,  # TRL's default "dapo" is token-mean
        scale_rewards=scale_rewards,  # "group" (GRPO) or "none" (Dr. GRPO)
        epsilon=cfg.clip if cfg.clip_low is None else cfg.clip_low,
        epsilon_high=cfg.clip if cfg.clip_high is None else cfg.clip_high,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        mask_truncated_completions=cfg.mask_truncated,
        logging_steps=1,
        save_strategy="no",
        use_cpu=not torch.cuda.is_available(),
        **AS_OPPO_TRAINS,
        dataloader_num_workers=0,
        shuffle_dataset=True,
    )


def updates_per_step(config: ExecConfig) -> int:
    """Optimizer steps per generation: epochs x minibatches (TRL's num_iterations x steps_per_generation)."""
    return config.ppo.epochs * config.ppo.minibatches


def reward_funcs(judge: Judge, items: list, item_prompts: list):
    """The judge as a TRL reward function: TRL passes each completion with its prompt and the dataset's other
    columns (here the item's index) and wants a float per completion. ``item_prompts``: each item's prompt as TRL was
    given it, checked against the one TRL passes (a completion judged against another item's answer would train
    on noise)."""

    def verifiable_reward(prompts, completions, completion_ids, item, **kwargs) -> list[float]:
        for i, prompt in zip(item, prompts):
            if prompt != item_prompts[i]:
                raise RuntimeError(f"TRL passed item {i} with another item's prompt: {prompt!r}")
        return [judge(items[i], list(ids), f"TRL sample of item {i}").reward for i, ids in zip(item, completion_ids)]

    return [verifiable_reward]


def run_trl_grpo(config: ExecConfig, eval_every: int = 0, progress=None) -> list[TRLPoint]:
    """``config.steps`` TRL GRPO steps on ``config.task.data`` with ``config.task.reward_fn``; held-out accuracy
    (``--val-data``, greedy) before training and every ``eval_every`` steps (0: never)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trl_without_vllm()
    from trl import GRPOTrainer

    from oppo.exec.models.roles import role_paths, token_ids

    task = config.task
    if not (task.data and task.reward_fn):
        raise ValueError("the TRL GRPO baseline needs --data and --reward-fn")
    torch.manual_seed(config.seed)
    if config.model.threads:
        torch.set_num_threads(config.model.threads)
    path = role_paths(config.model)["actor"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    pad_id, eos_id, _ = token_ids(config.model)
    data = DatasetPrompts(task.data, tokenizer, task.chat_template, task.max_prompt_tokens, task.prompt_truncation)
    judge = Judge(task.reward_fn, tokenizer, eos_id)
    templated = task.chat_template == "auto" and getattr(tokenizer, "chat_template", None)
    rows = {
        "prompt": [
            [{"role": r, "content": c} for r, c in item.messages]
            if templated
            else "\n".join(c for _, c in item.messages)
            for item in data.items
        ],
        "item": list(range(len(data.items))),
    }
    model = AutoModelForCausalLM.from_pretrained(path, dtype=trl_dtype(config), attn_implementation="sdpa")
    held = _held_out(config, model, tokenizer, judge, (pad_id, eos_id)) if eval_every else None
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward_funcs(judge, data.items, rows["prompt"]),
            args=grpo_args(config, out),
            train_dataset=Dataset.from_dict(rows),
            processing_class=tokenizer,
        )
        log = _Clock(held, eval_every, updates_per_step(config), progress)
        trainer.add_callback(log)
        log.start()
        trainer.train()
    return log.points


def _held_out(config: ExecConfig, model, tokenizer, judge: Judge, ids: tuple[int, int]) -> HeldOut:
    task = config.task
    val = DatasetPrompts(task.val_data, tokenizer, task.chat_template, task.max_prompt_tokens, task.prompt_truncation)
    indices = list(range(len(val)))[: task.eval_prompts or None]

    def score(answers):
        verdicts = [judge(val.items[indices[k]], a, f"held-out item {indices[k]}") for k, a in enumerate(answers)]
        return torch.tensor([v.reward for v in verdicts]), torch.tensor([v.correct for v in verdicts])

    prompts = [val.prompts[i] for i in indices]
    cap, temperature = config.schedule.max_new_tokens, config.ppo.temperature
    return HeldOut(model, None, prompts, ids, cap, "greedy", temperature, 0, 1, score)


class _Clock(TrainerCallback):
    """The run's clock, each step's logged reward, and held-out accuracy every ``eval_every`` steps (off the clock)."""

    def __init__(self, held: HeldOut | None, eval_every: int, updates: int, progress) -> None:
        """``updates``: TRL's optimizer steps per oppo step (one generation)."""
        self.held, self.eval_every, self.updates, self.progress = held, eval_every, updates, progress
        self.points: list[TRLPoint] = []
        self.paused_s = 0.0
        self.rewards: dict[int, float] = {}  # generations done -> their samples' mean reward

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self._record(0, evaluate=self.held is not None)

    def _record(self, step: int, evaluate: bool) -> None:
        wall = time.perf_counter() - self.t0 - self.paused_s
        accuracy = math.nan
        if evaluate:
            before, training = time.perf_counter(), self.held.actor.training
            self.held.actor.eval()
            accuracy = self.held.score().rule_score
            self.held.actor.train(training)  # TRL reads its logged metrics by the model's mode
            self.paused_s += time.perf_counter() - before
        self.points.append(TRLPoint(step, wall, self.rewards.get(step, math.nan), accuracy))
        if self.progress:
            self.progress(self.points[-1])

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.updates:  # inside a generation's updates
            return
        step = state.global_step // self.updates
        self._record(step, evaluate=self.held is not None and step % self.eval_every == 0)

    def on_log(self, args, state, control, logs=None, **kwargs):
        """A generation's reward (logged with the first optimizer step on its samples) onto its point: the one
        recorded once all its updates are done, now or later."""
        if logs and "reward" in logs:
            self.rewards[(state.global_step - 1) // self.updates + 1] = float(logs["reward"])
            self.points = [
                dataclasses.replace(p, mean_reward=self.rewards[p.step]) if p.step in self.rewards else p
                for p in self.points
            ]
