"""Transformer shapes, written once in the fields of a Hugging Face ``config.json``.

Both backends read a shape from here: the executor builds its tiny models from it (``LlamaConfig(**shape)``) and
the simulator derives its cost model's shape from it. A user's own checkpoint is a shape source too: any
``config.json`` of a decoder-only model with the keys below (:func:`load_hf_config`).
Values of the public models are copied from their published ``config.json`` files.

Both backends also count a shape's parameters and FLOPs here (:func:`parameter_count`,
:func:`role_flops_per_token`): the simulator's costs and MFU, the executor's MFU.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oppo.data import read_config_json

# The keys a shape needs (Llama / Qwen / Mistral naming); num_key_value_heads defaults to num_attention_heads,
# head_dim to hidden_size / num_attention_heads (Gemma 2 and Qwen3 set it otherwise), dtype (``torch_dtype`` in
# older configs) to bfloat16 and tie_word_embeddings (the LM head is the token embedding) to the default of the
# model type's config class, which a config.json saved by transformers may omit.
SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text")  # model types whose configs default to tied

BYTES_PER_PARAM = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}

SCORE_HEAD_ROLES = ("critic", "reward")  # one-label sequence classifiers: a score head (H x 1), no LM head

# Columns of the table below, in the order of its rows.
_TABLE_KEYS = (*SHAPE_KEYS[:3], "num_key_value_heads", "head_dim", *SHAPE_KEYS[3:], "dtype", "tie_word_embeddings")
_TABLE = {  # layers, hidden, heads, kv heads, head dim, intermediate, vocab, dtype, tied (published config.json)
    "qwen2.5-7b": (28, 3584, 28, 4, 128, 18944, 152064, "bfloat16", False),
    "qwen2-7b": (28, 3584, 28, 4, 128, 18944, 152064, "bfloat16", False),  # Qwen2-7B(-Instruct): Qwen2.5-7B's shape
    "qwen2.5-3b": (36, 2048, 16, 2, 128, 11008, 151936, "bfloat16", True),
    "qwen2.5-1.5b": (28, 1536, 12, 2, 128, 8960, 151936, "bfloat16", True),
    "qwen2.5-0.5b": (24, 896, 14, 2, 64, 4864, 151936, "bfloat16", True),
    "qwen3-0.6b": (28, 1024, 16, 8, 128, 3072, 151936, "bfloat16", True),  # Qwen3: head_dim 128 at every size
    "qwen3-1.7b": (28, 2048, 16, 8, 128, 6144, 151936, "bfloat16", True),
    "qwen3-4b": (36, 2560, 32, 8, 128, 9728, 151936, "bfloat16", True),
    "qwen3-8b": (36, 4096, 32, 8, 128, 12288, 151936, "bfloat16", False),
    "gemma-2-2b": (26, 2304, 8, 4, 256, 9216, 256000, "bfloat16", True),  # head_dim 256, not 2304 / 8
    "llama-2-7b": (32, 4096, 32, 32, 128, 11008, 32000, "bfloat16", False),
    "llama-3.1-8b": (32, 4096, 32, 8, 128, 14336, 128256, "bfloat16", False),
    "deepseek-llm-7b": (30, 4096, 32, 32, 128, 11008, 102400, "bfloat16", False),
    # The executor's presets (Llama architecture, untied embeddings, float32 on CPU).
    "tiny-cpu": (2, 64, 4, 2, 16, 128, 64, "float32", False),  # ~30k parameters: minutes on 2 cores
    "small-cpu": (8, 512, 8, 4, 64, 1536, 512, "float32", False),  # ~25M parameters
}
HF_SHAPES: dict[str, dict[str, Any]] = {name: dict(zip(_TABLE_KEYS, row)) for name, row in _TABLE.items()}


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """The shape fields of a Hugging Face ``config.json`` (a file, or a checkpoint folder holding one).

    Raises ``ValueError`` naming the file and the missing or invalid key."""
    top = read_config_json(path, "model config")
    raw = top.get("text_config", top)  # multimodal configs nest the language model's
    path = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: text_config is not a JSON object")
    missing = [k for k in SHAPE_KEYS if k not in raw]
    if missing:
        raise ValueError(f"{path}: not a decoder-only model config, missing {', '.join(missing)}")
    shape = {k: raw[k] for k in SHAPE_KEYS}
    shape["num_key_value_heads"] = raw.get("num_key_value_heads") or raw["num_attention_heads"]
    for key, value in shape.items():  # before head_dim divides by the heads
        _positive_integer(path, key, value)
    shape["head_dim"] = head_dim(raw)
    _positive_integer(path, "head_dim", shape["head_dim"])
    shape["dtype"] = raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"
    if not isinstance(shape["dtype"], str) or shape["dtype"] not in BYTES_PER_PARAM:
        raise ValueError(f"{path}: unknown dtype {shape['dtype']!r}; known: {', '.join(BYTES_PER_PARAM)}")
    tied = raw.get("tie_word_embeddings", top.get("tie_word_embeddings", raw.get("model_type") in TIED_BY_DEFAULT))
    if not isinstance(tied, bool):
        raise ValueError(f"{path}: tie_word_embeddings must be true or false, got {tied!r}")
    shape["tie_word_embeddings"] = tied
    return shape


def _positive_integer(path: Path, key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{path}: {key} must be a positive integer, got {value!r}")


def head_dim(shape: Mapping[str, Any]) -> int:
    """Width of one attention head: the config's ``head_dim``, else hidden / heads.

    >>> head_dim(HF_SHAPES["gemma-2-2b"]), head_dim({"hidden_size": 896, "num_attention_heads": 14})
    (256, 64)
    """
    return shape.get("head_dim") or shape["hidden_size"] // shape["num_attention_heads"]


def layer_parameters(shape: Mapping[str, Any]) -> int:
    """Weights of one decoder layer: the q, k, v, o projections (q and o over the attention heads, k and v over the
    key-value heads, each ``head_dim`` wide) and the gated MLP's three matrices; RMSNorm weights (Qwen3's q / k
    norms too) and attention biases aside.

    >>> layer_parameters(HF_SHAPES["tiny-cpu"])  # 64 x (4+2+2) x 16 + 4 x 16 x 64 + 3 x 64 x 128
    36864
    """
    hidden, heads, kv_heads = shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"]
    width = head_dim(shape)
    attention = hidden * (heads + 2 * kv_heads) * width + heads * width * hidden
    return attention + 3 * hidden * shape["intermediate_size"]


def parameter_count(shape: Mapping[str, Any], score_head: bool = False) -> int:
    """Weights of a model of this shape: its layers, the token embedding (V x H) and its head, an LM head (V x H)
    unless tied to the embedding (``tie_word_embeddings``: one matrix serves both), or with ``score_head`` the
    one-label score head (H) of a critic or reward model. RMSNorm weights and attention biases aside (71,552 of
    Qwen2.5-0.5B's 494,032,768).

    >>> parameter_count(HF_SHAPES["qwen2.5-0.5b"])  # tied: one V x H matrix
    493961216
    >>> parameter_count(HF_SHAPES["llama-2-7b"])  # untied; 6,738,415,616 with its 65 x 4096 RMSNorm weights
    6738149376
    >>> parameter_count(HF_SHAPES["qwen2.5-7b"], score_head=True)  # a critic: a score head (H), no LM head
    7070289408
    """
    embedding = shape["vocab_size"] * shape["hidden_size"]
    if score_head:
        head = shape["hidden_size"]
    else:
        head = 0 if shape.get("tie_word_embeddings", False) else embedding
    return shape["num_hidden_layers"] * layer_parameters(shape) + embedding + head


def forward_flops_per_token(shape: Mapping[str, Any], score_head: bool = False) -> float:
    """Forward FLOPs per token of a model of this shape, attention over the context aside: 2 per weight of the
    untied model (embedding, layers, head). A tied head shares the embedding's weights, not its work: its matmul
    still runs, so a tie changes the parameters and bytes, never the FLOPs.

    >>> tiny = HF_SHAPES["tiny-cpu"]
    >>> forward_flops_per_token(tiny), forward_flops_per_token({**tiny, "tie_word_embeddings": True})
    (163840.0, 163840.0)
    """
    return 2.0 * parameter_count({**shape, "tie_word_embeddings": False}, score_head)


def matmul_flops_per_token(shape: Mapping[str, Any], score_head: bool = False) -> float:
    """Forward FLOPs per token that a GPU computes, attention over the context aside: 2 per weight of the layers'
    matmuls and the head's (the LM head's V x H, or a score head's H). The token embedding is a lookup (a gather of
    one row), no matmul. :func:`forward_flops_per_token` also counts it, as verl's and our MFU do; a roofline needs
    the work itself: the embedding is 22% of a Qwen2.5-0.5B actor's count, 6-7% of a 7B one's.

    >>> shape = HF_SHAPES["qwen2.5-0.5b"]
    >>> round(1 - matmul_flops_per_token(shape) / forward_flops_per_token(shape), 3)  # the embedding's share
    0.216
    """
    head = shape["hidden_size"] if score_head else shape["vocab_size"] * shape["hidden_size"]
    return 2.0 * (shape["num_hidden_layers"] * layer_parameters(shape) + head)


def role_flops_per_token(shapes: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Forward FLOPs per token of each role's model (role -> its shape), the count both backends report MFU with:
    the actor and the reference are causal LMs, the critic and the reward model one-label sequence classifiers
    (:data:`SCORE_HEAD_ROLES`). Training a token costs three times its forward.

    >>> role_flops_per_token({"actor": HF_SHAPES["tiny-cpu"], "critic": HF_SHAPES["tiny-cpu"]})
    {'actor': 163840.0, 'critic': 155776.0}
    """
    return {role: forward_flops_per_token(shape, role in SCORE_HEAD_ROLES) for role, shape in shapes.items()}
