"""Checkpoints of real architectures with random weights, for measuring on hardware without downloads.

A Qwen2 causal LM (actor, reference) and a one-label Qwen2 sequence classifier (critic, reward) built from a
shape of :data:`oppo.catalog.shapes.HF_SHAPES` (or any dict of the same fields), saved with ``save_pretrained`` so that
the executor loads them through ``from_pretrained`` like any local checkpoint (``--preset hf``). Timing does not
depend on the weights' values; learning does, so these are for speed, not for rewards. ``tied``: the causal LM's
output head is its input embedding (one parameter), as in Qwen2.5 0.5B-3B, Llama 3.2 and Gemma.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

from oppo.catalog.shapes import HF_SHAPES

PAD = EOS = 0  # id 0 ends and pads: random weights have no vocabulary of their own


def qwen2_config(shape: str | dict, num_labels: int | None = None, tied: bool | None = None) -> Qwen2Config:
    """``tied``: None takes the shape's ``tie_word_embeddings`` (untied where it has none)."""
    fields = dict(HF_SHAPES[shape] if isinstance(shape, str) else shape)
    fields.pop("dtype", None)  # the executor chooses the dtype it loads in
    shape_tied = fields.pop("tie_word_embeddings", False)
    tied = shape_tied if tied is None else tied
    extra = {"num_labels": num_labels} if num_labels else {}
    return Qwen2Config(
        **fields,
        max_position_embeddings=32768,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=EOS,
        tie_word_embeddings=tied,
        **extra,
    )


def random_checkpoints(
    shape: str | dict, out: str | Path, seed: int = 0, tied: bool | None = None, dtype: torch.dtype = torch.bfloat16
) -> dict[str, Path]:
    """Actor and reward folders under ``out`` (reused when already there), weights stored in ``dtype``; ``tied``:
    the actor's head is its input embedding (None: as the shape says). Returns their paths."""
    out = Path(out)
    paths = {"actor": out / "actor", "reward": out / "reward"}
    if all((p / "config.json").exists() for p in paths.values()):
        return paths
    torch.manual_seed(seed)
    for role, model in (
        ("actor", lambda: Qwen2ForCausalLM(qwen2_config(shape, tied=tied))),
        ("reward", lambda: Qwen2ForSequenceClassification(qwen2_config(shape, num_labels=1, tied=tied))),
    ):
        built = model().to(dtype)
        built.save_pretrained(paths[role])
        del built
    return paths
