"""Models of the four roles, loaded through ``from_pretrained(path)`` from Hugging Face checkpoint folders.

Presets ``tiny-cpu`` and ``small-cpu`` are checkpoints prepared at first use (:mod:`oppo.exec.models.tiny`); preset
``smollm2`` is SmolLM2-135M-Instruct converted at first use (:mod:`oppo.exec.models.pretrained`), its critic the same
backbone under a zero value head; preset ``hf`` loads local folders.

Roles: actor (causal LM, trained), reference (frozen copy of the actor), critic (sequence-classification model
with one label whose score head is applied at every position, trained) and reward (same class, head applied at
the last real token, frozen).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

from oppo.exec.config import ModelConfig
from oppo.exec.models.tiny import prepared_checkpoints

ROLES = ("actor", "reference", "critic", "reward")


@dataclass
class Roles:
    """The models of one process (a role it does not hold is None) and the facts every process shares."""

    actor: torch.nn.Module | None
    reference: torch.nn.Module | None
    critic: torch.nn.Module | None
    reward: torch.nn.Module | None
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


def role_paths(config: ModelConfig) -> dict[str, Path | str]:
    """Checkpoint folder of each role (preparing the tiny presets and smollm2 at first use); no ``reward`` entry
    where no reward model is given (a ``--reward-fn`` run). Without a critic folder, the critic starts from the
    reward model (hf), or from the actor's checkpoint under a new value head (hf with ``--reward-fn``; smollm2's
    head is zeros)."""
    if config.preset == "hf":
        paths = {
            "actor": config.actor,
            "reward": config.reward,
            "critic": config.critic or config.reward or config.actor,
            "reference": config.reference or config.actor,
        }
        return {role: path for role, path in paths.items() if path is not None}
    if config.preset == "smollm2":
        from oppo.exec.models.pretrained import smollm2_critic_folder, smollm2_folder

        actor = smollm2_folder()
        paths = {"actor": actor, "reference": actor, "critic": smollm2_critic_folder()}
        return paths | ({"reward": config.reward} if config.reward else {})
    paths = prepared_checkpoints(config.preset)
    return {"actor": paths["actor"], "reward": paths["reward"], "critic": paths["reward"], "reference": paths["actor"]}


def role_class(role: str) -> type:
    """Causal LM (actor, reference) or 1-label sequence classifier (critic, reward)."""
    return AutoModelForCausalLM if role in ("actor", "reference") else AutoModelForSequenceClassification


def load_role(config: ModelConfig, role: str, device: torch.device | None = None) -> torch.nn.Module:
    """One role's model from its folder, trainable for the actor and the critic only."""
    device = device or resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    path = role_paths(config)[role]
    try:
        model = role_class(role).from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    except ValueError as err:  # a family without sdpa (Gemma 2: soft-capped attention) runs eager
        if "scaled_dot_product_attention" not in str(err):
            raise
        model = role_class(role).from_pretrained(path, dtype=dtype, attn_implementation="eager")
    model = model.to(device)
    model.train(False)
    model.requires_grad_(role in ("actor", "critic"))
    check_head_outputs(model, f"{role} {path}")
    return model


def load_roles(config: ModelConfig, device: torch.device | None = None, which: tuple[str, ...] = ROLES) -> Roles:
    """Load the roles in ``which`` onto ``device`` (default: the configured one) and the configured dtype."""
    device = device or resolve_device(config.device)
    if config.threads:
        torch.set_num_threads(config.threads)
    models = {role: load_role(config, role, device) if role in which else None for role in ROLES}
    pad_id, eos_id, vocab_size = token_ids(config)
    return Roles(
        **models,
        pad_id=pad_id,
        eos_id=eos_id,
        vocab_size=vocab_size,
        device=device,
        dtype=resolve_dtype(config.dtype, device),
    )


