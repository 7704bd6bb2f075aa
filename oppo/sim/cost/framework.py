"""The framework layer of the cost model: what a real RL framework adds on top of the GPU roofline.

Kept apart from the GPU (:mod:`oppo.sim.cost.gpu`) and the engine (:mod:`oppo.sim.cost.engine`). Real frameworks run far
below the roofline (micro-batches of a few sequences, eager decoding, padding, recomputation, offloaded
parameters, weight resharding between the training and the rollout engine); each operation of a stage costs
:meth:`StageCost.seconds` of its :class:`StageLoad` (:mod:`oppo.sim.cost.stage`: the formula and its terms).

``python -m oppo.sim calibrate-log`` fits, on a run's own log, ``efficiency``, ``per_token_s`` and ``fixed_s``
of ``gen`` and ``efficiency`` and ``half_efficiency_tokens`` of the other stages, and where a stage gathers
sharded parameters its two gather terms; across several logs (or a family's stages of one, where they tell it)
also ``per_unit_s`` and ``exposed_host_frac`` (a prior of 1, the sum, where no run's passes wait on the host); the
forward passes share one set of terms and the training passes another (:data:`oppo.sim.cost.fit.SHARED_TERMS`);
any term can be set by hand in a setup's ``[framework.STAGE]`` tables; the structural settings (micro-batch
sizes, gradient checkpointing, offload) are the run's configuration.

The cost stack (:mod:`oppo.sim.cost`): GPU -> engine -> this layer -> its fitted terms (:mod:`oppo.sim.cost.fit`,
fed by :mod:`oppo.sim.logs.fit`'s replays of logs; ``oppo/data/framework/verl-shared.toml`` holds the layer fitted
across the shared runs).

Stages (verl's timing names): ``gen`` (actor prefill and decode), ``old_log_prob`` (actor scoring), ``ref``
(reference scoring), ``values`` (critic forward), ``reward`` (reward model), ``update_actor``, ``update_critic``,
``weight_sync`` (the weights pushed to a rollout engine on GPUs of its own; verl's ``sync_rollout_weights``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oppo.data import data_dir, read_toml
from oppo.sim.cost.span import Calibration
from oppo.sim.cost.stage import IDENTITY, StageCost, StageLoad

# verl's FSDP workers load the trainers in float32 (fsdp_config.model_dtype: default fp32 for the actor and the
# critic, bf16 for the reference; mixed precision casts them for compute): the reshard gathers the actor's whole
# (DTensor.full_tensor() of the state dict's shards) before vLLM casts them, and an offloaded trainer moves its
# float32 shard to and from the host (verl/workers/fsdp_workers.py and sharding_manager/fsdp_vllm.py, June 2025)
FSDP_TRAINER_BYTES_PER_PARAM = 4
FSDP_TRAINERS = ("actor", "critic")
# Adam's two moments per float32 parameter (exp_avg, exp_avg_sq): what an FSDP trainer with optimizer_offload copies
# in before each update and back out after (verl's load_fsdp_optimizer / offload_fsdp_optimizer)
ADAM_STATE_BYTES_PER_PARAM = 8
# role of the simulator -> (its scoring stage, its update stage)
ROLE_STAGES = {
    "actor": ("old_log_prob", "update_actor"),
    "rollout": ("old_log_prob", "update_actor"),
    "reference": ("ref", None),
    "critic": ("values", "update_critic"),
    "reward": ("reward", None),
}


KV_CACHE_RESETS = ("none", "reinit", "sleep")
ROLLOUT_SCHEDULERS = ("v0", "v1", "unknown")
CHUNKED_PREFILL = ("on", "off", "unknown")
ENGINE_UNSTATED_KEYS = ("decode_cuda_graphs", "kv_cache_reset")  # priced engine keys a log may leave unstated
TRAIN_BACKENDS = ("fsdp", "megatron")


@dataclass(frozen=True)
class Framework:
    """A run's framework settings (structural, from its configuration) and fitted stage terms."""

    train_micro_batch: int = 0  # sequences per GPU per forward+backward micro-batch (0: the whole minibatch)
    critic_train_micro_batch: int = 0  # the critic's, where it differs (0: train_micro_batch)
    forward_micro_batch: int = 0  # sequences per GPU per scoring forward micro-batch (0: the whole batch)
    # the critic's values pass, where it differs (0: forward_micro_batch): verl's critic.forward_micro_batch_size,
    # which defaults to the critic's ppo_micro_batch_size (before 2025-01-02 the values pass used that one)
    critic_forward_micro_batch: int = 0
    gradient_checkpointing: bool = False  # the backward recomputes the forward: 4 instead of 3 forward FLOPs
    # FSDP / ZeRO-3: each GPU holds 1/n of the parameters and all-gathers them for every micro-batch's forward
    # (and again for its backward, then reduce-scatters the gradients): bytes over the interconnect (False: the
    # gathers, if any, are inside the fitted terms)
    sharded: bool = False
    # Megatron-LM training (train_backend = "megatron"): each layer's matrices split over train_tensor_parallel
    # GPUs (two all-reduces of a layer's activations per forward, two per backward), the layers over
    # train_pipeline_parallel stages of virtual_pipeline chunks each (a pass of m micro-batches idles
    # (p - 1) / (v m) of its compute while the pipeline fills and drains), the remaining GPUs data-parallel replicas
    # whose gradients are all-reduced once per optimizer step. sequence_parallel and distributed_optimizer move the
    # same bytes (an all-gather and a reduce-scatter for each all-reduce) and save memory, which is not modelled.
    train_backend: str = "fsdp"
    train_tensor_parallel: int = 1
    train_pipeline_parallel: int = 1
    virtual_pipeline: int = 1
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    packed: bool = True  # remove-padding: passes compute real tokens (False: every row padded to the longest)
    # without remove-padding, rows padded to this many tokens at least (0: to the longest row): verl before
    # use_remove_padding (2024) padded every prompt to max_prompt_length and every response to max_response_length
    pad_to_tokens: int = 0
    # bytes of a gradient in FSDP's reduce-scatter (its mixed precision reduce_dtype): verl's default is fp32, 4;
    # DeepSpeed ZeRO-3 reduces in the model's dtype, bf16, 2 (verl/workers/fsdp_workers.py: reduce_dtype "fp32")
    reduce_bytes_per_param: int = 2
    offload: tuple[str, ...] = ()  # roles whose parameters live on the host: copied in before each pass and back after
    # ... of which FSDP copies the shard in before each gather (its CPUOffload: verl's reference and reward model from
    # PR #121, 2025-01-24), prefetched with the gathers at the host link's share (StageLoad.host_copy_s), not loaded
    # once a pass (a role not in offload: no effect; Megatron's workers load once a pass whatever this says)
    offload_each_micro_batch: tuple[str, ...] = ()
    # FSDP trainers (actor, critic) whose optimizer state lives on the host: Adam's moments copied in before each
    # update and back out after, over the host link (Megatron's optimizer offload is not modelled)
    optimizer_offload: tuple[str, ...] = ()
    host_bytes_per_s: float = 0.0  # host <-> device link per direction (0: the GPU's datasheet, GPU.host_bytes_per_s)
    # the rollout engine (:class:`oppo.sim.cost.engine.RooflineCost` reads them for generation)
    decode_cuda_graphs: bool = False  # False: eager, every layer's kernels launched each decode iteration
    rollout_tensor_parallel: int = 1  # GPUs per rollout engine (weights and KV cache split over them)
    rollout_memory_fraction: float = 0.0  # the engine's share of GPU memory, weights + KV (0: KV unbounded)
    # What the colocated rollout engine pays each step besides decoding (priced by FrameworkCost.step_load):
    # weight_reshard: the trainer's sharded parameters gathered and loaded into the engine (verl's hybrid engine);
    # kv_cache_reset: "none", "reinit" (vLLM <= 0.6 with free_cache_engine: the KV cache freed after generation and
    # re-allocated and initialised before the next, seconds fitted) or "sleep" (vLLM >= 0.7 sleep mode, level 1:
    # the weights offloaded to the host after generation and reloaded before the next, the KV cache discarded)
    weight_reshard: bool = False
    kv_cache_reset: str = "none"
    # What the run's rollout engine was, as its log shows it (docs/simulator.md, "The rollout engine's version"):
    # rollout_scheduler, vLLM's engine generation ("v0": vLLM <= 0.7's default; "v1": vLLM >= 0.8's, always chunking
    # its prefill); chunked_prefill, vLLM's enable_chunked_prefill ("on", "off"); both "unknown" where the log does not
    # say (not priced: the step's work is the same, see RooflineCost.prefill_s). max_num_batched_tokens caps the
    # tokens an engine iteration computes (0: not stated, the prompts' prefill priced as one pass). engine_unstated:
    # the priced engine keys (ENGINE_UNSTATED_KEYS) the log does not state: priced at the value given (an assumption
    # the setup's comment names) and recorded as "unknown" in a calibration's span (oppo/sim/logs/trust.py)
    rollout_scheduler: str = "unknown"
    chunked_prefill: str = "unknown"
    max_num_batched_tokens: int = 0
    engine_unstated: tuple[str, ...] = ()
    calibration: Calibration = Calibration()  # what the stage terms below were fitted on (none: not fitted)
    gen: StageCost = StageCost()
    old_log_prob: StageCost = StageCost()
    ref: StageCost = StageCost()
    values: StageCost = StageCost()
    reward: StageCost = StageCost()  # with a rule reward: a CPU stage, per_unit_s per sequence scored + fixed_s
    update_actor: StageCost = StageCost()
    update_critic: StageCost = StageCost()
    # the trainer's weights pushed to a rollout engine on GPUs of its own (verl's asynchronous trainers time it:
    # sync_rollout_weights, param_sync): the nominal link's seconds over gather_bandwidth_frac, its achieved share
    weight_sync: StageCost = StageCost()

    def __post_init__(self) -> None:
        micro = (
            self.train_micro_batch,
            self.critic_train_micro_batch,
            self.forward_micro_batch,
            self.critic_forward_micro_batch,
        )
        if min(*micro, self.pad_to_tokens, self.host_bytes_per_s) < 0 or self.reduce_bytes_per_param < 1:
            raise ValueError(
                "framework needs micro-batch sizes >= 0, host_bytes_per_s >= 0, reduce_bytes_per_param >= 1"
            )
        if self.rollout_tensor_parallel < 1 or not 0 <= self.rollout_memory_fraction <= 1:
            raise ValueError("framework needs rollout_tensor_parallel >= 1 and 0 <= rollout_memory_fraction <= 1")
        if self.train_backend not in TRAIN_BACKENDS:
            raise ValueError(f"framework train_backend must be one of {', '.join(TRAIN_BACKENDS)}")
        if min(self.train_tensor_parallel, self.train_pipeline_parallel, self.virtual_pipeline) < 1:
            raise ValueError("framework needs train_tensor_parallel, train_pipeline_parallel, virtual_pipeline >= 1")
        if self.train_backend == "megatron" and self.sharded:
            raise ValueError('framework sharded (FSDP\'s gathers) is for train_backend = "fsdp", not "megatron"')
        if self.kv_cache_reset not in KV_CACHE_RESETS:
            raise ValueError(f"framework kv_cache_reset must be one of {', '.join(KV_CACHE_RESETS)}")
        if self.rollout_scheduler not in ROLLOUT_SCHEDULERS:
            raise ValueError(f"framework rollout_scheduler must be one of {', '.join(ROLLOUT_SCHEDULERS)}")
        if self.chunked_prefill not in CHUNKED_PREFILL:
            raise ValueError(f"framework chunked_prefill must be one of {', '.join(CHUNKED_PREFILL)}")
        if self.max_num_batched_tokens < 0:
            raise ValueError("framework max_num_batched_tokens must be >= 0 (0: not stated)")
        if set(self.engine_unstated) - set(ENGINE_UNSTATED_KEYS):
            raise ValueError(f"framework engine_unstated: keys of {', '.join(ENGINE_UNSTATED_KEYS)} only")
        unknown = set(self.offload) - set(ROLE_STAGES)
        if unknown:
            raise ValueError(f"framework offload: unknown role(s) {sorted(unknown)}")
        unknown = set(self.offload_each_micro_batch) - set(ROLE_STAGES)
        if unknown:
            raise ValueError(f"framework offload_each_micro_batch: unknown role(s) {sorted(unknown)}")
        if set(self.offload_each_micro_batch) & set(FSDP_TRAINERS):  # verl wraps its scorers so, never its trainers
            raise ValueError("framework offload_each_micro_batch: FSDP's CPU offload of the reference or reward model")
        if set(self.optimizer_offload) - set(FSDP_TRAINERS) or (
            self.optimizer_offload and self.train_backend != "fsdp"
        ):
            raise ValueError(f"framework optimizer_offload: FSDP trainers only ({', '.join(FSDP_TRAINERS)})")
        if self.gen.exposed_host_frac < 1:  # its iterations fall on both sides of the kink within a step
            raise ValueError("framework gen: exposed_host_frac must be 1 (decode's host time is summed)")

    def stage(self, name: str | None) -> StageCost:
        return getattr(self, name) if name else StageCost()

    def pass_tokens(self, lengths: np.ndarray) -> float:
        """Tokens a scoring or training pass over sequences of ``lengths`` computes: their own (packed), or every
        row padded to the longest (or to ``pad_to_tokens``, where larger)."""
        if self.packed or not len(lengths):
            return float(lengths.sum())
        return float(len(lengths) * max(lengths.max(), self.pad_to_tokens))

    def train_micro_batch_of(self, role: str) -> int:
        if role == "critic" and self.critic_train_micro_batch:
            return self.critic_train_micro_batch
        return self.train_micro_batch

    def forward_micro_batch_of(self, role: str) -> int:
        if role == "critic" and self.critic_forward_micro_batch:
            return self.critic_forward_micro_batch
        return self.forward_micro_batch

    def with_reward(self, rule: bool) -> Framework:
        """This layer with the reward terms of a rule (CPU time per sequence scored: the term fitted across the
        shared runs, none where no run times one) or of a reward model (a forward pass, as the reference's)."""
        return dataclasses.replace(self, reward=shared_layer().get("reward", IDENTITY) if rule else self.ref)


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
    collective_bytes_per_s: float = 0.0  # the link a collective over the role's GPUs runs on (0: no collective)
    tensor_bytes_per_s: float = 0.0  # the link of Megatron's tensor-parallel groups (0: none)
    pipeline_bytes_per_s: float = 0.0  # the link of Megatron's pipeline groups, stage to stage (0: none)

    def _gather_s(self) -> float:
        """One all-gather of the sharded parameters (a reduce-scatter of the gradients moves the same times
        ``reduce_bytes_per_param`` over the parameters' bytes): each GPU receives the (n - 1) / n of the weights it
        does not hold over the collective's link (ring), in seconds."""
        return self._gather_bytes_s(self.base.model.weight_bytes) if self.framework.sharded else 0.0

    def _offload_s(self) -> float:
        """One host-to-GPU transfer of the role's offloaded parameters: each GPU's share (FSDP: 1 / n of them;
        Megatron: its tensor x pipeline slice)."""
        fw = self.framework
        if self.role not in fw.offload:
            return 0.0
        return self._held_bytes() / self._shards / self._host_link

    @property
    def _shards(self) -> int:
        """Over how many GPUs a role's parameters and optimizer state are split: FSDP's n where it shards (else
        each GPU holds them whole), Megatron's tensor x pipeline slice."""
        fw = self.framework
        if fw.train_backend == "megatron":
            return fw.train_tensor_parallel * fw.train_pipeline_parallel
        return self.base.n_gpus if fw.sharded else 1

    @property
    def _host_link(self) -> float:
        """The host <-> GPU link per direction, bytes/s: the setup's, else the GPU's datasheet."""
        return self.framework.host_bytes_per_s or self.base.gpu.host_link_bytes_per_s

    def _round_trip_s(self) -> float:
        """An offloaded role's parameters loaded for one call of its worker and offloaded after it: copied in and
        back out over the host link (verl's ``load_fsdp_model_to_gpu`` / ``offload_fsdp_model_to_cpu`` and
        Megatron's alike, inside the stage's timer). None for a role FSDP's CPU offload copies in at every gather
        (``offload_each_micro_batch``; Megatron ignores it): its parameters stay on the host."""
        fw = self.framework
        copied = fw.train_backend == "fsdp" and self.role in fw.offload_each_micro_batch
        return 0.0 if copied else 2 * self._offload_s()

    def _optimizer_round_trip_s(self) -> float:
        """An FSDP trainer's optimizer state on the host: each GPU's shard of Adam's moments copied in before an
        update and back out after (0 where the role keeps it on its GPUs)."""
        fw = self.framework
        if self.role not in fw.optimizer_offload:
            return 0.0
        return 2 * self.base.model.params * ADAM_STATE_BYTES_PER_PARAM / self._shards / self._host_link

    def _held_bytes(self) -> float:
        """The role's parameters in bytes as its training framework holds them: an FSDP trainer's in float32
        (:data:`FSDP_TRAINER_BYTES_PER_PARAM`), every other role's (and Megatron's) in the model's dtype."""
        model = self.base.model
        fsdp_trainer = self.framework.train_backend == "fsdp" and self.role in FSDP_TRAINERS
        return model.params * FSDP_TRAINER_BYTES_PER_PARAM if fsdp_trainer else model.weight_bytes

    def decode_s(self, batch, context_tokens):
        """One decode iteration of ``batch`` rows (every row the role's engines compute): each generates one token.
        The per-row term is charged on one engine's share: the role's engines (its GPUs over the tensor-parallel
        degree) decode their rows side by side."""
        gen = self.framework.gen
        if gen == IDENTITY:  # the common case (no framework layer): the roofline as it is, no extra array ops
            return self.base.decode_s(batch, context_tokens)
        roofline = np.asarray(self.base.decode_s(batch, context_tokens))
        engines = self.base.n_gpus // self._engine_tp
        rows = np.asarray(batch, dtype=float) / engines
        return gen.seconds(StageLoad(roofline_s=roofline, units=1.0, row_tokens=rows))

    def prefill_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        if self.role in ("actor", "rollout"):  # the prompt prefill of generation
            return self.framework.gen.seconds(StageLoad(roofline_s=self.base.prefill_s(tokens, attended)))
        return self.score_s(tokens, attended, rows)  # a streamed scorer's chunk: one of its forward passes

    def score_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        if tokens <= 0:
            return 0.0
        stage = self.framework.stage(ROLE_STAGES[self.role][0])
        roofline = self.base.score_s(tokens, attended)
        micro_batch = self.framework.forward_micro_batch_of(self.role)
        if self.framework.train_backend == "megatron":  # a forward: two all-reduces per layer, no gradients
            megatron = dict(allreduces=2, gradients=False, host_s=self._round_trip_s())
            return stage.seconds(self._megatron_load(roofline, tokens, rows, micro_batch, **megatron))
        # with any copies at its gathers
        load = self._pass_load(roofline, tokens, rows, micro_batch, gathers=1, host_s=self._round_trip_s())
        return stage.seconds(load)

    def train_s(self, tokens: float, attended: float, rows: float = 1) -> float:
        if tokens <= 0:
            return 0.0
        stage = self.framework.stage(ROLE_STAGES[self.role][1])
        recompute = 4 / 3 if self.framework.gradient_checkpointing else 1.0
        roofline = self.base.train_s(tokens, attended) * recompute
        micro_batch = self.framework.train_micro_batch_of(self.role)
        if self.framework.train_backend == "megatron":  # forward, backward and the recomputed forward: 2 each
            allreduces = 4 + 2 * self.framework.gradient_checkpointing
            return stage.seconds(self._megatron_load(roofline, tokens, rows, micro_batch, allreduces, gradients=True))
        # sharded: a gather for the forward, one for the backward (the recompute of checkpointing runs inside the
        # backward on the gathered layer), a reduce-scatter of the gradients (in reduce_dtype: fp32 moves twice the
        # bf16 parameters' bytes)
        reduce = self.framework.reduce_bytes_per_param / self.base.model.bytes_per_param
        return stage.seconds(self._pass_load(roofline, tokens, rows, micro_batch, gathers=2 + reduce))

    def update_host_s(self) -> float:
        """Seconds a trainer's update pays once a step besides its passes: an offloaded trainer's parameters, and
        its optimizer state where that is offloaded, copied in from the host before the update call and back out
        after (verl's workers load them around ``update_policy``, every epoch and mini-batch of the step inside), at
        the update's share of the host link."""
        update = ROLE_STAGES[self.role][1]
        if update is None:  # a role that does not train
            return 0.0
        return self.framework.stage(update).seconds(
            StageLoad(host_s=self._round_trip_s() + self._optimizer_round_trip_s())
        )

    def _pass_load(
        self, roofline_s: float, tokens: float, rows: float, micro_batch: int, gathers: float, host_s: float = 0.0
    ) -> StageLoad:
        """A pass over ``rows`` sequences of ``tokens`` in all, split over the GPUs in micro-batches, each moving
        ``gathers`` times the sharded parameters over the interconnect (seconds at the nominal link); a role whose
        parameters FSDP offloads to the host copies its shard in over the host link before each gather; ``host_s``,
        an offloaded role's load around the call (:meth:`_round_trip_s`)."""
        units = micro_batches(rows, micro_batch, self.base.n_gpus)
        mb_tokens = tokens / self.base.n_gpus / units
        gather_s = units * gathers * self._gather_s()
        copied = self.role in self.framework.offload_each_micro_batch
        host_copy_s = units * gathers * self._offload_s() if copied else 0.0
        small_s = roofline_s / max(mb_tokens, 1.0)
        return StageLoad(
            roofline_s, small_s=small_s, units=units, gather_s=gather_s, host_copy_s=host_copy_s, host_s=host_s
        )

    def _megatron_load(
        self,
        roofline_s: float,
        tokens: float,
        rows: float,
        micro_batch: int,
        allreduces: int,
        gradients: bool,
        host_s: float = 0.0,
    ) -> StageLoad:
        """A Megatron pass over ``rows`` sequences of ``tokens`` in all: each data-parallel replica (t x p GPUs)
        runs its share in micro-batches through the pipeline; ``allreduces`` all-reduces of each layer's
        activations (``tokens`` x hidden, bf16, ring: 2 (t - 1) / t of them per GPU over the tensor-parallel link)
        on a GPU's layers / p; with ``gradients``, the reduction of a GPU's 1 / (t p) of the gradients over the d
        replicas, in fp32 (below). No micro-batch term (``small_s``, ``half_efficiency_tokens``): fitted on FSDP's
        runs, it made both Megatron logs' updates slower than they ran (the same job's twin 28% with it, 22% without,
        the 16-GPU excerpt 67% and 64%; docs/simulator.md); Megatron keeps a GPU's weights resident and accumulates
        its gradients in place, reduced once per optimizer step (below), and no log here tells a per micro-batch cost
        in proportion to the model apart from its efficiency. The host's time per micro-batch: below.

        Sequence parallel replaces each all-reduce by a reduce-scatter and an all-gather, (t - 1) / t each: the same
        bytes (its backward's second all-gather of a column-parallel layer's input runs beside the input gradient's
        matrix product, Megatron's async pattern, and is not charged). The pipeline (Megatron's 1F1B, interleaved
        over v chunks a stage: Narayanan et al. 2021) idles (p - 1) / (v m + p - 1) of a pass of m micro-batches
        while it fills and drains, so the pass takes its compute times (v m + p - 1) / (v m); each micro-batch
        crosses the stage boundaries of its v chunks a stage, sending a GPU's 1 / t of its activations (Megatron's
        scatter-gather across the tensor-parallel group) over the pipeline's link, and with ``gradients`` their
        gradients back: priced serial (an upper bound: interleaving overlaps some of them)."""
        fw, model = self.framework, self.base.model
        t, p, v = fw.train_tensor_parallel, fw.train_pipeline_parallel, fw.virtual_pipeline
        replicas = max(1, self.base.n_gpus // (t * p))
        units = micro_batches(rows, micro_batch, replicas)
        compute = roofline_s * (v * units + p - 1) / (v * units)  # the pipeline's fill and drain
        serial = 0.0
        activations = tokens / replicas * model.hidden * model.bytes_per_param  # a replica's, every micro-batch
        if t > 1 and self.tensor_bytes_per_s > 0:
            serial += allreduces * model.layers / p * activations * 2 * (t - 1) / t / self.tensor_bytes_per_s
        if p > 1 and self.pipeline_bytes_per_s > 0:  # v boundaries a stage's GPU sends across, each direction
            serial += (1 + gradients) * v * activations / t / self.pipeline_bytes_per_s
        if gradients and replicas > 1 and self.collective_bytes_per_s > 0:
            # verl builds Megatron's DDP with grad_reduce_in_fp32: a ring all-reduce of fp32 gradients moves
            # 2 (d - 1) / d x 4 bytes a parameter; the distributed optimizer reduce-scatters them ((d - 1) / d x 4)
            # and all-gathers the updated bf16 parameters ((d - 1) / d x 2)
            per_param = 6 if fw.distributed_optimizer else 8
            serial += model.params / (t * p) * per_param * (replicas - 1) / replicas / self.collective_bytes_per_s
        # The host's time per micro-batch counts each micro-batch whole, as an FSDP one (verl's loop over them: its
        # slicing, packing and log-probs on every stage). Tried against counting 1 / p of one (a GPU's share of the
        # layers) for both passes or for the update alone: whole gives the least leave-one-group-out error over the
        # seven shared runs (docs/simulator.md, "Megatron training")
        return StageLoad(compute, units=units, serial_s=serial, host_s=host_s)

    def sync_s(self) -> float:
        return self.base.sync_s()

    def transfer_s(self) -> float:
        """The weights pushed to a rollout engine on GPUs of its own: the engine layer's seconds at the nominal link,
        over the achieved share ``weight_sync`` fits (a prior of 1, never a floor)."""
        return self.framework.weight_sync.seconds(StageLoad(gather_s=self.base.transfer_s(), steps=1.0))

    def fixed_s(self, stages) -> float:
        """Seconds per step of the given stages (the rollout engine's declared moves and resets, other fixed
        costs)."""
        return sum(self.framework.stage(s).seconds(self.step_load(s)) for s in stages if s)

    def step_load(self, stage: str) -> StageLoad:
        """What a stage pays once per step: ``steps`` (its ``fixed_s``) and, for generation, the rollout engine's
        declared per-step costs: a KV-cache re-initialisation, and its weight moves in seconds at the nominal links
        (a reshard gathers the (n - 1) / n of the weights each GPU lacks over the collective's link and writes its
        1 / t of them into the engine, read and written over HBM, and its software takes a time per layer: each
        tensor gathered whole and loaded by a call of its own; sleep mode moves its 1 / t to the host and back over
        the host link). A rollout engine on GPUs of its own pays neither: the trainer pushes it the weights
        (:meth:`transfer_s`) and it keeps its KV cache."""
        if stage != "gen" or self.role == "rollout":  # an engine on its own GPUs: the weight push, no reshard
            return StageLoad(steps=1.0)
        fw = self.framework
        return StageLoad(
            steps=1.0,
            reinit_steps=float(fw.kv_cache_reset == "reinit"),
            reshard_s=self.reshard_s(),
            reshard_layers=float(self.base.model.layers) if fw.weight_reshard else 0.0,
            transfer_s=self._sleep_s() + self._reshard_copies_s(),
        )

    def _sleep_s(self) -> float:
        """Sleep mode's moves of the engine's weights (its 1 / t) to the host after generation and back before the
        next, at the host link (0 without sleep mode)."""
        if self.framework.kv_cache_reset != "sleep":
            return 0.0
        return 2 * self.base.model.weight_bytes / self._engine_tp / self._host_link

    def _reshard_copies_s(self) -> float:
        """An offloaded actor's parameters copied in from the host before the reshard and back out after, at the
        host link (verl's sharding managers do it inside their reshard timer); 0 where there is no reshard."""
        return self._round_trip_s() if self.framework.weight_reshard else 0.0

    def reshard_host_s(self) -> float:
        """The host-link seconds verl's reshard timer holds, at the nominal link: sleep mode's wake-up (the copy
        back, half its moves; the sleep after generation is outside it) and an offloaded actor's round trip."""
        return self._sleep_s() / 2 + self._reshard_copies_s()

    @property
    def _engine_tp(self) -> int:
        return getattr(self.base, "tensor_parallel", 1)

    def reshard_s(self) -> float:
        """Seconds of one reshard into the rollout engine at the nominal links (0 where the setup declares none):
        the trainer's parameters gathered whole (FSDP's in float32, :data:`FSDP_TRAINER_BYTES_PER_PARAM`) and the
        engine's 1 / t of the weights written, read and written over HBM (an offloaded actor's copies from the host:
        the host link's, :meth:`reshard_host_s`)."""
        if not self.framework.weight_reshard:
            return 0.0
        model = self.base.model
        moved = 2 * model.weight_bytes / self._engine_tp / self.base.gpu.hbm_bytes_per_s
        return self._gather_bytes_s(self._held_bytes()) + moved

    def _gather_bytes_s(self, weights: float) -> float:
        """Seconds to all-gather ``weights`` bytes sharded over the role's GPUs at the collective's link."""
        n = self.base.n_gpus
        if n == 1 or self.collective_bytes_per_s <= 0:
            return 0.0
        return weights * (n - 1) / n / self.collective_bytes_per_s


STAGES = tuple(f.name for f in dataclasses.fields(Framework) if f.type in ("StageCost", StageCost))
STAGE_TERMS = tuple(f.name for f in dataclasses.fields(StageCost))
SHARED_LAYER = data_dir() / "framework" / "verl-shared.toml"  # fitted across the shared verl runs (its header)


def read_layer(path: Path) -> dict[str, dict]:
    """The stage tables of a ``framework.toml`` (what ``calibrate-log`` with several logs writes; a setup's
    ``[framework] base = PATH`` takes it), each a dict of :class:`StageCost` terms."""
    layer = read_toml(path, "framework layer")
    unknown = [k for k, v in layer.items() if k not in (*STAGES, "calibration") or not isinstance(v, dict)]
    if unknown:
        raise ValueError(f"{path}: {unknown[0]!r} is no stage table; a framework layer has [{'], ['.join(STAGES)}]")
    return layer


@functools.cache
def shared_layer() -> dict[str, StageCost]:
    """The stage terms fitted across the shared verl runs (``oppo/data/framework/verl-shared.toml``, whose
    header says which logs and which command)."""
    return {stage: StageCost(**terms) for stage, terms in read_layer(SHARED_LAYER).items() if stage in STAGES}


def trl_layer(rule_reward: bool = False) -> Framework:
    """TRL's PPOTrainer (1.12) as the paper ran it. Its defaults give the structure: scoring forwards in
    micro-batches of ``local_rollout_forward_batch_size`` = 64, updates of ``per_device_train_batch_size`` = 8,
    ``gradient_checkpointing`` on (4 PPO epochs in the setup), parameters sharded (ZeRO-3: gathered over the
    interconnect per micro-batch, as bytes). Its scoring and update stages take the terms of the layer fitted
    across the shared verl runs (:func:`shared_layer`: HF models under FSDP, whose gathers the fit charged as
    bytes too, micro-batched forwards and updates like TRL's under ZeRO-3); a reward model's
    forward takes the reference's terms (the same pass). Generation keeps the HF engine's own declared terms
    (:data:`oppo.sim.cost.engine.ENGINES`): the shared runs decode with vLLM, TRL with HF ``generate``. With a rule
    reward, the layer's per-sequence reward term (0 where no shared run times one)."""
    layer = shared_layer()
    scoring = {s: layer[s] for s in ("old_log_prob", "ref", "values", "update_actor", "update_critic")}
    structure = dict(forward_micro_batch=64, train_micro_batch=8, gradient_checkpointing=True, sharded=True)
    return Framework(**structure, **scoring).with_reward(rule_reward)


TRL = trl_layer()
FRAMEWORKS = {"roofline": Framework(), "trl": TRL}  # a setup's [framework] table may start from one (base = NAME)
