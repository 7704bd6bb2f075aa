"""Hardware and model shapes: GPU datasheets (:mod:`oppo.gpus`), transformer shapes, generation engines.

Model shapes from :mod:`oppo.shapes` (the models' own ``config.json`` fields) or from a user's ``config.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from oppo.gpus import GPU, GPUS  # noqa: F401  (re-exported: the simulator's hardware in one namespace)
from oppo.shapes import BYTES_PER_PARAM, HF_SHAPES, forward_flops_per_token, head_dim, load_hf_config, parameter_count


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer (Llama/Qwen family: gated MLP, grouped-query attention) with an LM head; every
    role is costed as one. Parameters and FLOPs are counted by :mod:`oppo.shapes`."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    mlp: int  # intermediate size of the gated MLP
    vocab: int
    bytes_per_param: int = 2  # bf16
    tied: bool = False  # the LM head is the token embedding: V x H weights (and bytes) fewer, the same FLOPs
    head_dim: int = 0  # width of an attention head; 0: hidden / heads (Gemma 2 and Qwen3 set their own)

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    @classmethod
    def from_hf(cls, name: str, config: dict) -> ModelShape:
        """The shape of a Hugging Face ``config.json`` (its fields, as in :data:`oppo.shapes.HF_SHAPES`)."""
        return cls(
            name,
            config["num_hidden_layers"],
            config["hidden_size"],
            config["num_attention_heads"],
            config["num_key_value_heads"],
            config["intermediate_size"],
            config["vocab_size"],
            BYTES_PER_PARAM[config.get("dtype", "bfloat16")],
            config.get("tie_word_embeddings", False),
            head_dim(config),
        )

    @property
    def hf_fields(self) -> dict:
        """This shape as the fields of a Hugging Face ``config.json``."""
        return dict(
            num_hidden_layers=self.layers,
            hidden_size=self.hidden,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            intermediate_size=self.mlp,
            vocab_size=self.vocab,
            tie_word_embeddings=self.tied,
            head_dim=self.head_dim,
        )

    @cached_property
    def params(self) -> int:
        """Weights held (a tied head counted once), RMSNorm weights and attention biases aside."""
        return parameter_count(self.hf_fields)

    @cached_property
    def flops_per_token(self) -> float:
        """Forward FLOPs per token, attention aside (a tied head's matmul runs as an untied one's)."""
        return forward_flops_per_token(self.hf_fields)

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    def forward_flops(self, tokens: float, attended: float) -> float:
        """FLOPs of a forward pass over ``tokens`` new tokens that attend to ``attended`` (query, key) pairs."""
        # QK^T and the attention-weighted V: 2 FLOPs each per (query, key) pair per unit of the heads' width
        return self.flops_per_token * tokens + 4 * self.layers * self.heads * self.head_dim * attended


MODELS = {name: ModelShape.from_hf(name, config) for name, config in HF_SHAPES.items()}


def model_shape(name_or_config: str) -> ModelShape:
    """A named shape (:data:`MODELS`) or the shape of a Hugging Face ``config.json`` (file or folder)."""
    if name_or_config in MODELS:
        return MODELS[name_or_config]
    if not name_or_config.endswith(".json") and not Path(name_or_config).is_dir():
        raise ValueError(
            f"unknown model {name_or_config!r}; choose from {', '.join(sorted(MODELS))} or a Hugging Face config.json"
        )
    return ModelShape.from_hf(name_or_config, load_hf_config(name_or_config))


@dataclass(frozen=True)
class Engine:
    """How efficiently a generation engine uses the GPU, separate from the GPU itself.

    ``decode_step_overhead_s``: fixed host-side time per decode iteration (Python, kernel launches; CUDA graphs
    and continuous batching make it small). ``decode_efficiency``: multiplies the achieved bandwidth of decode.
    ``forward_efficiency``: multiplies achieved FLOP/s of the framework's scoring forward passes (prefill).
    ``weight_gather_bytes_per_s``: ZeRO-3-sharded models all-gather their weights for every forward pass, decode
    iterations included (0 = weights resident).
    ``compacts_batch``: finished sequences leave the decode batch (continuous batching); without it (HF
    ``generate``, our executor) every row is computed until the last one stops, and batches are left-padded.
    ``needs_weight_sync``: the engine holds its own weight copy (vLLM), so trained weights are pushed each step.
    """

    name: str
    decode_step_overhead_s: float
    decode_efficiency: float
    forward_efficiency: float
    needs_weight_sync: bool
    weight_gather_bytes_per_s: float = 0.0
    compacts_batch: bool = False


ENGINES = {
    e.name: e
    for e in (
        # Hugging Face generate under DeepSpeed ZeRO-3, as TRL's PPOTrainer runs multi-GPU: no paged attention,
        # no CUDA graphs (~25 ms host time per decode iteration [assumed]), weights all-gathered per forward.
        # weight_gather_bytes_per_s is FITTED to the paper's TRL 7B step time on 8 x H200 (~6 min per step).
        Engine("hf", 0.025, 0.6, 1.0, needs_weight_sync=False, weight_gather_bytes_per_s=50e9),
        Engine("vllm", 0.003, 0.9, 1.0, needs_weight_sync=True, compacts_batch=True),
        Engine("torch-cpu", 0.0, 1.0, 1.0, needs_weight_sync=False),
    )
}


def lookup(table: dict, name: str, what: str):
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; choose from {', '.join(sorted(table))}")
    return table[name]
