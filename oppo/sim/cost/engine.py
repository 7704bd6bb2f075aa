"""The engine layer of the cost stack: seconds of a role's decode, prefill, scoring and training passes and of the
weight sync, on its GPUs (:mod:`oppo.sim.cost.gpu`), at the roofline. It knows nothing of SimPy.

Model shapes (:class:`ModelShape`) come from :mod:`oppo.catalog.shapes` (the models' own ``config.json`` fields) or
from a user's ``config.json``; generation engines (:class:`Engine`: HF ``generate``, vLLM) say how efficiently decoding
uses the GPU. The time of a pass is ``max(bytes / achieved_bandwidth, flops / achieved_flops)`` (a roofline):
decode is bandwidth-bound (weights + KV cache read once per iteration), prefill and training compute-bound. The
measured GPU profiles hold the linear layers only; attention is modelled analytically (KV bytes read in decode,
4·L·H FLOPs per attended (query, key) pair in prefill and training) with the same efficiencies. The framework layer
(:mod:`oppo.sim.cost.framework`) adds what a real RL framework costs on top.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np

from oppo.catalog.shapes import (
    BYTES_PER_PARAM,
    HF_SHAPES,
    forward_flops_per_token,
    head_dim,
    load_hf_config,
    matmul_flops_per_token,
    parameter_count,
)
from oppo.sim.cost.gpu import GPU, Efficiency


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer (Llama/Qwen family: gated MLP, grouped-query attention) with an LM head, or with
    ``score_head`` a one-label score head (a critic or reward model). Parameters and FLOPs are counted by
    :mod:`oppo.catalog.shapes`."""

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
    score_head: bool = False  # a critic or reward model: an H x 1 score head in place of the V x H LM head

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    @classmethod
    def from_hf(cls, name: str, config: dict) -> ModelShape:
        """The shape of a Hugging Face ``config.json`` (its fields, as in :data:`oppo.catalog.shapes.HF_SHAPES`)."""
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
        return parameter_count(self.hf_fields, self.score_head)

    @cached_property
    def flops_per_token(self) -> float:
        """Forward FLOPs per token as MFU counts them (verl's convention: the embedding too), attention aside."""
        return forward_flops_per_token(self.hf_fields, self.score_head)

    @cached_property
    def matmul_flops_per_token(self) -> float:
        """Forward FLOPs per token a GPU computes (the layers and the head), attention aside."""
        return matmul_flops_per_token(self.hf_fields, self.score_head)

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
        return self.matmul_flops_per_token * tokens + 4 * self.layers * self.heads * self.head_dim * attended


MODELS = {name: ModelShape.from_hf(name, config) for name, config in HF_SHAPES.items()}


def model_shape(name_or_config: str) -> ModelShape:
    """A named shape (:data:`MODELS`) or the shape of a Hugging Face ``config.json`` (file or folder)."""
    if name_or_config in MODELS:
        return MODELS[name_or_config]
    path = Path(name_or_config)
    if not name_or_config.endswith(".json") and not path.is_dir():
        raise ValueError(
            f"unknown model {name_or_config!r}; choose from {', '.join(sorted(MODELS))} or a Hugging Face config.json"
        )
    try:  # a simulation asks for its shapes thousands of times: parse each file once while its content is unchanged
        content = (path / "config.json" if path.is_dir() else path).read_bytes()
    except OSError:
        return ModelShape.from_hf(name_or_config, load_hf_config(name_or_config))  # its own error, naming the file
    return _file_shape(name_or_config, content)


