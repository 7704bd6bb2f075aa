"""The framework knobs ``python -m oppo.sim plan --knobs framework`` searches beside the scheduling ones, the memory
they need, and the overrides that set the chosen ones in verl (``best/verl_overrides.txt``).

The knobs verl users ask about most (verl #7601, OpenRLHF #562, TRL #4766): the rollout engine's tensor-parallel
size (``actor_rollout_ref.rollout.tensor_model_parallel_size``), its share of GPU memory
(``rollout.gpu_memory_utilization``), the update's micro-batch (``actor.ppo_micro_batch_size_per_gpu``; the scoring
passes' scaled alike) and, for the asynchronous trainers, the rollout / trainer GPU split (verl's one-step-off and
fully-async recipes: ``rollout.n_gpus_per_node``, ``trainer.n_gpus_per_node``).
"""

from __future__ import annotations

import dataclasses

from oppo.core.config import ScheduleConfig
from oppo.core.policies import policy_spec
from oppo.sim.cost.engine import model_shape
from oppo.sim.cost.framework import ADAM_STATE_BYTES_PER_PARAM
from oppo.sim.setup.presets import Setup

ENGINE_TPS = (1, 2, 4, 8)  # vLLM's tensor-parallel sizes within a node
MEMORY_FRACTIONS = (0.4, 0.5, 0.6, 0.7, 0.8)  # gpu_memory_utilization: the range verl's examples use
MICRO_FACTORS = (0.5, 1.0, 2.0)  # the update's micro-batch, halved and doubled
# Activation bytes per token per layer of a transformer layer's backward in bf16 with flash attention (no s^2
# scores): 34 x hidden (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
# Table 2); with gradient checkpointing a layer keeps only its input (2 x hidden) and recomputes one layer at a time
ACTIVATION_BYTES_PER_HIDDEN = 34
LOGIT_BYTES = 4 * 2  # the LM head's fp32 logits and their gradient, per vocabulary entry per token
ARA = "actor_rollout_ref"
# Mixed-precision Adam under ZeRO-3: bf16 weights and gradients, fp32 master weights and two moments (bytes/param).
TRAINED_BYTES_PER_PARAM = 2 + 2 + 4 + 4 + 4
# Megatron: bf16 weights and fp32 gradients (verl's grad_reduce_in_fp32) on each tensor x pipeline slice; fp32 master
# weights and two moments, over the data-parallel replicas too under the distributed optimizer
MEGATRON_SLICE_BYTES, OPTIMIZER_BYTES = 2 + 4, 4 + 4 + 4


def framework_grid(setup: Setup, rollout_gpus: int | None = None) -> list[dict]:
    """The framework knobs of one configuration: tensor-parallel sizes that divide the generating GPUs and the
    model's attention heads and fit in a node, vLLM's memory shares (where the setup bounds the engine's memory),
    micro-batches around the setup's (where it sets one)."""
    model = model_shape(setup.actor)
    gpus = rollout_gpus or setup.placement.actor_gpus
    tps = [
        t
        for t in ENGINE_TPS
        if gpus % t == 0
        and model.heads % t == 0
        and (model.kv_heads % t == 0 or t % model.kv_heads == 0)
        and t <= setup.cluster.gpus_per_node  # an engine across nodes: its all-reduces' latency is not priced
    ]
    micro = setup.framework.train_micro_batch
    micros = sorted({max(1, round(micro * f)) for f in MICRO_FACTORS}) if micro else [None]
    fractions = MEMORY_FRACTIONS if setup.framework.rollout_memory_fraction else (None,)
    return [{"rollout_tp": t, "memory_fraction": f, "micro_batch": m} for t in tps for f in fractions for m in micros]


def with_framework_knobs(setup: Setup, tp: int | None, fraction: float | None, micro: int | None) -> Setup:
    """``setup`` with the knobs that are set (None: the setup's own)."""
    fw = setup.framework
    changes: dict = {}
    if tp is not None:
        changes["rollout_tensor_parallel"] = tp
    if fraction is not None:
        changes["rollout_memory_fraction"] = fraction
    if micro is not None and fw.train_micro_batch:
        scale = micro / fw.train_micro_batch
        changes["train_micro_batch"] = micro
        changes["forward_micro_batch"] = max(1, round(fw.forward_micro_batch * scale)) if fw.forward_micro_batch else 0
        for key in ("critic_train_micro_batch", "critic_forward_micro_batch"):
            size = getattr(fw, key)
            changes[key] = max(1, round(size * scale)) if size else 0
    return dataclasses.replace(setup, framework=dataclasses.replace(fw, **changes)) if changes else setup


