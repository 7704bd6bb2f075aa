"""The framework layer of the cost model: what a real RL framework adds on top of the GPU roofline.

Kept apart from the GPU datasheet (:mod:`oppo.sim.hardware`) and the generation engine. Real frameworks run far
below the roofline (micro-batches of a few sequences, eager decoding, padding, recomputation, offloaded
parameters, weight resharding between the training and the rollout engine); each stage of a step gets

    seconds = roofline / efficiency × (1 + half_efficiency_tokens / micro-batch tokens)
              + units × per_unit_s + tokens × per_token_s + fixed_s   (per step)

The first term is a micro-batched pass whose efficiency grows with the tokens of a micro-batch and reaches half
its best at ``half_efficiency_tokens`` (a model-size-proportional cost per micro-batch: it transfers between
models, a fixed time per micro-batch would not). The unit is a decode iteration for ``gen`` and a micro-batch
for the others; ``per_token_s`` (``gen`` only) charges each generated token: a rollout engine whose KV memory
cannot hold the whole batch runs it in waves, so its time follows the tokens generated rather than the longest
response.
``efficiency``, ``per_unit_s`` and ``fixed_s`` are fitted on a run's own log (``python -m oppo.sim
calibrate-log``) or set by hand in a setup's ``[framework.STAGE]`` tables; the structural settings
(micro-batch sizes, gradient checkpointing, offload) are the run's configuration.

Stages (verl's timing names): ``gen`` (actor prefill and decode), ``old_log_prob`` (actor scoring), ``ref``
(reference scoring), ``values`` (critic forward), ``reward`` (reward model), ``update_actor``, ``update_critic``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# role of the simulator -> (its scoring stage, its update stage)
ROLE_STAGES = {
    "actor": ("old_log_prob", "update_actor"),
    "rollout": ("old_log_prob", "update_actor"),
    "reference": ("ref", None),
    "critic": ("values", "update_critic"),
    "reward": ("reward", None),
}
STAGE_NAMES = ("gen", "old_log_prob", "ref", "values", "reward", "update_actor", "update_critic")


@dataclass(frozen=True)
class StageCost:
    """One stage's framework terms: ``efficiency`` (fraction of the roofline the framework achieves, (0, 1]),
    ``per_unit_s`` (seconds per decode iteration or micro-batch), ``per_token_s`` (seconds per generated token,
    ``gen`` only), ``fixed_s`` (seconds per step)."""

    efficiency: float = 1.0
    half_efficiency_tokens: float = 0.0
    per_unit_s: float = 0.0
    per_token_s: float = 0.0
    fixed_s: float = 0.0

    def __post_init__(self) -> None:
        terms = (self.half_efficiency_tokens, self.per_unit_s, self.per_token_s, self.fixed_s)
        if not 0 < self.efficiency <= 1 or min(terms) < 0:
            raise ValueError("a stage needs 0 < efficiency <= 1 and its other terms >= 0")

    def pass_s(self, roofline_s: float, micro_batch_tokens: float, units: float) -> float:
        """Seconds of a micro-batched pass whose roofline is ``roofline_s``."""
        small = self.half_efficiency_tokens / max(micro_batch_tokens, 1.0)
        return roofline_s / self.efficiency * (1 + small) + units * self.per_unit_s


IDENTITY = StageCost()  # no framework terms: the roofline


@dataclass(frozen=True)
class Framework:
    """A run's framework settings (structural, from its configuration) and fitted stage terms."""

    train_micro_batch: int = 0  # sequences per GPU per forward+backward micro-batch (0: the whole minibatch)
    forward_micro_batch: int = 0  # sequences per GPU per scoring forward micro-batch (0: the whole batch)
    gradient_checkpointing: bool = False  # the backward recomputes the forward: 4 instead of 3 forward FLOPs
    offload: tuple[str, ...] = ()  # roles whose parameters live on the host: one weight transfer per pass
    host_bytes_per_s: float = 25e9  # host <-> device link for offloaded parameters (PCIe 4 x16 ~ 25 GB/s)
    gen: StageCost = StageCost()
    old_log_prob: StageCost = StageCost()
    ref: StageCost = StageCost()
    values: StageCost = StageCost()
    reward: StageCost = StageCost()
    update_actor: StageCost = StageCost()
    update_critic: StageCost = StageCost()

    def __post_init__(self) -> None:
        if self.train_micro_batch < 0 or self.forward_micro_batch < 0 or self.host_bytes_per_s <= 0:
            raise ValueError("framework needs micro-batch sizes >= 0 and host_bytes_per_s > 0")
        unknown = set(self.offload) - set(ROLE_STAGES)
        if unknown:
            raise ValueError(f"framework offload: unknown role(s) {sorted(unknown)}")

    def stage(self, name: str | None) -> StageCost:
        return getattr(self, name) if name else StageCost()