@lru_cache(maxsize=64)
def _file_shape(path: str, content: bytes) -> ModelShape:
    """The shape of the ``config.json`` at ``path`` while it holds ``content`` (the key: a changed file is parsed
    again, however fast it changed)."""
    return ModelShape.from_hf(path, load_hf_config(path))


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
    ``group_prefill``: a prompt's G samples are one request (vLLM's ``n``, as verl asks for them): they share the
    prompt's prefill; without it each sample is a request of its own and prefills the prompt itself.
    """

    name: str
    decode_step_overhead_s: float
    decode_efficiency: float
    forward_efficiency: float
    needs_weight_sync: bool
    weight_gather_bytes_per_s: float = 0.0
    compacts_batch: bool = False
    group_prefill: bool = False


ENGINES = {
    e.name: e
    for e in (
        # Hugging Face generate under DeepSpeed ZeRO-3, as TRL's PPOTrainer runs multi-GPU: no paged attention,
        # no CUDA graphs (~25 ms host time per decode iteration [assumed]), weights all-gathered per forward.
        # weight_gather_bytes_per_s is FITTED to the paper's TRL 7B step time on 8 x H200 (~6 min per step).
        Engine("hf", 0.025, 0.6, 1.0, needs_weight_sync=False, weight_gather_bytes_per_s=50e9),
        Engine("vllm", 0.003, 0.9, 1.0, needs_weight_sync=True, compacts_batch=True, group_prefill=True),
        Engine("torch-cpu", 0.0, 1.0, 1.0, needs_weight_sync=False),
        # vLLM on CPU cores, as the executor runs it (--rollout-engine vllm): costs from a profile calibrated on its
        # own iterations (oppo.sim.cost.profile); continuous batching, weights pushed after each update, and a
        # request per sample (each its own sampling key; 128-token KV blocks: a short prompt's prefix is not shared)
        Engine("vllm-cpu", 0.0, 1.0, 1.0, needs_weight_sync=True, compacts_batch=True),
    )
}


class CostModel(Protocol):
    """Seconds of one operation of one role on its device group. Arrays broadcast (decode is vectorised).
    ``attended``: (query, key) pairs of the pass (see :func:`pass_attended`)."""

    def decode_s(self, batch: np.ndarray, context_tokens: np.ndarray) -> np.ndarray: ...

    def prefill_s(self, tokens: float, attended: float, rows: float = 1) -> float: ...

    def score_s(self, tokens: float, attended: float, rows: float = 1) -> float: ...

    def train_s(self, tokens: float, attended: float, rows: float = 1) -> float: ...

    def sync_s(self) -> float: ...

    def transfer_s(self) -> float: ...

    def fixed_s(self, stages: tuple[str, ...]) -> float:
        """Per-step seconds of the given framework stages (see :mod:`oppo.sim.cost.framework`)."""
        ...

    def update_host_s(self) -> float:
        """Seconds an update pays once a step besides its passes (an offloaded trainer's copies from the host)."""
        ...


ALLREDUCE_LATENCY_S = 10e-6  # [assumed] one small all-reduce between the GPUs of a node (NCCL/RCCL, one launch)


@dataclass(frozen=True)
class RooflineCost:
    """Cost of one model replicated data-parallel on ``n_gpus`` GPUs (batch split evenly across them).

    Generation (:meth:`decode_s`) reads three more settings of the rollout engine: ``tensor_parallel`` GPUs per
    engine (weights and KV cache split over them, two all-reduces of the activations per layer per iteration over
    the GPU's intra-node link; ``n_gpus / tensor_parallel`` engines each decode their share of the batch),
    ``kv_budget_bytes`` per GPU (a batch whose KV cache does not fit runs as resident batches that fill the budget,
    continuous batching admitting a waiting row as one finishes: each resident batch reads the weights
    again), and ``eager_decode`` (every layer launches its kernels each iteration, ``layer_overhead_s`` apiece;
    with CUDA graphs an iteration is one launch). The prompts' prefill (:meth:`prefill_s`) reads one more:
    ``max_batched_tokens``, the tokens one engine iteration computes at most (vLLM's ``max_num_batched_tokens``;
    0: no cap, one pass)."""

    model: ModelShape
    gpu: GPU
    n_gpus: int
    engine: Engine
    efficiency: Efficiency = Efficiency()
    link_bytes_per_s: float = 200e9  # weight sync link (NVLink-class)
    optimizer_bytes_per_param: float = 16.0  # Adam: fp32 master, m, v read + written
    tensor_parallel: int = 1
    kv_budget_bytes: float = math.inf
    eager_decode: bool = True
    allreduce_bytes_per_s: float = 0.0  # the tensor-parallel all-reduce's link (0: the GPU's intra-node link)
    max_batched_tokens: int = 0  # tokens one engine iteration computes at most (vLLM's max_num_batched_tokens; 0: any)

    def __post_init__(self) -> None:
        if self.tensor_parallel < 1 or self.n_gpus % self.tensor_parallel:
            raise ValueError(
                f"rollout tensor parallel {self.tensor_parallel} does not divide the {self.n_gpus} generating GPUs"
            )
        if self.kv_budget_bytes <= 0:
            raise ValueError("the rollout engine's KV budget must be > 0 bytes per GPU")

    @property
    def _bandwidth(self) -> float:
        return self.gpu.hbm_bytes_per_s * self.efficiency.bandwidth_frac

    @property
    def _flops(self) -> float:
        return self.gpu.peak_flops * self.efficiency.flops_frac

    @property
    def train_ceiling_share(self) -> float:
        """The training roofline's FLOP/s (``train_flops_frac`` of the peak, an assumed fraction) over what the
        GPU's matrix products reach (its measured matmul ceiling; unmeasured: the forward's fitted rate), at most 1:
        a fitted training efficiency up to 1 / this is physical (a calibration's prior pulls only beyond it)."""
        ceiling = self.gpu.matmul_flops or self._flops
        return min(1.0, self.gpu.peak_flops * self.efficiency.train_flops_frac / ceiling)

    def decode_s(self, batch, context_tokens):
        """One decode iteration: ``batch`` sequences each emit one token; ``context_tokens`` summed over them."""
        tp, m = self.tensor_parallel, self.model
        engines = self.n_gpus // tp
        batch = np.asarray(batch, dtype=float) / engines  # one engine's share (on its tp GPUs)
        context = np.asarray(context_tokens, dtype=float) / engines
        waves = 1.0
        if self.kv_budget_bytes < math.inf:
            # KV of the engine's share over its budget: continuous batching keeps the budget full and admits a
            # waiting row as a running one finishes, so an iteration over all rows costs their KV over the budget
            # resident batches (a fraction: no whole waves), each reading the weights once
            waves = np.maximum(1.0, m.kv_bytes_per_token * context / (self.kv_budget_bytes * tp))
            batch, context = batch / waves, context / waves
        read = m.weight_bytes + m.kv_bytes_per_token * context  # the engine's; its GPUs read 1 / tp of it each
        memory_s = read / (self._bandwidth * self.engine.decode_efficiency)
        compute_s = m.forward_flops(batch, context) / self._flops
        if tp > 1:
            memory_s, compute_s = memory_s / tp, compute_s / tp
        overhead_s = self.engine.decode_step_overhead_s + self._decode_launch_s + self._allreduce_s(batch)
        return waves * (np.maximum(memory_s, compute_s) + overhead_s)

    @property
    def _decode_launch_s(self) -> float:
        """Launch and weight-gather time of one decode iteration."""
        if self.eager_decode:
            return self._pass_overhead_s
        return self._pass_overhead_s - (self.model.layers - 1) * self.efficiency.layer_overhead_s

    def _allreduce_s(self, rows):
        """Tensor parallel: two all-reduces per layer of ``rows`` activations (ring: 2 (t - 1) / t of them cross
        the link); 0 without."""
        tp, m = self.tensor_parallel, self.model
        if tp == 1:
            return 0.0
        moved = 2 * (tp - 1) / tp * rows * m.hidden * m.bytes_per_param
        link = self.allreduce_bytes_per_s or self.gpu.link_bytes_per_s
        return 2 * m.layers * (ALLREDUCE_LATENCY_S + moved / link)

    @property
    def _pass_overhead_s(self) -> float:
        gather_bw = self.engine.weight_gather_bytes_per_s
        gather_s = self.model.weight_bytes / gather_bw if gather_bw > 0 and self.n_gpus > 1 else 0.0
        return self._launch_s + gather_s

    def prefill_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        """A forward pass over ``tokens`` new tokens attending to ``attended`` (query, key) pairs in all
        (``rows`` sequences: the framework layer counts micro-batches; the roofline does not need it)."""
        if tokens <= 0:
            return 0.0
        iterations = self.prefill_iterations(tokens)
        return self._forward_s(tokens, attended, iterations) + iterations * self._pass_overhead_s

    def prefill_iterations(self, tokens: float) -> int:
        """Engine iterations a prefill of ``tokens`` (all engines' prompts) takes: each engine's share in chunks of
        at most ``max_batched_tokens`` (vLLM's scheduler caps an iteration's tokens whether or not it chunks its
        prefill: V0 without chunking packs whole prompts into a budgeted prefill batch, chunked prefill and V1 split
        a prompt across iterations; the work is the same tokens and (query, key) pairs either way), each iteration
        reading the weights and launching the layers' kernels once; 1 without a cap."""
        if self.max_batched_tokens <= 0:
            return 1
        engines = self.n_gpus // self.tensor_parallel
        return max(1, math.ceil(tokens / engines / self.max_batched_tokens))

    def _forward_s(self, tokens: float, attended: float, iterations: int = 1) -> float:
        """A forward over ``tokens`` in ``iterations`` equal passes: the larger of their compute and of reading the
        weights once an iteration."""
        m, n = self.model, self.n_gpus
        compute_s = m.forward_flops(tokens / n, attended / n) / self._flops
        return max(iterations * m.weight_bytes / self._bandwidth, compute_s) / self.engine.forward_efficiency

    @property
    def _launch_s(self) -> float:
        """Kernel launches of one pass: a fixed time per layer."""
        return self.model.layers * self.efficiency.layer_overhead_s

    def score_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        """A scoring forward pass: a prefill of the same tokens without the generation engine's weight gather
        (the parameter gathers of scoring and training passes are the framework layer's: bytes over the
        interconnect per micro-batch where it shards the parameters, :class:`oppo.sim.cost.framework.FrameworkCost`)."""
        if tokens <= 0:
            return 0.0
        return self._forward_s(tokens, attended) + self._launch_s

    def train_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        """Forward + backward (3x forward FLOPs) and one optimizer step."""
        if tokens <= 0:
            return 0.0
        m, n = self.model, self.n_gpus
        compute_s = (
            3 * m.forward_flops(tokens / n, attended / n) / (self.gpu.peak_flops * self.efficiency.train_flops_frac)
        )
        optimizer_s = m.params * self.optimizer_bytes_per_param / n / self._bandwidth
        return compute_s + optimizer_s + 3 * self._launch_s  # gathers: the framework layer's, as in score_s

    def sync_s(self) -> float:
        """Weight sync after an update: only an engine with its own weight copy (vLLM) needs one."""
        return self.transfer_s() if self.engine.needs_weight_sync else 0.0

    def transfer_s(self) -> float:
        """Pushing the weights to other devices (a rollout engine on its own GPUs)."""
        return self.model.weight_bytes / self.link_bytes_per_s


def pass_attended(tokens: float, context: float, batch: float) -> float:
    """(query, key) pairs of a causal pass of ``tokens`` new tokens over ``batch`` equal rows that already
    cache ``context`` tokens in all: N * (C/B + N/(2B))."""
    b = max(batch, 1)
    return tokens * (context / b + tokens / (2 * b))