def token_ids(config: ModelConfig) -> tuple[int, int, int]:
    """(padding id, EOS id, vocabulary size) of the actor, read from its config alone.

    The padding id is the EOS id where the checkpoint names none: padded positions are always masked out, so any
    id is correct, and one rule keeps every process padding alike."""
    hf = AutoConfig.from_pretrained(role_paths(config)["actor"])
    eos = hf.eos_token_id[0] if isinstance(hf.eos_token_id, list) else hf.eos_token_id
    pad = hf.pad_token_id if hf.pad_token_id is not None else eos
    return int(pad), int(eos), int(hf.vocab_size)


def cache_arg(model: torch.nn.Module, cache) -> dict:
    """``cache`` as the keyword ``model``'s forward takes it: transformers renamed ``past_key_values`` to ``cache``
    (5.24; the old name still works there, with a deprecation warning on every forward)."""
    return {_cache_keyword(type(model)): cache}


@functools.cache
def _cache_keyword(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer body of a causal-LM or sequence-classification model."""
    return model.base_model


def score_head(model: torch.nn.Module) -> torch.nn.Module:
    """The head applied to hidden states: lm_head for causal LMs, score for sequence classification."""
    return model.lm_head if hasattr(model, "lm_head") else model.score


def head_outputs(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """What ``model``'s own forward returns for final hidden states ``hidden`` (..., H): its head, then what its
    family applies after the head (causal LMs: Gemma 2 and 3 soft-cap the logits, ``cap * tanh(logits / cap)``;
    Cohere multiplies them by ``logit_scale``; Granite divides them by ``logits_scaling``). Shape (..., V), or
    (..., 1) for a sequence-classification head. :func:`check_head_outputs` proves it for a loaded model."""
    out = score_head(model)(hidden)
    if not hasattr(model, "lm_head"):
        return out
    config = model.config.get_text_config()
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        out = torch.tanh(out / cap) * cap
    scale = getattr(model, "logit_scale", None)  # Cohere keeps config.logit_scale on the model, a number
    if isinstance(scale, int | float):
        out = out * scale
    divisor = getattr(config, "logits_scaling", None)
    if divisor:
        out = out / divisor
    return out


@torch.no_grad()
def check_head_outputs(model: torch.nn.Module, name: str) -> None:
    """Fail, naming the model, if :func:`head_outputs` of its body's hidden states is not what its forward returns
    (a family that changes its logits after the head in a way oppo does not know): the scorers' log-probs would
    not be the sampler's and the trainer's, and the PPO ratio would not be 1 at identical weights. Causal LMs
    only: a sequence-classification forward returns the last real token's score alone."""
    if not hasattr(model, "lm_head"):
        return
    device = next(model.parameters()).device
    ids = torch.arange(1, 6, device=device)[None, :] % model.config.get_text_config().vocab_size  # (1, 5)
    full = model(input_ids=ids).logits
    ours = head_outputs(model, backbone(model)(input_ids=ids).last_hidden_state)
    gap = float((full.float() - ours.float()).abs().max())
    if gap > 1e-3 * max(1.0, float(full.float().abs().max())):
        raise ValueError(
            f"{name}: {type(model).__name__} changes its outputs after the head in a way oppo does not apply "
            f"(max difference {gap:.3g}); its scored log-probs would not be its own"
        )


def is_tied(model: torch.nn.Module) -> bool:
    """Whether the head's weight is the input embedding's (one parameter), as in Qwen2.5 0.5B-3B and Gemma."""
    return score_head(model).weight is model.get_input_embeddings().weight


def actor_tokenizer(config: ModelConfig):
    """The tokenizer saved with the actor's checkpoint."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(role_paths(config)["actor"])


def load_prompts(config) -> list[list[int]]:
    """Token ids of each non-empty line of ``config.task.prompts`` (actor's tokenizer, no special tokens),
    keeping the last ``max_prompt_tokens`` tokens of a long prompt."""
    tokenizer = actor_tokenizer(config.model)
    lines = [line.strip() for line in Path(config.task.prompts).read_text().splitlines() if line.strip()]
    cap = config.task.max_prompt_tokens
    prompts = [tokenizer(line, add_special_tokens=False)["input_ids"][-cap:] for line in lines]
    prompts = [p for p in prompts if p]
    if not prompts:
        raise ValueError(f"{config.task.prompts}: no prompt with any token")
    return prompts
