"""The training backend's settings of a verl run's setup, read from its log (:mod:`oppo.sim.logs.setup_from_log`
drives the reading): FSDP's sharding, offload and reduce precision; Megatron-LM's layout, recompute and offload. Each
function takes the reader (its ``get``, ``take``, ``config`` and ``out``) and records every key with its source."""

from __future__ import annotations

from typing import TYPE_CHECKING

from oppo.sim.cost.framework import FSDP_TRAINERS
from oppo.sim.logs.verl_config import ARA

if TYPE_CHECKING:
    from oppo.sim.logs.setup_from_log import _Reader as Reader

# verl PR #121: the reference's FSDP module always takes CPUOffload(offload_params=True) (before: param_offload
# loaded it once a pass); every unshard, at every forward micro-batch, copies its shard from the host
REFERENCE_CPU_OFFLOAD_FROM = "2025-01-24"
MEGATRON_TP1_FROM = "2025-04-13"  # ppo_megatron_trainer.yaml's tensor_model_parallel_size default: 4, then 1
FP32_NAMES = ("fp32", "float32", "torch.float32", "32")  # a mixed precision dtype of 4 bytes (the others: bf16, fp16)


def fsdp(r: Reader, origin: str) -> None:
    """verl's FSDP workers: remove-padding (else rows padded to the caps), sharding, the gradients' reduce precision,
    parameter and optimizer offload, and the reference's forced CPU offload by the log's date."""
    if not r.take("framework.packed", f"{ARA}.model.use_remove_padding", False, bool):
        prompt, prompt_origin = r.number("data.max_prompt_length", 512)
        pad = prompt + r.out.tables[""]["max_new_tokens"]  # the dataset pads prompts, the rollout responses
        r.out.set("framework.pad_to_tokens", pad, "data.max_prompt_length + data.max_response_length", prompt_origin)
    r.out.set("framework.sharded", True, f"{ARA}.actor.strategy", origin)
    reduce = f"{ARA}.actor.fsdp_config.mixed_precision.reduce_dtype"
    r.take(
        "framework.reduce_bytes_per_param", reduce, "fp32", lambda dtype: 4 if str(dtype).lower() in FP32_NAMES else 2
    )
    offload = {
        "actor": (f"{ARA}.actor.fsdp_config.param_offload",),
        "reference": (f"{ARA}.ref.fsdp_config.param_offload",),
        "critic": ("critic.model.fsdp_config.param_offload",),
    }
    roles = _offloaded(r, offload)
    r.out.set("framework.offload", roles, "*.fsdp_config.param_offload", "config")
    optimizers = {
        role: tuple(k.replace("param_offload", "optimizer_offload") for k in offload[role]) for role in FSDP_TRAINERS
    }
    r.out.set("framework.optimizer_offload", _offloaded(r, optimizers), "*.fsdp_config.optimizer_offload", "config")
    # FSDP's CPU offload (every unshard copies the shard in): verl's reward model with its param_offload at any
    # date, and from PR #121 (2025-01-24) the reference and the reward model whatever their flags say
    dated = r.config.date or "9999"
    recent = dated >= REFERENCE_CPU_OFFLOAD_FROM
    setup = r.out.tables[""]
    copies = ["reference"] if setup["reference"] and recent else []
    if setup.get("reward", "rule") != "rule" and (recent or r.get("reward_model.model.fsdp_config.param_offload")[0]):
        copies.append("reward")
    if copies:
        why = f"FSDP CPUOffload, forced by verl from {REFERENCE_CPU_OFFLOAD_FROM} (the reward model's: or its flag)"
        origin = f"log dated {r.config.date or 'nowhere (taken as recent)'}"
        r.out.set("framework.offload_each_micro_batch", copies, why, origin)
        r.out.set("framework.offload", [*dict.fromkeys([*roles, *copies])], why, origin)


