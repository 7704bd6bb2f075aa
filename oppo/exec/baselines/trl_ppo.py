"""The paper's baseline: TRL 1.12's ``PPOTrainer`` on the same tiny models, prompts and length distribution.

Needs the ``baseline`` extra (``trl==1.12.0``, the last TRL with ``PPOTrainer``). Hyper-parameters follow
:class:`~oppo.exec.config.PPOConfig` where both have them. Forced lengths use a logits processor on TRL's
``generate`` helper (EOS masked before the traced length, forced at it), as :class:`ChunkedDecoder` does.
Why OPPO is not built as a wrapper around this trainer: ``docs/trl.md``.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch
from transformers import TrainerCallback

from oppo.catalog.lengths import LengthTrace
from oppo.exec.algos.kl import KL_ESTIMATORS
from oppo.exec.baselines import trl_without_vllm
from oppo.exec.config import ExecConfig
from oppo.exec.models.roles import resolve_dtype
from oppo.exec.step.runner import derived_seed, forced_length
from oppo.exec.tasks import synthetic

# TRL's trainer configs default to bfloat16 autocast and activation checkpointing; oppo.exec does neither
AS_OPPO_TRAINS = dict(bf16=False, gradient_checkpointing=False)


def trl_dtype(config: ExecConfig) -> torch.dtype:
    """oppo.exec's dtype on the device TRL trains on (``use_cpu`` without CUDA): float32 on a CPU, bfloat16 on
    CUDA for ``--dtype auto``."""
    return resolve_dtype(config.model.dtype, torch.device("cuda" if torch.cuda.is_available() else "cpu"))


@dataclass(frozen=True)
class TRLStep:
    step: int
    step_s: float  # wall seconds of the update (generation, scoring, PPO epochs)
    mean_reward: float  # TRL's objective/scores
    response_tokens: int  # tokens generated this step (EOS included)


class ForcedLengths:
    """A ``LogitsProcessor``: row r may end (EOS) exactly after ``targets[r]`` response tokens."""

    def __init__(self, targets: torch.Tensor, context_length: int, eos_id: int) -> None:
        self.targets, self.context_length, self.eos_id = targets, context_length, eos_id

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        done = input_ids.shape[1] - self.context_length  # response tokens so far
        targets = self.targets[: scores.shape[0]].to(scores.device)
        scores = scores.clone()
        scores[done + 1 < targets, self.eos_id] = float("-inf")
        at_target = done + 1 >= targets
        scores[at_target] = float("-inf")
        scores[at_target, self.eos_id] = 0.0
        return scores


def _patch_generation(lengths: LengthTrace | None, config: ExecConfig, eos_id: int, counted: list[int]):
    """Route TRL's module-level ``generate`` through :class:`ForcedLengths` (new targets per call) and count the
    response tokens it generates (up to and including EOS) into ``counted``."""
    trl_without_vllm()
    from trl.experimental.ppo import ppo_trainer

    original = ppo_trainer.generate
    calls = iter(range(10**9))

    def generate(lm_backbone, queries, pad_token_id, generation_config):
        if lengths is None:
            out = original(lm_backbone, queries, pad_token_id, generation_config)
            counted.append(_response_tokens(out[0][:, queries.shape[1] :], eos_id))
            return out
        call = next(calls)
        cap = config.schedule.max_new_tokens
        targets = torch.tensor(
            [forced_length(lengths, config.seed + 7, call * 10_000 + r, cap) for r in range(len(queries))]
        )
        context_length = queries.shape[1]
        mask = queries != pad_token_id
        out = lm_backbone.generate(
            input_ids=torch.masked_fill(queries, ~mask, 0),
            attention_mask=mask,
            generation_config=generation_config,
            return_dict_in_generate=True,
            output_scores=True,
            logits_processor=[ForcedLengths(targets, context_length, eos_id)],
        )
        logits = torch.stack(out.scores, 1)
        counted.append(_response_tokens(out.sequences[:, context_length:], eos_id))
        return torch.cat((queries, out.sequences[:, context_length:]), dim=1), logits

    ppo_trainer.generate = generate
    return lambda: setattr(ppo_trainer, "generate", original)


def _response_tokens(responses: torch.Tensor, eos_id: int) -> int:
    """Tokens up to and including the first EOS of each row (the whole row when there is none)."""
    is_eos = responses == eos_id
    first = torch.where(
        is_eos.any(1), is_eos.float().argmax(1) + 1, torch.full_like(is_eos[:, 0], responses.shape[1], dtype=torch.long)
    )
    return int(first.sum())


# oppo.exec's PPO options with no counterpart in TRL 1.12's PPOTrainer: the baseline refuses them rather than run
# without them (TRL clips the ratio symmetrically at ``cliprange``, puts the KL in the reward, averages over tokens)
TRL_LACKS = (
    "clip_low",
    "clip_high",
    "dual_clip",
    "kl_clamp",
    "loss_agg",
    "entropy_coef",
    "offpolicy",
    "max_importance_ratio",
    "tppo_drop_tokens",
)


def trl_kl_estimator(ppo) -> str:
    """TRL's ``kl_estimator`` for these options (the estimator's TRL name in :data:`KL_ESTIMATORS`, KL in the
    reward; auto is k1 there); options TRL cannot run are an error naming them."""
    default = type(ppo)()
    lacking = [name for name in TRL_LACKS if getattr(ppo, name) != getattr(default, name)]
    lacking += ["kl_in loss"] if ppo.kl_in == "loss" else []
    estimator = KL_ESTIMATORS["k1" if ppo.kl_estimator == "auto" else ppo.kl_estimator]
    lacking += [f"kl_estimator {ppo.kl_estimator}"] if estimator.trl is None else []
    if lacking:
        raise ValueError(f"TRL's PPOTrainer has no counterpart for {', '.join(lacking)}: the baseline cannot run them")
    return estimator.trl


def run_trl(config: ExecConfig, lengths: LengthTrace | None = None, progress=None) -> list[TRLStep]:
    """``config.steps`` TRL PPO updates of ``config.schedule.batch`` rollouts on the preset's models (the PPO
    options TRL has, :func:`trl_kl_estimator`)."""
    kl_estimator = trl_kl_estimator(config.ppo)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    trl_without_vllm()
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    from oppo.exec.models.roles import role_paths

    torch.manual_seed(config.seed)
    if config.model.threads:  # the same CPU budget as oppo.exec
        torch.set_num_threads(config.model.threads)
    paths = role_paths(config.model)
    tokenizer = AutoTokenizer.from_pretrained(paths["actor"])
    dtype = trl_dtype(config)
    load = lambda cls, p: cls.from_pretrained(p, dtype=dtype, attn_implementation="sdpa")  # noqa: E731
    policy, ref = load(AutoModelForCausalLM, paths["actor"]), load(AutoModelForCausalLM, paths["reference"])
    value, reward = (
        load(AutoModelForSequenceClassification, paths["critic"]),
        load(AutoModelForSequenceClassification, paths["reward"]),
    )
    b, n_prompts = config.schedule.batch, config.schedule.batch * config.steps
    prompts = [
        synthetic.random_prompts(
            torch.Generator().manual_seed(derived_seed(config.seed, 1, i)),
            1,
            config.task.prompt_tokens,
            policy.config.vocab_size,
        )[0]
        for i in range(n_prompts)
    ]
    ppo = config.ppo
    with tempfile.TemporaryDirectory() as out:
        args = PPOConfig(
            output_dir=out,
            report_to=[],
            seed=config.seed,
            per_device_train_batch_size=b,
            gradient_accumulation_steps=1,
            num_mini_batches=ppo.minibatches,
            num_ppo_epochs=ppo.epochs,
            total_episodes=n_prompts,
            local_rollout_forward_batch_size=b,
            response_length=config.schedule.max_new_tokens,
            stop_token="eos",
            learning_rate=config.learning_rates[0],
            lr_scheduler_type="constant",
            kl_coef=ppo.kl_coef,
            kl_estimator=kl_estimator,
            cliprange=ppo.clip,
            cliprange_value=ppo.value_clip,
            vf_coef=ppo.value_coef,
            gamma=ppo.gamma,
            lam=ppo.lam,
            temperature=ppo.temperature,
            max_grad_norm=ppo.max_grad_norm,
            num_sample_generations=0,
            save_strategy="no",
            logging_steps=1,
            use_cpu=not torch.cuda.is_available(),
            **AS_OPPO_TRAINS,
            dataloader_num_workers=0,
            missing_eos_penalty=None,
            whiten_rewards=False,
            sft_model_path=str(paths["actor"]),
        )
        trainer = PPOTrainer(
            args=args,
            processing_class=tokenizer,
            model=policy,
            ref_model=ref,
            reward_model=reward,
            value_model=value,
            train_dataset=Dataset.from_dict({"input_ids": prompts}),
        )
        counted: list[int] = []
        log = _StepLog(progress, counted)
        trainer.add_callback(log)
        restore = _patch_generation(lengths, config, tokenizer.eos_token_id, counted)
        try:
            trainer.train()
        finally:
            restore()
    return log.steps


class _StepLog(TrainerCallback):
    """Times each PPO update and keeps its mean score and generated tokens."""

    def __init__(self, progress, counted: list[int]) -> None:
        self.steps: list[TRLStep] = []
        self.progress, self.counted, self.t = progress, counted, time.perf_counter()
        self.pending: dict = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.pending = logs or {}

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        score = float(self.pending.get("objective/scores", np.nan))
        tokens = self.counted[-1] if self.counted else 0
        self.steps.append(TRLStep(len(self.steps), now - self.t, score, tokens))
        self.t = now
        if self.progress:
            self.progress(self.steps[-1])
