"""Models of the four roles, loaded through ``from_pretrained(path)`` from Hugging Face checkpoint folders.

Presets ``tiny-cpu`` and ``small-cpu`` build Llama-architecture models from a config, prepare them (SFT warm-up
of the actor, reward model trained on synthetic preferences: see :mod:`oppo.exec.task`), save them with
``save_pretrained`` into a cache folder, then load them like any checkpoint. Preset ``hf`` loads local folders.

Roles: actor (causal LM, trained), reference (frozen copy of the actor), critic (sequence-classification model
with one label whose score head is applied at every position, trained) and reward (same class, head applied at
the last real token, frozen).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    PreTrainedTokenizerFast,
)

from oppo.exec.config import ModelConfig

PAD, EOS, BOS = 0, 1, 2  # special token ids of the tiny vocabularies
CACHE_VERSION = "v1"

SHAPES = {
    # ~30k parameters: a default run finishes in a few minutes on 2 cores
    "tiny-cpu": dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2),
    # ~25M parameters
    "small-cpu": dict(vocab_size=512, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4),
}  # fmt: skip


PREP_STEPS = {"tiny-cpu": (300, 400, 32), "small-cpu": (60, 80, 16)}  # SFT steps, RM steps, batch


@dataclass
class Roles:
    actor: torch.nn.Module
    reference: torch.nn.Module
    critic: torch.nn.Module
    reward: torch.nn.Module
    pad_id: int
    eos_id: int
    vocab_size: int
    device: torch.device
    dtype: torch.dtype


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def cache_dir() -> Path:
    return Path(os.environ.get("OPPO_CACHE", Path.home() / ".cache" / "oppo"))


def llama_config(preset: str, num_labels: int | None = None) -> LlamaConfig:
    extra = {"num_labels": num_labels} if num_labels else {}
    return LlamaConfig(
        **SHAPES[preset], max_position_embeddings=4096, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS,
        tie_word_embeddings=False, attn_implementation="sdpa", **extra,
    )  # fmt: skip


def tiny_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``<pad> </s> <s> t3 t4 ...`` so the tiny checkpoints are complete folders."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": PAD, "</s>": EOS, "<s>": BOS} | {f"t{i}": i for i in range(3, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>")


def prepared_checkpoints(preset: str) -> dict[str, Path]:
    """Folders of the preset's actor and reward model, built and prepared at first use (deterministic)."""
    from oppo.exec import task

    root = cache_dir() / f"{preset}-{CACHE_VERSION}"
    paths = {"actor": root / "actor", "reward": root / "reward"}
    if all((p / "config.json").exists() for p in paths.values()):
        return paths
    torch.manual_seed(0)
    actor = LlamaForCausalLM(llama_config(preset))
    reward = LlamaForSequenceClassification(llama_config(preset, num_labels=1))
    sft_steps, rm_steps, batch = PREP_STEPS[preset]
    task.sft_warmup(actor, vocab_size=SHAPES[preset]["vocab_size"], steps=sft_steps, batch=batch)
    task.train_reward_model(reward, vocab_size=SHAPES[preset]["vocab_size"], steps=rm_steps, batch=batch)
    tokenizer = tiny_tokenizer(SHAPES[preset]["vocab_size"])
    for name, model in (("actor", actor), ("reward", reward)):
        tmp = paths[name].with_name(f"{paths[name].name}.tmp{os.getpid()}")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(paths[name], ignore_errors=True)  # a partial folder from an interrupted build
        os.replace(tmp, paths[name])
    return paths


def role_paths(config: ModelConfig) -> dict[str, Path | str]:
    """Checkpoint folder of each role (preparing the tiny presets at first use)."""
    if config.preset == "hf":
        return {"actor": config.actor, "reward": config.reward, "critic": config.critic or config.reward,
                "reference": config.reference or config.actor}  # fmt: skip
    paths = prepared_checkpoints(config.preset)
    return {"actor": paths["actor"], "reward": paths["reward"], "critic": paths["reward"], "reference": paths["actor"]}


def load_role(config: ModelConfig, role: str, device: torch.device | None = None) -> torch.nn.Module:
    """One role's model from its folder: causal LM (actor, reference) or 1-label classifier (critic, reward)."""
    device = device or resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    cls = AutoModelForCausalLM if role in ("actor", "reference") else AutoModelForSequenceClassification
    model = cls.from_pretrained(role_paths(config)[role], dtype=dtype, attn_implementation="sdpa").to(device)
    model.train(False)
    model.requires_grad_(role in ("actor", "critic"))
    return model


def load_roles(config: ModelConfig) -> Roles:
    """Load the four roles onto the configured device and dtype."""
    device = resolve_device(config.device)
    if config.threads:
        torch.set_num_threads(config.threads)
    models = {role: load_role(config, role, device) for role in ("actor", "reference", "critic", "reward")}
    actor = models["actor"]
    pad_id = actor.config.pad_token_id if actor.config.pad_token_id is not None else actor.config.eos_token_id
    eos_id = actor.config.eos_token_id
    eos_id = eos_id[0] if isinstance(eos_id, list) else eos_id
    return Roles(
        **models,
        pad_id=int(pad_id),
        eos_id=int(eos_id),
        vocab_size=actor.config.vocab_size,
        device=device,
        dtype=resolve_dtype(config.dtype, device),
    )


def backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer body of a causal-LM or sequence-classification model."""
    return model.base_model


def score_head(model: torch.nn.Module) -> torch.nn.Module:
    """The head applied to hidden states: lm_head for causal LMs, score for sequence classification."""
    return model.lm_head if hasattr(model, "lm_head") else model.score
