"""The executor's root config: the shared schedule plus model, PPO and task sections. Frozen; validated."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from oppo.core.config import ScheduleConfig, check_positive, opt, schedule_from
from oppo.exec.algos.aggregation import LOSS_AGGS
from oppo.exec.algos.kl import KL_ESTIMATORS
from oppo.exec.tasks.datasets import CHAT_TEMPLATES, TRUNCATIONS
from oppo.exec.tasks.rewards import REWARD_FN_NAMES, load_reward_fn, reward_file
from oppo.records.stored_config import check_sources, config_from_dict, load_stored_config

TINY_PRESETS = ("tiny-cpu", "small-cpu")  # random-weight checkpoints made here (oppo.exec.models.tiny)
PRESETS = (*TINY_PRESETS, "hf", "smollm2")
REMOTE_ROLES = ("reward", "reference", "critic")
PLACEMENTS = ("colocated", "disaggregated")
REWARDS = ("learned", "rule")
EVAL_DECODINGS = ("sample", "greedy")  # how --eval-every answers held-out prompts
DTYPES = ("auto", "float32", "float64", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelConfig:
    preset: str = opt("tiny-cpu", f"model preset: {', '.join(PRESETS)}")
    actor: str | None = opt(None, "hf preset: actor checkpoint folder (causal LM)")
    reward: str | None = opt(
        None, "hf, smollm2 presets: reward model folder (sequence classification, 1 label); or --reward-fn"
    )
    critic: str | None = opt(None, "hf preset: critic folder (default: the reward model)")
    reference: str | None = opt(None, "hf preset: reference folder (default: the actor)")
    device: str = opt("auto", "torch device: auto (cuda if available), cpu, cuda, cuda:1, ...")
    dtype: str = opt("auto", f"parameter dtype: {', '.join(DTYPES)} (auto: bfloat16 on GPU, float32 on CPU)")
    threads: int = opt(0, "torch CPU threads (0: leave torch's default)")

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose from {', '.join(PRESETS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose from {', '.join(DTYPES)}")
        if self.preset == "hf" and not self.actor:
            raise ValueError("preset hf needs --actor PATH (and --reward PATH or --reward-fn)")
        if self.preset != "hf" and (self.actor or self.critic or self.reference):
            raise ValueError(f"--actor, --critic and --reference name the hf preset's folders, not {self.preset}'s")
        if self.preset in ("hf", "smollm2"):
            for name in ("actor", "reward", "critic", "reference"):
                path = getattr(self, name)
                if path is not None and not Path(path).is_dir():
                    raise ValueError(f"{name} checkpoint folder not found: {path}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"unknown device {self.device!r}; choose auto, cpu, cuda or cuda:N")


OFFPOLICY = ("none", "decoupled")
# The KL estimators and loss aggregations are registries of their functions (oppo.exec.algos.kl, .aggregation), whose
# names and verl's the options' help and checks read: a new variant is one entry there.
KL_PLACES = ("auto", "reward", "loss")


@dataclass(frozen=True)
class PPOConfig:
    lr: float | None = opt(None, "actor learning rate (Adam; default: 3e-4 on the tiny presets, else 1e-6 as verl)")
    critic_lr: float | None = opt(
        None, "critic learning rate (Adam; default: 1e-3 on the tiny presets, else 1e-5 as verl)"
    )
    epochs: int = opt(2, "PPO epochs over each step's batch")
    minibatches: int = opt(2, "minibatches per epoch")
    kl_coef: float = opt(0.05, "token-level KL penalty coefficient (to the reference)")
    gamma: float = opt(1.0, "GAE discount")
    lam: float = opt(0.95, "GAE lambda")
    clip: float = opt(0.2, "policy ratio clip")
    value_clip: float = opt(0.2, "value clip")
    value_coef: float = opt(0.5, "value loss weight")
    max_grad_norm: float = opt(1.0, "gradient clipping norm")
    temperature: float = opt(1.0, "sampling temperature")
    top_k: int = opt(0, "sample among the k most likely tokens only (0: all); log-probs stay the full softmax's")
    top_p: float = opt(
        1.0, "sample among the most likely tokens whose probabilities sum to p (nucleus; 1: all); log-probs as top-k"
    )
    tppo_drop_tokens: int = opt(0, "tppo: drop this many last tokens of unfinished segments from the loss")
    offpolicy: str = opt(
        "none",
        "none: ratio against old log-probs recomputed by the trainer; decoupled: clipped ratio against those "
        "(proximal) log-probs, each token weighted by proximal / behaviour (the sampling weights' log-probs)",
    )
    max_importance_ratio: float = opt(5.0, "decoupled: cap on a token's proximal / behaviour weight")
    clip_low: float | None = opt(None, "ratio clipped below at 1 - this (verl clip_ratio_low; None: --clip)")
    clip_high: float | None = opt(
        None, "ratio clipped above at 1 + this (clip-higher: verl clip_ratio_high, TRL epsilon_high; None: --clip)"
    )
    dual_clip: float = opt(
        0.0, "dual clip C > 1: a negative-advantage token's loss at most -A * C (verl clip_ratio_c, 3 there); 0: off"
    )
    kl_estimator: str = opt(
        "auto",
        f"{KL_ESTIMATORS.listed()} (verl kl_loss_type: {', '.join(v.verl or '-' for v in KL_ESTIMATORS.variants())}); "
        "auto: k1 in a reward, k3 in a loss",
    )
    kl_in: str = opt("auto", "where the KL to the reference goes: reward, loss; auto: reward for PPO, loss for GRPO")
    kl_clamp: float = opt(0.0, "bound each token's KL estimate to [-X, X] (verl clamps k3 at 10); 0: no bound")
    loss_agg: str = opt(
        "token-mean", f"{LOSS_AGGS.listed()} (verl loss_agg_mode; the -norm divisor is --max-new-tokens)"
    )
    entropy_coef: float = opt(0.0, "entropy bonus weight in the actor loss (verl entropy_coeff); the entropy is logged")
    mask_truncated: bool = opt(
        False, "leave samples cut at --max-new-tokens (no EOS) out of the loss (TRL mask_truncated_completions)"
    )
    norm_adv_by_std: bool = opt(
        True, "GRPO: divide by the group's std (verl norm_adv_by_std_in_grpo; Dr. GRPO: --no-norm-adv-by-std)"
    )

    def __post_init__(self) -> None:
        for name in ("epochs", "minibatches", "temperature", "max_grad_norm"):
            check_positive(name, getattr(self, name))
        for name in ("lr", "critic_lr"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if self.clip_low is not None and not 0 < self.clip_low < 1:
            raise ValueError(f"clip_low must be in (0, 1), got {self.clip_low}")
        if self.clip_high is not None and self.clip_high <= 0:  # clip-higher: above 1 is allowed, as in verl
            raise ValueError(f"clip_high must be > 0, got {self.clip_high}")
        if self.dual_clip and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (or 0: off), got {self.dual_clip}")
        if self.kl_estimator not in ("auto", *KL_ESTIMATORS.names):
            raise ValueError(
                f"unknown kl_estimator {self.kl_estimator!r}; choose from auto, {', '.join(KL_ESTIMATORS.names)}"
            )
        if self.kl_in not in KL_PLACES:
            raise ValueError(f"unknown kl_in {self.kl_in!r}; choose from {', '.join(KL_PLACES)}")
        if self.loss_agg not in LOSS_AGGS:
            raise ValueError(f"unknown loss_agg {self.loss_agg!r}; choose from {', '.join(LOSS_AGGS.names)}")
        if self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"top_k must be >= 0 and top_p in (0, 1], got {self.top_k} and {self.top_p}")
        if self.kl_clamp < 0 or self.entropy_coef < 0:
            raise ValueError("kl_clamp and entropy_coef must be >= 0")
        if self.kl_coef == 0 and (self.kl_estimator != "auto" or self.kl_clamp > 0):
            raise ValueError("kl_estimator or kl_clamp is set but kl_coef is 0: there is no KL term they would change")
        if self.offpolicy not in OFFPOLICY:
            raise ValueError(f"unknown offpolicy {self.offpolicy!r}; choose from {', '.join(OFFPOLICY)}")
        if self.max_importance_ratio < 1:
            raise ValueError(f"max_importance_ratio must be >= 1, got {self.max_importance_ratio}")
        if not 0 <= self.lam <= 1 or not 0 <= self.gamma <= 1:
            raise ValueError("gamma and lam must be in [0, 1]")


@dataclass(frozen=True)
class TaskConfig:
    reward_kind: str = opt("learned", "learned (transformer RM trained on synthetic preferences) or rule")
    prompt_tokens: int = opt(8, "length of the synthetic prompts in tokens (no --prompts or --data)")
    max_prompt_tokens: int = opt(
        512, "cap on the tokens of a --prompts, --data or --val-data prompt (verl's data.max_prompt_length)"
    )
    prompts: str | None = opt(
        None, "text file, one prompt per line, tokenized by the actor's tokenizer (default: synthetic prompts)"
    )
    data: str | None = opt(
        None,
        "training prompts with answers: .jsonl, .json or .parquet, in verl's schema (prompt, data_source, "
        "reward_model.ground_truth, extra_info) or question/answer columns; epochs over it, shuffled by --seed",
    )
    val_data: str | None = opt(None, "held-out prompts with answers, scored every --eval-every steps (as --data)")
    chat_template: str = opt("auto", "--data prompts: auto (the actor tokenizer's chat template, if any) or none")
    prompt_truncation: str = opt("error", "--data prompts over --max-prompt-tokens: error, or left (keep the end)")
    reward_fn: str | None = opt(
        None,
        f"verifiable reward: {', '.join(REWARD_FN_NAMES)} or PATH.py:FUNCTION (verl's compute_score(data_source, "
        "solution_str, ground_truth, extra_info)); needs --data; excludes a reward model",
    )
    lengths: str | None = opt(
        None,
        "force response lengths from this trace (EOS at the traced length): a CSV "
        "file or a bundled trace (alpaca_eval, gsm8k, hh_rlhf_harmless)",
    )
    lengths_model: str | None = opt(None, "keep only trace rows whose 'model' column equals this")
    eval_every: int = opt(
        0,
        "every this many steps, score the trained actor's answers to fixed held-out prompts "
        "(metrics.csv held_out_*; 0: never)",
    )
    eval_decoding: str = opt("sample", "--eval-every answers: sample (the same noise every time) or greedy")
    eval_prompts: int = opt(
        16,
        "held-out prompts of --eval-every (--prompts or --data without --val-data: the file's last ones, not trained; "
        "--val-data: its first ones, 0 for all)",
    )
    eval_samples: int = opt(1, "sampled answers per held-out prompt (--eval-decoding sample): mean@n")

    def __post_init__(self) -> None:
        if self.reward_kind not in REWARDS:
            raise ValueError(f"unknown reward_kind {self.reward_kind!r}; choose from {', '.join(REWARDS)}")
        check_positive("prompt_tokens", self.prompt_tokens)
        check_positive("max_prompt_tokens", self.max_prompt_tokens)
        if self.prompts is not None and not Path(self.prompts).is_file():
            raise ValueError(f"prompts file not found: {self.prompts}")
        if self.lengths_model is not None and self.lengths is None:
            raise ValueError("--lengths-model needs --lengths")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0, got {self.eval_every}")
        if self.eval_prompts < 0 or (self.eval_prompts == 0 and self.val_data is None):
            raise ValueError(f"eval_prompts must be > 0 (0: all of --val-data), got {self.eval_prompts}")
        check_positive("eval_samples", self.eval_samples)
        if self.eval_samples > 1 and self.eval_decoding == "greedy":
            raise ValueError("--eval-samples > 1 draws samples: greedy answers are all alike")
        for name in ("data", "val_data"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name.replace('_', '-')} file not found: {path}")
        if self.data and self.prompts:
            raise ValueError("give one of --data and --prompts")
        if self.val_data and not self.data:
            raise ValueError("--val-data holds out prompts of a --data task: give --data too")
        if self.val_data and not self.eval_every:
            raise ValueError("--val-data is scored every --eval-every steps: give --eval-every N")
        if self.reward_fn:
            load_reward_fn(self.reward_fn)  # an unknown name, a missing file or function: refused here
        if self.reward_fn and not self.data:
            raise ValueError("--reward-fn scores answers against ground truths: give --data")
        if self.chat_template not in CHAT_TEMPLATES:
            raise ValueError(f"unknown chat_template {self.chat_template!r}; choose from {', '.join(CHAT_TEMPLATES)}")
        if self.prompt_truncation not in TRUNCATIONS:
            raise ValueError(
                f"unknown prompt_truncation {self.prompt_truncation!r}; choose from {', '.join(TRUNCATIONS)}"
            )
        if self.eval_decoding not in EVAL_DECODINGS:
            raise ValueError(f"unknown eval_decoding {self.eval_decoding!r}; choose from {', '.join(EVAL_DECODINGS)}")


ROLLOUT_ENGINES = ("hf", "vllm")
ROLLOUT_LOG_PROBS = ("recompute", "engine")
ROLLOUT_IS = ("none", "token", "sequence")


@dataclass(frozen=True)
class RolloutConfig:
    """What generates the actor's tokens, and how the trainer uses the log-probs it returns."""

    rollout_engine: str = opt(
        "hf",
        "what generates: hf (a decode loop over Hugging Face forward passes, batch-independent sampling) or vllm "
        "(vLLM's engine in a process of its own; training, held-out evaluation)",
    )
    engine_memory: float = opt(
        1.0, "vllm: the KV cache budget in GiB (vLLM's kv_cache_memory_bytes; VLLM_CPU_KVCACHE_SPACE on a CPU)"
    )
    engine_eager: bool = opt(
        False, "vllm: run the model without torch.compile (loads in about a quarter of the time, generates slower)"
    )
    rollout_log_probs: str = opt(
        "recompute",
        "old log-probs of the PPO ratio: recompute (a forward pass of the trainer) or engine (the sampled tokens' "
        "log-probs as the engine returned them: no pass; verl's use_rollout_log_probs)",
    )
    rollout_is: str = opt(
        "none",
        "truncated importance sampling over the engine-trainer mismatch: none, token (each token weighted by "
        "min(p_trainer / p_engine, cap)) or sequence (one weight per sample, the product over its tokens)",
    )
    rollout_is_cap: float = opt(2.0, "--rollout-is: the cap on a weight (verl rollout_is_threshold)")

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("rollout_engine", self.rollout_engine, ROLLOUT_ENGINES),
            ("rollout_log_probs", self.rollout_log_probs, ROLLOUT_LOG_PROBS),
            ("rollout_is", self.rollout_is, ROLLOUT_IS),
        ):
            if value not in allowed:
                raise ValueError(f"unknown {name} {value!r}; choose from {', '.join(allowed)}")
        check_positive("engine_memory", self.engine_memory)
        if self.rollout_is_cap < 1:
            raise ValueError(f"rollout_is_cap must be >= 1, got {self.rollout_is_cap}")
        if self.rollout_is != "none" and self.rollout_log_probs == "engine":
            raise ValueError(
                "--rollout-is weighs the trainer's log-probs against the engine's: --rollout-log-probs recompute"
            )