def micro_batches(rows: float, micro_batch: int, n_gpus: int) -> int:
    """Micro-batches of a pass over ``rows`` sequences split over ``n_gpus`` (each GPU runs its share)."""
    if micro_batch <= 0:
        return 1
    return max(1, math.ceil(rows / n_gpus / micro_batch))


@dataclass(frozen=True)
class FrameworkCost:
    """A role's cost model with the framework layer on top of a roofline ``base`` (the same protocol)."""

    base: object  # a RooflineCost (or any cost model with its protocol and ``n_gpus``, ``model``)
    role: str
    framework: Framework

    def _offload_s(self) -> float:
        if self.role not in self.framework.offload:
            return 0.0
        return self.base.model.weight_bytes / self.base.n_gpus / self.framework.host_bytes_per_s

    def decode_s(self, batch, context_tokens):
        """One decode iteration of ``batch`` rows: each generates one token."""
        gen = self.framework.gen
        if gen == IDENTITY:  # the common case (no framework layer): the roofline as it is, no extra array ops
            return self.base.decode_s(batch, context_tokens)
        roofline = np.asarray(self.base.decode_s(batch, context_tokens)) / gen.efficiency
        return roofline + gen.per_unit_s + gen.per_token_s * np.asarray(batch, dtype=float)

    def prefill_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        if self.role in ("actor", "rollout"):  # the prompt prefill of generation
            return self.base.prefill_s(tokens, attended) / self.framework.gen.efficiency
        return self.score_s(tokens, attended, rows)  # a streamed scorer's chunk: one of its forward passes

    def score_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        if tokens <= 0:
            return 0.0
        stage = self.framework.stage(ROLE_STAGES[self.role][0])
        units = micro_batches(rows, self.framework.forward_micro_batch, self.base.n_gpus)
        mb_tokens = tokens / self.base.n_gpus / units
        return stage.pass_s(self.base.score_s(tokens, attended), mb_tokens, units) + self._offload_s()

    def train_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        if tokens <= 0:
            return 0.0
        stage = self.framework.stage(ROLE_STAGES[self.role][1])
        recompute = 4 / 3 if self.framework.gradient_checkpointing else 1.0
        units = micro_batches(rows, self.framework.train_micro_batch, self.base.n_gpus)
        mb_tokens = tokens / self.base.n_gpus / units
        return stage.pass_s(self.base.train_s(tokens, attended) * recompute, mb_tokens, units)

    def sync_s(self) -> float:
        return self.base.sync_s()

    def transfer_s(self) -> float:
        return self.base.transfer_s()

    def fixed_s(self, stages) -> float:
        """Seconds per step of the given stages (weight resharding, cache allocation, ...)."""
        return sum(self.framework.stage(s).fixed_s for s in stages if s)


# TRL's PPOTrainer (1.12) as the paper ran it: its defaults give the structure (local_rollout_forward_batch_size
# 64, per_device_train_batch_size 8, gradient_checkpointing on, 4 PPO epochs in the setup). The efficiency terms
# are TRANSFERRED, not fitted to the paper: those calibrated on the verl Gemma-2 2B run (HF models under FSDP,
# micro-batched forwards and updates like TRL's under ZeRO-3; `python -m oppo.sim calibrate-log --log
# gemma-2-2b-it-ppo-bsz512_4-prompt1024-resp-512-0.640.log.gz --setup verl-gemma-2-2b-gsm8k`), the larger of the
# two logged models; old log-probs and the reward model take the reference's (the same forward). Generation is
# the engine's (HF generate under ZeRO-3, :data:`oppo.sim.hardware.ENGINES`).
TRL = Framework(
    forward_micro_batch=64,
    train_micro_batch=8,
    gradient_checkpointing=True,
    old_log_prob=StageCost(half_efficiency_tokens=4256.0),
    ref=StageCost(half_efficiency_tokens=4256.0),
    values=StageCost(half_efficiency_tokens=3845.0),
    reward=StageCost(half_efficiency_tokens=4256.0),
    update_actor=StageCost(half_efficiency_tokens=3325.0),
    update_critic=StageCost(half_efficiency_tokens=2703.0),
)
FRAMEWORKS = {"roofline": Framework(), "trl": TRL}  # a setup's [framework] table may start from one (base = NAME)
