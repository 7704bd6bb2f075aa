"""Simulated setups: hardware, models, placement and workload. Presets are functions; TOML files override.

A TOML setup names a preset to start from (``base``) and overrides fields by section::

    base = "paper-7b-h200"
    name = "my-7b"
    gpu = "h100"
    [placement]
    actor_gpus = 6
    reward_gpus = 2
    [lengths]
    median_tokens = 400
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oppo.catalog.gpus import GPU
from oppo.catalog.shapes import SCORE_HEAD_ROLES
from oppo.core.config import ScheduleConfig, schedule_from
from oppo.core.policies import policy_spec
from oppo.records.metrics import device_count
from oppo.sim.cost.engine import ENGINES, CostModel, RooflineCost, model_shape
from oppo.sim.cost.framework import (
    TRL,
    Framework,
    FrameworkCost,
    trl_layer,
)
from oppo.sim.cost.gpu import GPUS, PROFILE_DIR, Cluster, Efficiency, gpu_efficiencies, lookup, megatron_groups
from oppo.sim.workload import LengthModel, RewardCurve

PLACEMENTS = ("disaggregated", "colocated")
# GPUs a placement may have: beyond any cluster a setup describes, and the cost model walks its GPUs one by one (a
# setup of 2**40 GPUs would never finish building its costs)
MAX_GPUS = 1 << 17
UNKNOWN_GPU = "unknown"  # a setup's gpu when its log does not name it: read back from the log (oppo.sim.logs.device)


@dataclass(frozen=True)
class GpuSpec(GPU):
    """A GPU the catalog (:mod:`oppo.catalog.gpus`) does not have, as a setup's ``[gpu_spec]`` table: the catalog's
    fields (bytes/s, FLOP/s, bytes) and ``source``, where its figures come from (for a ``gpu = "unknown"`` setup,
    written by ``calibrate-log``: the peak read back from the log, the rest priors); ``efficiency_of``, the catalog
    GPU whose fitted efficiencies (``cost = "fitted"``) the device takes ("": none; ``cost = "analytic"``);
    ``link_read_from``, the training backend whose passes the intra-node link was read back from ("fsdp": its
    parameters' gathers; "": the link is a prior) and ``prior_link_bytes_per_s``, the link it replaced: a link read
    from one backend's collectives is a property of that run's setup, so a setup training with another backend on
    this device takes the prior (:meth:`Setup.gpu_datasheet`), as no second signal (that backend's own collectives'
    seconds) agrees with it."""

    source: str = ""
    efficiency_of: str = ""
    link_read_from: str = ""
    prior_link_bytes_per_s: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(GPU)[1:]:  # the figures after the name
            value, required = getattr(self, f.name), f.default is dataclasses.MISSING  # optional ones: 0 = none known
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0 or (required and not value):
                raise ValueError(f"gpu_spec {f.name} must be a number {'> 0' if required else '>= 0'}, got {value!r}")
        if self.link_read_from and not self.prior_link_bytes_per_s > 0:
            raise ValueError("gpu_spec link_read_from needs prior_link_bytes_per_s > 0 (the link it replaced)")
        if self.efficiency_of and self.efficiency_of not in gpu_efficiencies():
            known = ", ".join(gpu_efficiencies())
            raise ValueError(
                f"gpu_spec efficiency_of: no fitted efficiency of {self.efficiency_of!r}; choose from {known}"
            )

    def with_prior_link(self) -> GpuSpec:
        """This device with the link it had before one was read back from a log."""
        return dataclasses.replace(self, link_bytes_per_s=self.prior_link_bytes_per_s, link_read_from="")


@dataclass(frozen=True)
class Placement:
    """Where the roles run. Actor, critic and reference share the actor GPUs (data parallel); the reward model
    has its own GPUs when disaggregated, and shares all GPUs when colocated.

    ``rollout_gpus``: of the actor GPUs, the first ones run generation only (a rollout engine on its own devices,
    weights pushed after each update) and the rest train. 0: generation and training share the actor GPUs,
    except for ``async``, whose definition is generation on its own devices: it takes half of them (rounded up)
    unless set."""

    kind: str = "disaggregated"
    actor_gpus: int = 7
    reward_gpus: int = 1
    rollout_gpus: int = 0

    def __post_init__(self) -> None:
        if self.kind not in PLACEMENTS:
            raise ValueError(f"unknown placement {self.kind!r}; choose from {', '.join(PLACEMENTS)}")
        if self.actor_gpus < 1 or self.reward_gpus < 0:
            raise ValueError("placement needs actor_gpus >= 1 and reward_gpus >= 0")
        if not 0 <= self.rollout_gpus < self.actor_gpus:
            raise ValueError("placement needs 0 <= rollout_gpus < actor_gpus (some actor GPUs must train)")
        if self.actor_gpus + self.reward_gpus > MAX_GPUS:
            raise ValueError(f"placement needs actor_gpus + reward_gpus <= {MAX_GPUS}")

    def rollout_for(self, policy: str) -> int:
        """GPUs generating only, for ``policy`` (0: generation on the training GPUs)."""
        if self.rollout_gpus or not policy_spec(policy).asynchronous or self.actor_gpus < 2:
            return self.rollout_gpus
        return (self.actor_gpus + 1) // 2


@dataclass(frozen=True)
class Contention:
    """Costs of streaming, in one place.

    ``chunk_handoff_s``: the actor stalls this long at every streamed chunk boundary (gather the new tokens,
    hand them to the scorers, resume); it is what makes very small chunks slow (paper Figure 7b).
    ``colocated_overlap_frac``: when decode (bandwidth-bound) and a scorer's prefill (compute-bound) run at once
    on one device, this fraction of the shorter of the two is hidden; the rest is serialised.
    """

    chunk_handoff_s: float = 0.3  # [assumed] about one extra ZeRO-3 forward pass (weight gather) per chunk
    colocated_overlap_frac: float = 0.5

    def __post_init__(self) -> None:
        if self.chunk_handoff_s < 0 or not 0 <= self.colocated_overlap_frac <= 1:
            raise ValueError("contention needs chunk_handoff_s >= 0 and 0 <= colocated_overlap_frac <= 1")


@dataclass(frozen=True)
class Setup:
    name: str
    gpu: str
    actor: str  # model shape of actor, critic and reference: a name in MODELS or a Hugging Face config.json
    reward: str | None  # reward model shape (same forms); None = rule-based reward (no reward model)
    # The schedule this setup runs by default, by field name over the core's defaults (ScheduleConfig.<field>: the
    # one home of each default); flags and stored configs override these (oppo.cli.layered_schedule).
    batch: int  # the paper's B for this setup (or the logged run's)
    max_new_tokens: int  # the response cap of this setup (or of the logged run)
    gpu_spec: GpuSpec | None = None  # the GPU's figures where the catalog has none (then ``gpu`` is any name)
    reference: bool = True  # a reference model runs (KL penalty); many GRPO runs have none
    critic: bool = True  # a critic runs (PPO); never with algo = "grpo"
    algo: str = ScheduleConfig.algo  # the schedule's default --algo
    group_size: int = ScheduleConfig.group_size  # the schedule's default --group-size (samples per prompt)
    engine: str = "hf"  # generation engine: hf (TRL's generate) or vllm
    cost: str = "fitted"  # fitted (GPU profiles) or analytic (datasheet x default efficiencies)
    ppo_epochs: int = 4  # passes over the batch per step (TRL's default num_ppo_epochs)
    minibatches: int = 1  # optimizer steps per epoch
    reward_threshold: float = 4.0  # time-to-reward target reported in summaries
    chunk_candidates: tuple[int, ...] = ScheduleConfig.chunk_candidates
    window_tokens: int = ScheduleConfig.window_tokens  # T-PPO window
    check_tokens: int = ScheduleConfig.check_tokens  # over-commit checks for B finished every this many tokens
    placement: Placement = field(default_factory=Placement)
    contention: Contention = field(default_factory=Contention)
    cluster: Cluster = field(default_factory=Cluster)  # nodes and the link between them
    framework: Framework = field(default_factory=Framework)  # what the RL framework adds to the roofline
    lengths: LengthModel = field(default_factory=LengthModel)
    reward_curve: RewardCurve = field(default_factory=RewardCurve)

    def __post_init__(self) -> None:
        if self.gpu_spec is None and self.gpu != UNKNOWN_GPU and self.gpu not in GPUS:
            raise ValueError(
                f"unknown gpu {self.gpu!r}; choose from {', '.join(sorted(GPUS))}, "
                f'"{UNKNOWN_GPU}" (read back from its log) or give a [gpu_spec] table'
            )
        model_shape(self.actor)
        if self.reward is not None:
            model_shape(self.reward)
        lookup(ENGINES, self.engine, "engine")
        if self.cost not in ("fitted", "analytic") and not self.cost.endswith(".json"):
            raise ValueError(f"unknown cost {self.cost!r}; choose fitted, analytic or a calibrated .json profile")
        if min(self.batch, self.max_new_tokens, self.ppo_epochs, self.minibatches) <= 0:
            raise ValueError("setup needs batch, max_new_tokens, ppo_epochs and minibatches > 0")
        if self.placement.kind == "disaggregated" and self.reward and self.placement.reward_gpus < 1:
            raise ValueError("a disaggregated reward model needs reward_gpus >= 1")
        if self.framework.train_backend == "megatron":
            self._check_megatron_layout()

    def _check_megatron_layout(self) -> None:
        """Megatron splits the actor's GPUs into replicas of tensor x pipeline GPUs, and the model's layers into
        pipeline x virtual chunks."""
        fw = self.framework
        group, chunks = (
            fw.train_tensor_parallel * fw.train_pipeline_parallel,
            fw.train_pipeline_parallel * fw.virtual_pipeline,
        )
        if self.placement.actor_gpus % group:
            raise ValueError(
                f"setup {self.name}: train_tensor_parallel x train_pipeline_parallel = {group} does not divide the "
                f"actor's {self.placement.actor_gpus} GPUs"
            )
        layers = model_shape(self.actor).layers
        if layers % chunks:
            raise ValueError(
                f"setup {self.name}: train_pipeline_parallel x virtual_pipeline = {chunks} does not divide the "
                f"model's {layers} layers"
            )

    def schedule(self, **overrides: Any) -> ScheduleConfig:
        """The schedule this setup runs by default (B, cap, chunk candidates, Δ up to B/4), with overrides."""
        defaults = dict(
            batch=self.batch,
            max_new_tokens=self.max_new_tokens,
            chunk_candidates=self.chunk_candidates,
            window_tokens=self.window_tokens,
            check_tokens=self.check_tokens,
            algo=self.algo,
            group_size=self.group_size,
            delta_max=max(1, self.batch // 4),
            delta_init=max(1, self.batch // 16),
        )
        return schedule_from(defaults, **overrides)

    @property
    def devices(self) -> dict[str, str]:
        """Role -> device name ("gpu0-6" is a data-parallel group of GPUs 0..6), for on-device generation."""
        return self.devices_for("sync")

    @property
    def total_gpus(self) -> int:
        """The GPUs the setup uses: the actor's, and a disaggregated reward model's."""
        p = self.placement
        return p.actor_gpus + (p.reward_gpus if p.kind == "disaggregated" and self.reward else 0)

    def devices_for(self, policy: str) -> dict[str, str]:
        """Role -> device name under ``policy``; a "rollout" entry when generation has its own GPUs."""
        p = self.placement
        rollout = p.rollout_for(policy)
        total = self.total_gpus
        actor = _gpu_range(rollout, p.actor_gpus if p.kind == "disaggregated" else total)
        reward = _gpu_range(p.actor_gpus, total) if p.kind == "disaggregated" else actor
        roles = {"actor": actor, "critic": actor, "reference": actor}
        roles |= {"rollout": _gpu_range(0, rollout)} if rollout else {}
        return {**roles, "reward": reward} if self.reward else roles

    def shape(self, role: str) -> str | None:
        """The model shape of a role: the reward model's own, the actor's for every other role."""
        return self.reward if role == "reward" else self.actor

    def roles(self, algo: str) -> tuple[str, ...]:
        """The roles that run under ``algo``: the actor, and the reference, critic (PPO only) and reward model
        where the setup has them."""
        optional = {"reference": self.reference, "critic": self.critic and algo == "ppo", "reward": bool(self.reward)}
        return ("actor", *(role for role, runs in optional.items() if runs))

    def gpu_datasheet(self) -> GPU:
        """The GPU's figures: the setup's ``[gpu_spec]``, else the catalog's. A ``gpu = "unknown"`` setup has none
        until ``calibrate-log`` (or ``validate-log``) reads them back from its log."""
        if self.gpu_spec is not None:
            return self.gpu_spec if self.reads_its_link else self.gpu_spec.with_prior_link()
        if self.gpu == UNKNOWN_GPU:
            raise ValueError(
                f'setup {self.name}: gpu = "{UNKNOWN_GPU}" has no peak FLOP/s yet: calibrate it on its log first '
                f"(python -m oppo.sim calibrate-log --log LOG --setup {self.name} --out DIR writes DIR/setup.toml "
                "with the device read back as [gpu_spec])"
            )
        return GPUS[self.gpu]

    @property
    def reads_its_link(self) -> bool:
        """Whether the setup takes its ``[gpu_spec]``'s link as it stands: a link read back from a log (not a prior)
        only under the training backend whose passes it was read from."""
        spec = self.gpu_spec
        return spec is None or not spec.link_read_from or spec.link_read_from == self.framework.train_backend

    @property
    def engine_spec(self):
        return ENGINES[self.engine]

    @property
    def priced_as(self) -> str:
        """The GPU whose fitted efficiencies price the setup: a ``[gpu_spec]``'s ``efficiency_of`` (a device read
        back from its log at verl's A100 peak is an A100 here), else its ``gpu``."""
        return (self.gpu_spec.efficiency_of if self.gpu_spec is not None else "") or self.gpu

    def _efficiency(self) -> Efficiency:
        """The achieved fractions of the datasheet: for ``cost = "fitted"`` the fitted ones of :attr:`priced_as`,
        and a ``[gpu_spec]`` that names no profiled GPU the default ones (as ``cost = "analytic"`` gives)."""
        if self.cost != "fitted":
            return Efficiency()
        if self.priced_as in gpu_efficiencies():
            return gpu_efficiencies()[self.priced_as].efficiency
        if self.gpu_spec is not None:
            return Efficiency()
        raise ValueError(
            f"setup {self.name}: no fitted efficiency for gpu {self.gpu!r} (no operator profile); use cost = "
            '"analytic", a calibrated .json profile, or a [gpu_spec] efficiency_of naming a profiled GPU'
        )

    def costs(self, policy: str = "sync") -> dict[str, CostModel]:
        """A cost model per role on its device group under ``policy``: roofline (fitted or analytic efficiencies),
        or a profile calibrated on an executor's records (``cost = "NAME.json"``, in oppo/data/profiles/)."""
        if self.cost.endswith(".json"):
            from oppo.sim.cost.profile import calibrated_costs

            path = (
                Path(self.cost)
                if Path(self.cost).is_absolute() or Path(self.cost).exists()
                else PROFILE_DIR / self.cost
            )
            return calibrated_costs(path, list(self.devices_for(policy)))
        gpu, engine = self.gpu_datasheet(), ENGINES[self.engine]
        eff = self._efficiency()
        devices = self.devices_for(policy)
        generating = "rollout" if "rollout" in devices else "actor"
        out = {}
        for role, device in devices.items():
            model = dataclasses.replace(model_shape(self.shape(role)), score_head=role in SCORE_HEAD_ROLES)
            first, n = first_gpu(device), device_count(device)
            engine_terms = self._rollout_engine(model, gpu, first, n) if role == generating else {}
            roofline = RooflineCost(model, gpu, n, engine, eff, **engine_terms)
            links = {"collective_bytes_per_s": self.cluster.link_bytes_per_s(gpu, first, n)}
            if self.framework.train_backend == "megatron":
                tp, pp = min(self.framework.train_tensor_parallel, n), self.framework.train_pipeline_parallel
                groups = megatron_groups(first, n, tp, pp)  # in Megatron's rank order: tensor, data, pipeline
                links["tensor_bytes_per_s"] = self.cluster.link_bytes_per_s(gpu, first, n, members=groups["tensor"])
                # its gradients reduce over the data-parallel groups, its stages send over the pipeline groups
                links["collective_bytes_per_s"] = self.cluster.link_bytes_per_s(gpu, first, n, members=groups["data"])
                links["pipeline_bytes_per_s"] = self.cluster.link_bytes_per_s(gpu, first, n, members=groups["pipeline"])
            out[role] = FrameworkCost(roofline, role, self.framework, **links)
        return out

    def _rollout_engine(self, model, gpu, first: int, n_gpus: int) -> dict[str, Any]:
        """The rollout engine's settings of the framework layer, as the generating role's roofline reads them (its
        engines: ``tensor_parallel`` GPUs each, from GPU ``first`` of the role's ``n_gpus``)."""
        fw = self.framework
        tp = fw.rollout_tensor_parallel
        link = self.cluster.link_bytes_per_s(gpu, first, n_gpus, group=tp)
        terms: dict[str, Any] = {"tensor_parallel": tp, "allreduce_bytes_per_s": link}
        terms["eager_decode"] = not fw.decode_cuda_graphs
        if ENGINES[self.engine].compacts_batch:  # vLLM-class: its scheduler's token budget per iteration
            terms["max_batched_tokens"] = fw.max_num_batched_tokens
        if fw.rollout_memory_fraction:
            budget = gpu.memory_bytes * fw.rollout_memory_fraction - model.weight_bytes / fw.rollout_tensor_parallel
            if budget <= 0:
                raise ValueError(
                    f"setup {self.name}: rollout_memory_fraction {fw.rollout_memory_fraction:g} of {gpu.name} "
                    f"({gpu.memory_bytes * fw.rollout_memory_fraction / 1e9:.1f} GB) leaves no KV memory beside "
                    f"the weights ({model.weight_bytes / fw.rollout_tensor_parallel / 1e9:.1f} GB per GPU)"
                )
            terms["kv_budget_bytes"] = budget
        return terms


def _gpu_range(first: int, end: int) -> str:
    return f"gpu{first}" if end - first == 1 else f"gpu{first}-{end - 1}"


def first_gpu(device: str) -> int:
    """The first GPU of a device name of :func:`_gpu_range` ("gpu3-4" -> 3)."""
    return int(device[3:].split("-")[0])


# ---------------------------------------------------------------------------------------------------------
# Presets (the paper's setups; docs/design.md section 3)
# ---------------------------------------------------------------------------------------------------------


def paper_7b_h200() -> Setup:
    """Stack-Exchange, Qwen2.5-7B-Instruct actor/critic/reference, 7B reward, 8 x H200 (7 + 1), B = 112, TRL."""
    return Setup("paper-7b-h200", "h200", "qwen2.5-7b", "qwen2.5-7b", batch=112, max_new_tokens=1024, framework=TRL)


def paper_3b_a100() -> Setup:
    """Stack-Exchange, Qwen2.5-3B-Instruct, 8 x A100-80GB (7 + 1), TRL."""
    return Setup(
        "paper-3b-a100",
        "a100",
        "qwen2.5-3b",
        "qwen2.5-3b",
        batch=112,
        max_new_tokens=1024,
        reward_threshold=5.0,
        reward_curve=RewardCurve(final=5.6, tau_steps=400.0),
        framework=TRL,
    )


def paper_7b_gh200_gsm8k() -> Setup:
    """GSM8K, Qwen2.5-7B, 4 x GH200, rule-based reward (no reward model)."""
    return Setup(
        "paper-7b-gh200-gsm8k",
        "gh200",
        "qwen2.5-7b",
        None,
        batch=64,
        max_new_tokens=512,
        window_tokens=128,
        placement=Placement(actor_gpus=4, reward_gpus=0),
        reward_threshold=0.6,
        framework=trl_layer(rule_reward=True),
        lengths=LengthModel(median_tokens=92, sigma=0.4, prompt_tokens=59),
        reward_curve=RewardCurve(start=0.1, final=0.8, tau_steps=150.0, noise=0.02),
    )


def paper_7b_a100_2x4() -> Setup:
    """2 nodes x 4 A100-40GB, 7B (paper Table 4: TRL 498.30 s vs OPPO 111.08 s per step)."""
    return Setup(
        "paper-7b-a100-2x4",
        "a100-40gb",
        "qwen2.5-7b",
        "qwen2.5-7b",
        batch=64,
        max_new_tokens=1024,
        placement=Placement(actor_gpus=7, reward_gpus=1),
        cluster=Cluster(gpus_per_node=4),  # the actor's 7 GPUs span both nodes
        framework=TRL,
    )


def long_cot_7b_h200() -> Setup:
    """The paper's 7B setup on long chain-of-thought lengths: lognormal p50 ~700, p99 ~33k tokens (sigma 1.66), a
    32k cap; samples of one prompt spread by group_sigma 0.5 around a prompt level. Lower the cap with
    ``--max-new-tokens 1024`` to see ~40% of responses hit it."""
    return dataclasses.replace(
        paper_7b_h200(),
        name="long-cot-7b-h200",
        max_new_tokens=32768,
        lengths=LengthModel(median_tokens=700, sigma=1.66, group_sigma=0.5),
    )


def _cpu_preset(name: str) -> Setup:
    """An executor preset on this machine (one core, colocated, executor defaults), costs calibrated on its own
    ``sync`` run (``oppo/data/profiles/NAME.json``, made by ``python -m oppo.sim calibrate``)."""
    return Setup(
        name,
        "cpu-core",
        name,
        name,
        batch=8,
        max_new_tokens=48,
        engine="torch-cpu",
        cost=f"{name}.json",
        chunk_candidates=(4, 8, 16),
        window_tokens=16,
        check_tokens=4,
        ppo_epochs=2,
        minibatches=2,
        placement=Placement(kind="colocated", actor_gpus=1, reward_gpus=0),
        contention=Contention(chunk_handoff_s=0.0, colocated_overlap_frac=0.0),
        lengths=LengthModel(median_tokens=13, sigma=0.6, prompt_tokens=8),
        reward_curve=RewardCurve(start=-3.5, final=5.0, tau_steps=60.0, noise=0.3),
        reward_threshold=3.0,
    )


def tiny_cpu() -> Setup:
    """The executor's ``tiny-cpu`` preset."""
    return _cpu_preset("tiny-cpu")


def small_cpu() -> Setup:
    """The executor's ``small-cpu`` preset."""
    return _cpu_preset("small-cpu")


PRESETS = {
    s().name: s
    for s in (
        paper_7b_h200,
        paper_3b_a100,
        paper_7b_gh200_gsm8k,
        paper_7b_a100_2x4,
        long_cot_7b_h200,
        tiny_cpu,
        small_cpu,
    )
}