# The executor's presets run small models (on a CPU by default): responses of tens of tokens, not the hundreds the
# core's defaults are sized for (a 7B model on GPUs, the paper's). They override those fields by name; every other
# field, and the batch, keeps the core's default (ScheduleConfig, the one home of each).
PRESET_SCHEDULE = {
    "max_new_tokens": 48,
    "chunk_candidates": (4, 8, 16),
    "explore_period_steps": 30,
    "check_tokens": 4,
    "delta_init": 2,
    "delta_max": 4,
    "delta_window": 3,
    "window_tokens": 16,
}


def default_schedule(**overrides) -> ScheduleConfig:
    """The executor's default schedule: the core's defaults under :data:`PRESET_SCHEDULE`, then ``overrides``."""
    return schedule_from(PRESET_SCHEDULE, **overrides)


@dataclass(frozen=True)
class ExecConfig:
    """Everything a run needs; stored as ``config.json`` beside its records."""

    schedule: ScheduleConfig = field(default_factory=default_schedule)
    model: ModelConfig = field(default_factory=ModelConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    steps: int = opt(200, "PPO steps")
    seed: int = opt(0, "seed of prompts, sampling and minibatches")
    placement: str = opt("colocated", "colocated (one process) or disaggregated (scorer roles in Ray workers)")
    remote_roles: tuple[str, ...] = opt(
        ("reward",),
        "disaggregated: scorer roles in Ray workers, one device per "
        "comma-separated entry; '+' shares a device, e.g. reward+reference,critic",
    )
    ray_address: str | None = opt(None, "join this Ray cluster instead of starting one (--dp > 1 or disaggregated)")
    dp: int = opt(
        1,
        "data-parallel actor ranks: Ray workers joined in one torch.distributed group (gloo on CPU, "
        "NCCL on GPU), one core or one GPU each; 1: the actor in this process",
    )
    shard: bool = opt(
        False,
        "--dp > 1: shard the actor's and critic's parameters, gradients and Adam states over "
        "the ranks (FSDP2); generation and scoring gather the weights once per step",
    )
    rollout_workers: int = opt(
        0,
        "async: rollout workers (Ray actors, one core or GPU each, each with its own copy of the actor) "
        "generating ahead of the trainer; 0: generation in this process, K versions behind, nothing overlapping",
    )
    queue_groups: int = opt(
        0,
        "async with rollout workers: generated groups not yet trained (queued, or in the step being trained), at "
        "least --batch; --batch: a step generates only once the one before is trained (0: as many as the "
        "staleness bound lets through)",
    )
    inflight_updates: bool = opt(
        False,
        "async with rollout workers: a generation switches to newer weights between decode chunks as the trainer "
        "publishes them (PipelineRL); the prefix is re-prefilled under the new weights",
    )
    save_every: int = opt(0, "write RUN_DIR/checkpoint every this many steps, for --resume RUN_DIR (0: never)")
    check_ranks: bool = opt(
        False,
        "debug: after every step compare a digest of the ranks' weights (whole weights; under --shard the "
        "replicated state and each rank's shards against what its last optimizer step wrote)",
    )

    def __post_init__(self) -> None:
        check_positive("steps", self.steps)
        check_positive("dp", self.dp)
        if self.save_every < 0:
            raise ValueError(f"save_every must be >= 0, got {self.save_every}")
        if self.save_every and (self.dp > 1 or self.placement != "colocated"):
            raise ValueError("--save-every supports one-process runs only (--dp 1, colocated placement)")
        if self.task.eval_every and (self.dp > 1 or self.placement != "colocated"):
            raise ValueError("--eval-every scores the actor in this process: --dp 1 and colocated placement only")
        if self.shard and self.dp < 2:
            raise ValueError("--shard needs --dp 2 or more")
        if not self.ppo.norm_adv_by_std and self.schedule.algo != "grpo":
            raise ValueError("--no-norm-adv-by-std changes GRPO's group advantages: give --algo grpo")
        # Every executor policy trains B x G rows a step (T-PPO: a segment of each of the B in flight; over-commit:
        # the first B complete groups), cut into minibatches whose sizes differ by one row at most: the smallest
        # holds floor(rows / minibatches).
        rows = self.schedule.batch * self.schedule.group_size
        if self.ppo.minibatches > rows:
            raise ValueError(f"minibatches {self.ppo.minibatches} > batch x group size {rows}: a minibatch needs a row")
        smallest = rows // self.ppo.minibatches
        if self.shard and smallest < self.dp:  # every rank takes part in every sharded step (collectives)
            raise ValueError(
                f"--shard needs at least --dp rows in every minibatch: the smallest has floor(batch x group size / "
                f"minibatches) = {smallest} < {self.dp}"
            )
        if self.rollout_workers < 0 or self.queue_groups < 0:
            raise ValueError("rollout_workers and queue_groups must be >= 0")
        if self.rollout_workers and not self.schedule.asynchronous:
            raise ValueError(f"--rollout-workers runs the async policy (--policy async), not {self.schedule.policy}")
        if self.queue_groups and not self.rollout_workers:
            raise ValueError("--queue-groups bounds the queue of rollout workers: give --rollout-workers too")
        if self.queue_groups and self.queue_groups < self.schedule.batch:
            raise ValueError(f"--queue-groups {self.queue_groups} cannot hold one step's {self.schedule.batch} groups")
        if self.inflight_updates and not self.rollout_workers:
            raise ValueError("--inflight-updates switches the weights of rollout workers: give --rollout-workers too")
        if self.inflight_updates and self.schedule.staleness == 0:
            raise ValueError("--inflight-updates with --staleness 0: no newer weights can come during a generation")
        if self.rollout_workers and self.save_every:
            raise ValueError("--save-every supports one-process runs only (no --rollout-workers)")
        if self.schedule.asynchronous and (self.dp > 1 or self.placement != "colocated"):
            raise ValueError(
                "async trains in one process (its rollout in --rollout-workers): --dp 1 and colocated placement only"
            )
        self._check_reward()
        self._check_rollout()
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {self.placement!r}; choose from {', '.join(PLACEMENTS)}")
        unknown = {role for entry in self.remote_roles for role in entry.split("+")} - set(REMOTE_ROLES)
        if unknown or not self.remote_roles:
            raise ValueError(f"remote roles {sorted(unknown) or 'empty'}: choose among {', '.join(REMOTE_ROLES)}")

    def _check_reward(self) -> None:
        model, task = self.model, self.task
        if model.preset in ("hf", "smollm2") and bool(model.reward) == bool(task.reward_fn):
            raise ValueError(f"preset {model.preset} needs exactly one of --reward PATH and --reward-fn NAME")
        if task.data and not (task.reward_fn or self.reward_model):
            raise ValueError("--data needs a reward: --reward-fn NAME|PATH.py:FUNCTION, or a reward model")
        if task.reward_fn and (self.rollout_workers or self.dp > 1 or self.placement != "colocated"):
            raise ValueError("--reward-fn scores in this process: --dp 1, colocated placement, no --rollout-workers")
        if task.data and self.rollout_workers:
            raise ValueError("--data prompts reach rollout workers as token ids only: not yet supported with them")

    def _check_rollout(self) -> None:
        rollout = self.rollout
        if rollout.rollout_log_probs == "engine" and self.ppo.offpolicy == "decoupled":
            raise ValueError("--offpolicy decoupled recomputes the proximal log-probs: --rollout-log-probs recompute")
        if rollout.rollout_is != "none" and self.ppo.offpolicy == "decoupled":
            raise ValueError("--rollout-is and --offpolicy decoupled are the same correction: give one")
        if rollout.rollout_engine != "vllm":
            return
        engine_probs = rollout.rollout_log_probs == "engine" or rollout.rollout_is != "none"
        if self.task.lengths and (engine_probs or self.ppo.offpolicy == "decoupled"):
            raise ValueError(
                "--lengths on vLLM puts EOS at the traced length in place of a sampled token, which has no engine "
                "log-prob: --rollout-log-probs recompute, --rollout-is none, no --offpolicy decoupled"
            )
        cut = self.ppo.top_k > 0 or self.ppo.top_p < 1
        if cut and (rollout.rollout_log_probs == "engine" or rollout.rollout_is != "none"):
            raise ValueError(
                "under --top-k / --top-p vLLM returns the cut distribution's log-probs, the trainer the whole "
                "softmax's: --rollout-log-probs recompute and --rollout-is none"
            )
        if self.dp > 1:
            raise ValueError("--rollout-engine vllm generates for one actor rank: --dp 1")
        if self.schedule.asynchronous and not self.rollout_workers:
            raise ValueError(
                "--policy async on vLLM generates in --rollout-workers (each owns an engine): give --rollout-workers 1"
            )

    @property
    def learning_rates(self) -> tuple[float, float]:
        """(actor, critic) Adam learning rates: the given ones, else the preset's. Models trained from random
        weights here take large steps; a pretrained checkpoint is broken by them (SmolLM2-135M at 3e-4 over two
        epochs: ratios of 1e4 by the second minibatch), so it gets verl's defaults (actor 1e-6, critic 1e-5)."""
        tiny = self.model.preset in TINY_PRESETS
        actor = self.ppo.lr if self.ppo.lr is not None else (3e-4 if tiny else 1e-6)
        return actor, self.ppo.critic_lr if self.ppo.critic_lr is not None else (1e-3 if tiny else 1e-5)

    @property
    def streamed_roles(self) -> tuple[str, ...]:
        """The scorer roles fed chunk by chunk: the schedule's ``streamed_scorers`` under a streaming policy. Where
        those are the default (the reward model alone) and ``--reward-fn`` scores on the host instead, streaming goes
        to the reference and, under PPO, the critic: the scorers left to overlap with the decode."""
        if not self.schedule.streaming:
            return ()
        if self.task.reward_fn and self.schedule.streamed_scorers == ("reward",):
            return ("reference", "critic") if self.schedule.algo == "ppo" else ("reference",)
        return self.schedule.streamed_scorers

    @property
    def reward_model(self) -> bool:
        """Whether a reward model scores the responses (else a rule: the tiny task's, or ``--reward-fn``)."""
        if self.task.reward_fn:
            return False
        return bool(self.model.reward) if self.model.preset in ("hf", "smollm2") else self.task.reward_kind == "learned"


SECTIONS = {
    "schedule": ScheduleConfig,
    "model": ModelConfig,
    "ppo": PPOConfig,
    "task": TaskConfig,
    "rollout": RolloutConfig,
}


def load_config(path: str | Path) -> ExecConfig:
    """The config a run stored beside its records (``config.json``), checked to describe the same inputs: a
    lengths or prompts file whose content changed since the run is an error (``sources`` digests). A config from
    before ``--max-prompt-tokens`` re-runs as it ran: its ``prompt_tokens`` was the cap of its file prompts too."""
    raw = load_stored_config(path)
    task = raw.get("task")
    if isinstance(task, dict) and "max_prompt_tokens" not in task and "prompt_tokens" in task:
        # written before --max-prompt-tokens: --prompt-tokens capped the --prompts / --data prompts too
        raw["task"] = task | {"max_prompt_tokens": task["prompt_tokens"]}
    kwargs = {name: config_from_dict(cls, raw.get(name, {}), f"{path}: [{name}]") for name, cls in SECTIONS.items()}
    top = {k: v for k, v in raw.items() if k not in SECTIONS and k != "sources"}
    config = config_from_dict(ExecConfig, top, str(path), **kwargs)
    check_sources(raw.get("sources", {}), input_files(config), str(path))
    return config


def input_files(config: ExecConfig) -> dict[str, str]:
    """The files a run reads besides its models, by setting name (their digests are stored with the config)."""
    task = config.task
    files = {"lengths": task.lengths, "prompts": task.prompts, "data": task.data, "val_data": task.val_data}
    if task.reward_fn and reward_file(task.reward_fn):  # PATH.py:FUNCTION: the file's content is part of the run
        files["reward_fn"] = str(reward_file(task.reward_fn))
    return {name: path for name, path in files.items() if path is not None}