def training_bytes(setup: Setup, roles: list[str], gpus: int) -> float:
    """Per training GPU, the bytes of the trained ``roles``' weights, gradients and Adam states and the reference's
    weights: sharded over the ``gpus`` under FSDP (ZeRO-3; whole on each where the setup does not shard); under
    Megatron each GPU holds its tensor x pipeline slice, the optimizer states split over the replicas too with the
    distributed optimizer. A role the framework offloads keeps only its bf16 weights on the GPUs; an FSDP trainer
    whose optimizer is offloaded, all but Adam's two moments."""
    model, fw = model_shape(setup.actor), setup.framework
    offloaded = set(fw.offload)
    if fw.train_backend == "megatron":
        shards = fw.train_tensor_parallel * fw.train_pipeline_parallel
        trained = model.params * (
            MEGATRON_SLICE_BYTES / shards + OPTIMIZER_BYTES / (gpus if fw.distributed_optimizer else shards)
        )
        held = sum(model.weight_bytes / shards if r in offloaded else trained for r in roles)
        return held + setup.reference * model.weight_bytes / shards

    def fsdp_held(role: str) -> float:
        if role in offloaded:
            return model.weight_bytes
        moments = ADAM_STATE_BYTES_PER_PARAM if role in fw.optimizer_offload else 0
        return model.params * (TRAINED_BYTES_PER_PARAM - moments)

    shards = gpus if fw.sharded else 1  # unsharded (no ZeRO-3): each GPU holds the whole of them
    return (sum(fsdp_held(r) for r in roles) + setup.reference * model.weight_bytes) / shards


def activation_bytes(setup: Setup, schedule: ScheduleConfig) -> float:
    """A screening estimate of an update micro-batch's activations on one GPU (bytes): its rows at prompt + cap
    tokens (or padded to ``pad_to_tokens``), each layer's per-token bytes (all layers' without gradient
    checkpointing; their inputs and one layer's with it) and the LM head's fp32 logits."""
    model = model_shape(setup.actor)
    micro = setup.framework.train_micro_batch or setup.batch * schedule.group_size
    row = setup.lengths.prompt_tokens + schedule.max_new_tokens
    tokens = micro * (row if setup.framework.packed else max(row, setup.framework.pad_to_tokens))
    if setup.framework.gradient_checkpointing:
        per_token = model.layers * 2 * model.hidden + ACTIVATION_BYTES_PER_HIDDEN * model.hidden
    else:
        per_token = model.layers * ACTIVATION_BYTES_PER_HIDDEN * model.hidden
    return tokens * (per_token + LOGIT_BYTES * model.vocab)


def colocated_bytes(setup: Setup, schedule: ScheduleConfig, training: float) -> float:
    """The busiest GPU's memory (bytes) in verl's hybrid engine, the trained models' states (``training``, per GPU)
    resident throughout. While vLLM generates: vLLM >= 0.7 (sleep mode) takes its share of the GPU beside them;
    verl's vLLM 0.6 (``reinit``) sized its KV cache as its share of the memory still free after the states and its
    weights (``worker.py``: ``gpu_memory_utilization`` x free memory), so generation never overflows. While they
    train: a micro-batch's activations beside the engine's weights (freed too in sleep mode; the KV cache is freed
    either way)."""
    fw = setup.framework
    memory = setup.gpu_datasheet().memory_bytes
    weights = model_shape(setup.actor).weight_bytes / fw.rollout_tensor_parallel
    activations = activation_bytes(setup, schedule)
    if fw.kv_cache_reset == "reinit":
        resident = training + weights
        return max(resident + fw.rollout_memory_fraction * max(memory - resident, 0.0), resident + activations)
    idle_engine = 0.0 if fw.kv_cache_reset == "sleep" else weights
    return max(training + fw.rollout_memory_fraction * memory, training + activations + idle_engine)


def verl_overrides(setup: Setup, chosen: Setup, policy: str) -> list[str]:
    """``key=value`` lines, verl's names (the ``_per_gpu`` micro-batch keys of verl since early 2025, each with its
    global twin set to null: verl refuses both), that turn ``setup``'s run into ``chosen``'s: each knob that
    differs, and the GPU split of an asynchronous trainer."""
    before, after = setup.framework, chosen.framework
    lines = []
    if after.rollout_tensor_parallel != before.rollout_tensor_parallel:
        lines.append(f"{ARA}.rollout.tensor_model_parallel_size={after.rollout_tensor_parallel}")
    if after.rollout_memory_fraction != before.rollout_memory_fraction:
        lines.append(f"{ARA}.rollout.gpu_memory_utilization={after.rollout_memory_fraction:g}")
    if after.train_micro_batch != before.train_micro_batch:
        sizes = {f"{ARA}.actor.ppo": after.train_micro_batch}
        if after.forward_micro_batch:
            roles = ("rollout", "ref") if setup.reference else ("rollout",)
            sizes |= {f"{ARA}.{role}.log_prob": after.forward_micro_batch for role in roles}
        if setup.critic:
            sizes["critic.ppo"] = after.critic_train_micro_batch or after.train_micro_batch
            # the values pass: verl's default is the critic's update micro-batch, which this does not always keep
            sizes["critic.forward"] = after.forward_micro_batch_of("critic") or sizes["critic.ppo"]
        for key, size in sizes.items():  # verl refuses a global and a per-GPU size set together
            lines += [f"{key}_micro_batch_size=null", f"{key}_micro_batch_size_per_gpu={size}"]
    if policy_spec(policy).asynchronous:
        rollout = chosen.placement.rollout_for(policy)
        lines += [
            f"trainer.n_gpus_per_node={chosen.placement.actor_gpus - rollout}",
            f"rollout.n_gpus_per_node={rollout}",
        ]
    return lines
