"""The executor's root config: the shared schedule plus model, PPO and task sections. Frozen; validated."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from oppo.config import ScheduleConfig, check_positive, opt, schedule_from

PRESETS = ("tiny-cpu", "small-cpu", "hf")
PLACEMENTS = ("colocated", "disaggregated")
REWARDS = ("learned", "rule")
DTYPES = ("auto", "float32", "float64", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelConfig:
    preset: str = opt("tiny-cpu", f"model preset: {', '.join(PRESETS)}")
    actor: str | None = opt(None, "hf preset: actor checkpoint folder (causal LM)")
    reward: str | None = opt(None, "hf preset: reward model folder (sequence classification, 1 label)")
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
        if self.preset == "hf":
            if not self.actor or not self.reward:
                raise ValueError("preset hf needs --actor PATH and --reward PATH")
            for name in ("actor", "reward", "critic", "reference"):
                path = getattr(self, name)
                if path is not None and not Path(path).is_dir():
                    raise ValueError(f"{name} checkpoint folder not found: {path}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0, got {self.threads}")


@dataclass(frozen=True)
class PPOConfig:
    lr: float = opt(3e-4, "actor learning rate (Adam)")
    critic_lr: float = opt(1e-3, "critic learning rate (Adam)")
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
    tppo_drop_tokens: int = opt(0, "tppo: drop this many last tokens of unfinished segments from the loss")

    def __post_init__(self) -> None:
        for name in ("lr", "critic_lr", "epochs", "minibatches", "temperature", "max_grad_norm"):
            check_positive(name, getattr(self, name))
        if not 0 <= self.lam <= 1 or not 0 <= self.gamma <= 1:
            raise ValueError("gamma and lam must be in [0, 1]")


@dataclass(frozen=True)
class TaskConfig:
    reward_kind: str = opt("learned", "learned (transformer RM trained on synthetic preferences) or rule")
    prompt_tokens: int = opt(8, "prompt length in tokens (synthetic prompts; the cap for --prompts)")
    prompts: str | None = opt(None, "text file, one prompt per line, tokenized by the actor's tokenizer "
                              "(default: synthetic prompts)")  # fmt: skip

    def __post_init__(self) -> None:
        if self.reward_kind not in REWARDS:
            raise ValueError(f"unknown reward_kind {self.reward_kind!r}; choose from {', '.join(REWARDS)}")
        check_positive("prompt_tokens", self.prompt_tokens)
        if self.prompts is not None and not Path(self.prompts).is_file():
            raise ValueError(f"prompts file not found: {self.prompts}")


def default_schedule(**overrides) -> ScheduleConfig:
    """The executor's default schedule: tiny models, short responses, small chunks."""
    defaults = dict(batch=8, max_new_tokens=48, chunk_candidates=(4, 8, 16), explore_period_steps=30,
                    check_tokens=4, delta_init=2, delta_max=4, delta_window=3, window_tokens=16)  # fmt: skip
    return schedule_from(defaults, **overrides)


@dataclass(frozen=True)
class ExecConfig:
    """Everything a run needs; stored as ``config.json`` beside its records."""

    schedule: ScheduleConfig = field(default_factory=default_schedule)
    model: ModelConfig = field(default_factory=ModelConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    steps: int = 200
    seed: int = 0
    placement: str = "colocated"

    def __post_init__(self) -> None:
        check_positive("steps", self.steps)
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {self.placement!r}; choose from {', '.join(PLACEMENTS)}")


def load_config(path: str | Path) -> ExecConfig:
    """The config a run stored beside its records (``config.json``; extra keys, e.g. ``lengths``, ignored)."""
    raw = json.loads(Path(path).read_text())
    sections = {"schedule": ScheduleConfig, "model": ModelConfig, "ppo": PPOConfig, "task": TaskConfig}
    kwargs = {name: _from_dict(cls, raw[name]) for name, cls in sections.items()}
    return ExecConfig(**kwargs, steps=raw["steps"], seed=raw["seed"], placement=raw["placement"])


def _from_dict(cls, values: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in names})