def megatron(r: Reader, origin: str) -> None:
    """verl's Megatron workers (``ppo_megatron_trainer.yaml``; the reference runs the actor's layout): its models
    remove the padding inside (verl's ``...RmPadPP`` models), sequence parallelism and the distributed optimizer
    are on by default."""
    mega = f"{ARA}.actor.megatron"
    r.out.set("framework.train_backend", "megatron", f"{ARA}.actor.strategy", origin)
    tp_default = 4 if (r.config.date or "9999") < MEGATRON_TP1_FROM else 1  # ppo_megatron_trainer.yaml's default
    r.take("framework.train_tensor_parallel", f"{mega}.tensor_model_parallel_size", tp_default, int)
    r.take("framework.train_pipeline_parallel", f"{mega}.pipeline_model_parallel_size", 1, int)
    vpp, vpp_origin = r.number(f"{mega}.virtual_pipeline_model_parallel_size", 1)
    r.out.set("framework.virtual_pipeline", vpp or 1, f"{mega}.virtual_pipeline_model_parallel_size", vpp_origin)
    _megatron_recompute(r)
    r.take("framework.sequence_parallel", f"{mega}.sequence_parallel", True, bool)
    r.take("framework.distributed_optimizer", f"{mega}.use_distributed_optimizer", True, bool)
    r.out.set("framework.packed", True, "verl's Megatron models remove padding inside", "derived")
    offload = {
        "actor": (f"{ARA}.actor.megatron.param_offload",),
        "reference": (f"{ARA}.ref.megatron.param_offload", f"{ARA}.ref.param_offload"),  # the latter: verl of 2025-03
        "critic": ("critic.megatron.param_offload",),
    }
    r.out.set("framework.offload", _offloaded(r, offload), "*.param_offload", "config")


def _megatron_recompute(r: Reader) -> None:
    """Whether Megatron recomputes each layer's activations in full: its TransformerConfig's ``recompute_granularity``
    "full". verl sets it from ``actor.megatron.override_transformer_config.recompute_granularity`` (from 2025-07-22)
    or, under ``enable_gradient_checkpointing``, from ``model.gradient_checkpointing_kwargs
    .activations_checkpoint_granularity``, whose default in ``ppo_megatron_trainer.yaml`` is null (from 2025-04-06;
    before, the Megatron workers ignored the flag): the flag alone recomputes nothing. The GPG run's Megatron twin
    shows it: the flag True, the granularity None, and its workers print ``TransformerConfig(...
    recompute_granularity=None ...)``. "selective" recomputes the core attention alone, a few percent of a layer's
    FLOPs: priced as none. A log that shows no granularity (a launch command alone) takes verl's default, none."""
    override = f"{ARA}.actor.megatron.override_transformer_config.recompute_granularity"
    kwargs = f"{ARA}.model.gradient_checkpointing_kwargs.activations_checkpoint_granularity"
    flag = f"{ARA}.model.enable_gradient_checkpointing"
    r.read.update((override, kwargs, flag))
    enabled = bool(r.config.get(flag, False))
    if r.config.get(override, None) is not None:
        granularity, verl, origin = r.config.get(override), override, r.config.origin[override]
    elif enabled and r.config.has(kwargs):
        granularity, verl, origin = r.config.get(kwargs), f"{flag} with {kwargs}", r.config.origin[kwargs]
    else:
        granularity, verl, origin = None, f"{kwargs} (verl's default, null: nothing recomputed)", "verl default"
    r.out.set("framework.gradient_checkpointing", granularity == "full", verl, origin)


def _offloaded(r: Reader, keys: dict[str, tuple[str, ...]]) -> list[str]:
    """Roles that run and whose parameters the backend keeps on the host (``keys``: role -> its ``param_offload``
    keys, any of which set)."""
    setup = r.out.tables[""]
    runs = {"actor": True, "reference": setup["reference"], "critic": setup["critic"]}
    return [role for role, names in keys.items() if runs[role] and any(r.get(k, False)[0] for k in names)]
