"""Transformer shapes, written once in the fields of a Hugging Face ``config.json``.

Both backends read a shape from here: the executor builds its tiny models from it (``LlamaConfig(**shape)``) and
the simulator derives its cost model's shape from it. A user's own checkpoint is a shape source too: any
``config.json`` of a decoder-only model with the keys below (:func:`load_hf_config`).
Values of the public models are copied from their published ``config.json`` files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oppo.stored_config import read_config_json

# The keys a shape needs (Llama / Qwen / Mistral naming); num_key_value_heads defaults to num_attention_heads and
# dtype (``torch_dtype`` in older configs) to bfloat16.
SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")

BYTES_PER_PARAM = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}

HF_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-7b": dict(
        num_hidden_layers=28,
        hidden_size=3584,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        vocab_size=152064,
        dtype="bfloat16",
    ),
    "qwen2.5-3b": dict(
        num_hidden_layers=36,
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=2,
        intermediate_size=11008,
        vocab_size=151936,
        dtype="bfloat16",
    ),
    "qwen2.5-1.5b": dict(
        num_hidden_layers=28,
        hidden_size=1536,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
        dtype="bfloat16",
    ),
    "qwen2.5-0.5b": dict(
        num_hidden_layers=24,
        hidden_size=896,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        dtype="bfloat16",
    ),
    "gemma-2-2b": dict(
        num_hidden_layers=26,
        hidden_size=2304,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=9216,
        vocab_size=256000,
        dtype="bfloat16",
    ),
    "llama-2-7b": dict(
        num_hidden_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=32,
        intermediate_size=11008,
        vocab_size=32000,
        dtype="bfloat16",
    ),
    # The executor's presets (Llama architecture, untied embeddings, float32 on CPU).
    # tiny-cpu: ~30k parameters, a default run finishes in a few minutes on 2 cores
    "tiny-cpu": dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=64,
        dtype="float32",
    ),
    # small-cpu: ~25M parameters
    "small-cpu": dict(
        num_hidden_layers=8,
        hidden_size=512,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=1536,
        vocab_size=512,
        dtype="float32",
    ),
}


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """The shape fields of a Hugging Face ``config.json`` (a file, or a checkpoint folder holding one).

    Raises ``ValueError`` naming the file and the missing or invalid key."""
    raw = read_config_json(path, "model config")
    raw = raw.get("text_config", raw)  # multimodal configs nest the language model's
    path = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: text_config is not a JSON object")
    missing = [k for k in SHAPE_KEYS if k not in raw]
    if missing:
        raise ValueError(f"{path}: not a decoder-only model config, missing {', '.join(missing)}")
    shape = {k: raw[k] for k in SHAPE_KEYS}
    shape["num_key_value_heads"] = raw.get("num_key_value_heads") or raw["num_attention_heads"]
    for key, value in shape.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{path}: {key} must be a positive integer, got {value!r}")
    shape["dtype"] = raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"
    if shape["dtype"] not in BYTES_PER_PARAM:
        raise ValueError(f"{path}: unknown dtype {shape['dtype']!r}; known: {', '.join(BYTES_PER_PARAM)}")
    return shape
