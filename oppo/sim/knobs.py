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
from oppo.sim.cost.engine import model_shape
from oppo.sim.setups import Setup

ENGINE_TPS = (1, 2, 4, 8)  # vLLM's tensor-parallel sizes within a node
MEMORY_FRACTIONS = (0.4, 0.5, 0.6, 0.7, 0.8)  # gpu_memory_utilization: the range verl's examples use
MICRO_FACTORS = (0.5, 1.0, 2.0)  # the update's micro-batch, halved and doubled
# Activation bytes per token per layer of a transformer layer's backward in bf16 with flash attention (no s^2
# scores): 34 x hidden (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
# Table 2); with gradient checkpointing a layer keeps only its input (2 x hidden) and recomputes one layer at a time
ACTIVATION_BYTES_PER_HIDDEN = 34
LOGIT_BYTES = 4 * 2  # the LM head's fp32 logits and their gradient, per vocabulary entry per token
ARA = "actor_rollout_ref"


def framework_grid(setup: Setup, rollout_gpus: int | None = None) -> list[dict]:
    """The framework knobs of one configuration: tensor-parallel sizes that divide the generating GPUs and the
    model's attention heads, vLLM's memory shares (where the setup bounds the engine's memory), micro-batches
    around the setup's (where it sets one)."""
    model = model_shape(setup.actor)
    gpus = rollout_gpus or setup.placement.actor_gpus
    tps = [
        t
        for t in ENGINE_TPS
        if gpus % t == 0 and model.heads % t == 0 and (model.kv_heads % t == 0 or t % model.kv_heads == 0)
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
        critic = fw.critic_train_micro_batch
        changes["critic_train_micro_batch"] = max(1, round(critic * scale)) if critic else 0
    return dataclasses.replace(setup, framework=dataclasses.replace(fw, **changes)) if changes else setup


def activation_bytes(setup: Setup, schedule: ScheduleConfig) -> float:
    """A screening estimate of an update micro-batch's activations on one GPU (bytes): its rows at prompt + cap
    tokens, each layer's per-token bytes (all layers' without gradient checkpointing; their inputs and one
    layer's with it) and the LM head's fp32 logits."""
    model = model_shape(setup.actor)
    micro = setup.framework.train_micro_batch or setup.batch * schedule.group_size
    tokens = micro * (setup.lengths.prompt_tokens + schedule.max_new_tokens)
    if setup.framework.gradient_checkpointing:
        per_token = model.layers * 2 * model.hidden + ACTIVATION_BYTES_PER_HIDDEN * model.hidden
    else:
        per_token = model.layers * ACTIVATION_BYTES_PER_HIDDEN * model.hidden
    return tokens * (per_token + LOGIT_BYTES * model.vocab)


def colocated_bytes(setup: Setup, schedule: ScheduleConfig, training: float) -> float:
    """The busiest GPU's memory (bytes) in verl's hybrid engine, the trained models' states (``training``, per GPU)
    resident throughout. While vLLM generates: vLLM >= 0.7 (sleep mode) takes its share of the GPU for itself,
    beside them; vLLM <= 0.6 (``reinit``) sized its KV cache as its share of the GPU less everything the process
    had allocated, the states included, so it never holds more than the larger of the two. While they train: a
    micro-batch's activations beside the engine's weights (freed too in sleep mode; the KV cache is freed either
    way)."""
    fw = setup.framework
    share = fw.rollout_memory_fraction * setup.gpu_datasheet().memory_bytes
    weights = model_shape(setup.actor).weight_bytes / fw.rollout_tensor_parallel
    if fw.kv_cache_reset == "reinit":
        return max(share, training + weights, training + activation_bytes(setup, schedule) + weights)
    idle_engine = 0.0 if fw.kv_cache_reset == "sleep" else weights
    return max(training + share, training + activation_bytes(setup, schedule) + idle_engine)


def verl_overrides(setup: Setup, chosen: Setup, policy: str) -> list[str]:
    """``key=value`` lines, verl's names (the ``_per_gpu`` micro-batch keys of verl since early 2025), that turn
    ``setup``'s run into ``chosen``'s: each knob that differs, and the GPU split of an asynchronous trainer."""
    before, after = setup.framework, chosen.framework
    lines = []
    if after.rollout_tensor_parallel != before.rollout_tensor_parallel:
        lines.append(f"{ARA}.rollout.tensor_model_parallel_size={after.rollout_tensor_parallel}")
    if after.rollout_memory_fraction != before.rollout_memory_fraction:
        lines.append(f"{ARA}.rollout.gpu_memory_utilization={after.rollout_memory_fraction:g}")
    if after.train_micro_batch != before.train_micro_batch:
        lines.append(f"{ARA}.actor.ppo_micro_batch_size_per_gpu={after.train_micro_batch}")
        if after.forward_micro_batch:
            lines += [
                f"{ARA}.{role}.log_prob_micro_batch_size_per_gpu={after.forward_micro_batch}"
                for role in ("rollout", "ref")
            ]
        if setup.critic:
            lines.append(
                f"critic.ppo_micro_batch_size_per_gpu={after.critic_train_micro_batch or after.train_micro_batch}"
            )
    if policy == "async":
        rollout = chosen.placement.rollout_for("async")
        lines += [
            f"trainer.n_gpus_per_node={chosen.placement.actor_gpus - rollout}",
            f"rollout.n_gpus_per_node={rollout}",
        ]
    return lines
