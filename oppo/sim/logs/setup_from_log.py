"""A setup written from a verl run's own log (``python -m oppo.sim setup-from-log``).

The log's configuration (:mod:`oppo.sim.logs.verl_config`) names the model, the GPUs and nodes, the algorithm, the batch
and caps, the micro-batches, the rollout engine and its settings, and the training backend's; the log's steps give
the lengths. Each setup key records where it came from (the printed configuration, the launch command, verl's
default where the log shows neither, or the steps), and each configuration key that could cost time but has no
counterpart in the model is listed with the reason. A key the log shows nowhere takes verl's default
(``verl/trainer/config``), which moves between versions: where it moved for a key read here and the log's date
says which side it is on (vLLM's sleep mode, Megatron's tensor-parallel default, the reference's and reward
model's CPU offload), the date decides; otherwise the
default of the current ``ppo_trainer.yaml``, and the table ``setup-from-log`` prints marks it "verl default": check
those against the run.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oppo.sim.cost.engine import MODELS
from oppo.sim.logs import verl_backends
from oppo.sim.logs.read import TrainingLog, load_run_log
from oppo.sim.logs.verl_config import ARA, REQUIRE_BATCHES, VerlConfig, fully_async, read_verl_config
from oppo.sim.setup.presets import UNKNOWN_GPU, Setup
from oppo.sim.setup.toml_file import setup_from_dict, toml_value

# verl's advantage estimators (verl/trainer/ppo/core_algos.py) -> how a step runs: GAE needs a critic; the others
# compare the samples of a prompt's group (critic-free)
CRITIC_ESTIMATORS = ("gae",)
GROUP_ESTIMATORS = (
    "grpo", "gpg", "rloo", "rloo_vectorized", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo",
    "grpo_passk", "grpo_vectorized", "drgrpo", "optimal_token_baseline",
)  # fmt: skip
ENGINE_OF = {"vllm": "vllm", "sglang": "vllm", "hf": "hf"}  # verl's rollout.name -> our engine (SGLang: see below)
# vLLM's sleep mode (free_cache_engine as sleep / wake_up) replaced re-initialising the KV cache in the verl releases
# of spring 2025 (verl v0.3, vLLM >= 0.7); a log's date decides which one its run paid
SLEEP_MODE_FROM = "2025-04-01"
# vLLM 0.7.0 (2025-01-27) brought the V1 engine (opt-in until 0.8.0 made it the default): a log dated before it ran V0
VLLM_V1_FROM = "2025-01-27"
# verl PR #2956 (opened 2025-08-07, "enable vllm cuda graph in default"): rollout.enforce_eager defaults to False since;
# an unstated enforce_eager of a log dated from then is priced with CUDA graphs (an assumption: engine_unstated)
CUDA_GRAPHS_FROM = "2025-08-07"
LENGTH_SIGMA = 0.6  # [assumed] lognormal spread of the responses; the log gives only each step's mean, min and max
# configuration keys that could cost time and have no counterpart in the model, and why (a key ending with the
# pattern, where its value is not the harmless one)
IGNORED = (
    (r"ulysses_sequence_parallel_size$", lambda v: v not in (None, 1), "sequence parallelism is not modelled"),
    (r"model\.lora_rank$", lambda v: bool(v), "LoRA is not modelled: priced as full fine-tuning"),
    (r"megatron\.optimizer_offload$", bool, "Megatron's optimizer state on the host is not modelled"),
    (r"fsdp_config\.fsdp_size$", lambda v: v not in (None, -1), "hybrid sharding (HSDP) is priced as full sharding"),
    (r"fsdp_config\.grad_offload$", bool, "gradients on the host are not modelled"),
    (r"rollout\.max_num_seqs$", lambda v: v is not None, "the decode batch is bounded by the KV budget only"),
    (r"rollout\.mode$", lambda v: v not in (None, "sync"), "the asynchronous agent loop is not modelled"),
    (r"multi_turn\.enable$", bool, "multi-turn rollouts are not modelled"),
    (r"use_torch_compile$|use_liger$|use_fused_kernels$|entropy_checkpointing$|entropy_from_logits_with_chunking$",
     lambda v: bool(v), "a kernel-level choice: inside the fitted efficiency of its stage"),
    (r"enable_activation_offload$", bool, "activation offload is not modelled"),
    (r"test_freq$|save_freq$", lambda v: True, "steps that test or save are left out of the fit and the replay"),
)  # fmt: skip


@dataclass(frozen=True)
class Used:
    key: str  # the setup key ("framework.train_micro_batch")
    value: Any
    verl: str  # the verl key(s) or the log's steps it comes from
    origin: str  # "config", "command", "verl default", "derived", "given" (a command-line option)


@dataclass
class LogSetup:
    """A setup read from a log: its TOML tables, each key's source, and the configuration keys left aside."""

    source: str
    tables: dict[str, dict[str, Any]] = field(default_factory=lambda: {"": {}})
    used: list[Used] = field(default_factory=list)
    ignored: list[tuple[str, Any, str]] = field(default_factory=list)  # (verl key, value, why)

    def set(self, key: str, value: Any, verl: str, origin: str) -> None:
        table, _, name = key.rpartition(".")
        self.tables.setdefault(table, {})[name] = value
        self.used.append(Used(key, value, verl, origin))

    def setup(self) -> Setup:
        data = dict(self.tables[""])
        data |= {table: dict(values) for table, values in self.tables.items() if table}
        return setup_from_dict(data, f"the setup read from {self.source}")

    def toml(self) -> str:
        """The setup as a TOML file, each key with its source."""
        lines = [f"# setup read from {self.source} by python -m oppo.sim setup-from-log", "# key = value  # source"]
        origin = {u.key: f"{u.origin}: {u.verl}" for u in self.used}
        for table, values in self.tables.items():
            if table:
                lines += ["", f"[{table}]"]
            for name, value in values.items():
                key = f"{table}.{name}" if table else name
                lines.append(f"{name} = {toml_value(value)}" + (f"  # {origin[key]}" if key in origin else ""))
        return "\n".join(lines) + "\n"


class _Reader:
    """Reads keys of a :class:`VerlConfig` into a :class:`LogSetup`, recording where each value came from."""

    def __init__(self, config: VerlConfig, out: LogSetup) -> None:
        self.config, self.out = config, out
        self.read: set[str] = set()  # the configuration keys read (the others are listed as ignored)

    def get(self, verl: str, default: Any = None, *, required: bool = False) -> tuple[Any, str]:
        """The value of ``verl`` and its origin; verl's ``default`` where the log shows none."""
        self.read.add(verl)
        if self.config.has(verl) and self.config.get(verl) is not None:
            return self.config.get(verl), self.config.origin[verl]
        if required:
            raise ValueError(f"{self.config.source}: the run's configuration lacks {verl}, which the setup needs")
        return default, "verl default"

    def number(self, verl: str, default: Any = None, kind: type = int, *, required: bool = False) -> tuple[Any, str]:
        """``get`` of a number (an unexpanded ``${VAR}`` of a launch script is no number: refused by name)."""
        value, origin = self.get(verl, default, required=required)
        if value is None or isinstance(value, bool):
            return value, origin
        try:
            return kind(value), origin
        except (TypeError, ValueError):
            raise ValueError(
                f"{self.config.source}: {verl}={value!r} is not a number (an unexpanded variable?)"
            ) from None

    def take(self, key: str, verl: str, default: Any = None, convert=lambda v: v, *, required: bool = False) -> Any:
        if convert in (int, float):
            value, origin = self.number(verl, default, convert, required=required)
        else:
            value, origin = self.get(verl, default, required=required)
            value = convert(value)
        self.out.set(key, value, verl, origin)
        return value


def setup_from_log(path: str | Path, gpu: str | None = None, model: str | None = None) -> LogSetup:
    """The setup of the verl run whose console log is ``path``. ``gpu``: its GPU (else ``"unknown"``, read back
    from the log's MFU when the setup is used); ``model``: the actor's ``config.json`` or a catalog name, where the
    log's ``model.path`` is not a model the catalog knows. Raises ``ValueError`` naming a missing or unknown key."""
    config = read_verl_config(path)
    if config is None:
        raise ValueError(
            f"{path}: no verl launch command or printed configuration in this log; write its setup by hand and pass "
            "--setup (docs/simulator.md)"
        )
    log = load_run_log(path)
    out = LogSetup(config.source)
    r = _Reader(config, out)
    out.set("name", _name(Path(path)), "the log's file name", "derived")
    _device(out, config, gpu)
    _models(r, model)
    _algorithm(r)
    _batch(r)
    _placement(r)
    _framework(r, _mean_sequence_tokens(log))
    _lengths(out, log)
    _ignored(out, config, r.read)
    out.setup()  # refused here, not where it is used, if the values do not make a setup
    return out


def _name(path: Path) -> str:
    stem = path.name.removesuffix(".gz").removesuffix(".log").removesuffix(".txt")
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", stem) or "verl-run"


def _device(out: LogSetup, config: VerlConfig, gpu: str | None) -> None:
    if gpu:
        out.set("gpu", gpu, "--gpu", "given")
        return
    out.set("gpu", UNKNOWN_GPU, "not printed by verl: read back from the log's MFU", "derived")


def _models(r: _Reader, model: str | None) -> None:
    if model:
        r.out.set("actor", str(Path(model).resolve()) if model.endswith(".json") else model, "--model-config", "given")
    else:
        path, origin = r.get(f"{ARA}.model.path", required=True)
        r.out.set("actor", _known_model(r.config.source, path, "--model-config"), f"{ARA}.model.path", origin)
    enabled, origin = r.get("reward_model.enable", False)
    if not enabled:
        r.out.set("reward", "rule", "reward_model.enable", origin)
        return
    path, origin = r.get("reward_model.model.path", required=True)
    r.out.set("reward", _known_model(r.config.source, path, None), "reward_model.model.path", origin)


def model_name(path: str) -> str | None:
    """The catalog name of a model path or hub id (``Qwen/Qwen2.5-0.5B-Instruct``, a hub cache folder
    ``models--Qwen--Qwen2-7B-Instruct/snapshots/<hash>``, ``~/models/deepseek-llm-7b-chat``): its last name
    without an instruct / chat suffix, lower case; None if the catalog has no such model."""
    parts = [p for p in re.split(r"[/\\]", str(path)) if p]
    hub = [p.split("--")[-1] for p in parts if p.startswith("models--")]
    for name in hub + parts[::-1]:
        base = re.sub(r"-(instruct|it|chat|base)$", "", name.lower())
        if base in MODELS:
            return base
    return None


def _known_model(source: str, path: str, option: str | None) -> str:
    name = model_name(path)
    if name is None:
        fix = f"pass {option} (its config.json, or one of {', '.join(sorted(MODELS))})" if option else "not modelled"
        raise ValueError(f"{source}: model path {path!r} is no model the catalog knows; {fix}")
    return name


def _algorithm(r: _Reader) -> None:
    estimator, origin = r.get("algorithm.adv_estimator", "gae")
    n, n_origin = r.number(f"{ARA}.rollout.n", 1)
    known = (*CRITIC_ESTIMATORS, *GROUP_ESTIMATORS)
    if estimator not in known:
        raise ValueError(f"{r.config.source}: unknown adv_estimator {estimator!r}; known: {', '.join(known)}")
    grouped = estimator in GROUP_ESTIMATORS and n > 1
    r.out.set("algo", "grpo" if grouped else "ppo", "algorithm.adv_estimator, rollout.n", origin)
    r.out.set("group_size", n, f"{ARA}.rollout.n", n_origin)
    if estimator == "remax":
        r.out.ignored.append(
            ("algorithm.adv_estimator", estimator, "ReMax's extra greedy rollout per step is not priced")
        )
    r.out.set("critic", estimator in CRITIC_ESTIMATORS, "algorithm.adv_estimator", origin)
    if r.config.printed and not r.config.has("algorithm.use_kl_in_reward"):
        # a printed configuration without it (its `algorithm` table comes before any cut): verl before spring
        # 2025, which builds the reference policy whatever the KL settings
        r.out.set("reference", True, "no algorithm.use_kl_in_reward: this verl always runs the reference", "derived")
        return
    in_reward, origin = r.get("algorithm.use_kl_in_reward", False)
    in_loss, loss_origin = r.get(f"{ARA}.actor.use_kl_loss", False)
    origin = (
        "config" if "config" in (origin, loss_origin) else ("command" if "command" in (origin, loss_origin) else origin)
    )
    r.out.set("reference", bool(in_reward or in_loss), "algorithm.use_kl_in_reward or actor.use_kl_loss", origin)


def _batch(r: _Reader) -> None:
    if fully_async(r.config):
        batch = _fully_async_batch(r)
    else:
        batch = r.take("batch", "data.train_batch_size", required=True, convert=int)
    r.take("max_new_tokens", "data.max_response_length", required=True, convert=int)
    name, origin = r.get(f"{ARA}.rollout.name", "vllm")
    if name not in ENGINE_OF:
        raise ValueError(f"{r.config.source}: unknown rollout engine {name!r}; known: {', '.join(ENGINE_OF)}")
    # SGLang is priced as vLLM: both batch continuously under a KV budget with paged attention
    r.out.set("engine", ENGINE_OF[name], f"{ARA}.rollout.name", origin)
    r.take("ppo_epochs", f"{ARA}.actor.ppo_epochs", 1, int)
    mini, origin = r.number(f"{ARA}.actor.ppo_mini_batch_size", 256)
    if mini > batch > 0:  # verl of early 2025 split the batch by it into one mini-batch (later ones refuse it)
        r.out.set("minibatches", 1, "ppo_mini_batch_size > data.train_batch_size: one, as verl split it", origin)
        return
    if mini <= 0 or batch % mini:
        raise ValueError(f"{r.config.source}: ppo_mini_batch_size {mini} does not divide train_batch_size {batch}")
    split = "async_training.require_batches" if fully_async(r.config) else "data.train_batch_size / ppo_mini_batch_size"
    r.out.set("minibatches", batch // mini, split, origin)


def _fully_async_batch(r: _Reader) -> int:
    """verl's fully async trainer (``data.train_batch_size`` 0) trains a step on ``require_batches`` mini-batches of
    prompts as they come off the rollouter's queue: the setup's batch, a trainer step's."""
    mini, origin = r.number(f"{ARA}.actor.ppo_mini_batch_size", 256)
    batches, _ = r.number(REQUIRE_BATCHES, 1)
    if mini <= 0 or batches <= 0:
        raise ValueError(f"{r.config.source}: ppo_mini_batch_size and async_training.require_batches must be > 0")
    r.read.add("data.train_batch_size")
    r.out.set("batch", mini * batches, "actor.ppo_mini_batch_size x async_training.require_batches", origin)
    return mini * batches


def _placement(r: _Reader) -> None:
    """The GPUs: the trainer's, and an asynchronous trainer's rollout GPUs (``rollout.n_gpus_per_node`` x
    ``rollout.nnodes``, verl's one-step-off and fully async recipes) as the setup's ``rollout_gpus``."""
    per_node, per_origin = r.number("trainer.n_gpus_per_node", required=True)
    nodes, _ = r.number("trainer.nnodes", 1)
    asynchronous = "one_step_off" in (r.config.entry or "") or fully_async(r.config)
    # the asynchronous trainers' configurations default to 8 rollout GPUs per node on 1 node
    rollout_per_node, rollout_origin = r.number("rollout.n_gpus_per_node", 8 if asynchronous else 0)
    rollout_nodes, _ = r.number("rollout.nnodes", 1)
    rollout = rollout_per_node * rollout_nodes
    hybrid, origin = r.get(f"{ARA}.hybrid_engine", True)
    if not hybrid and not rollout:
        raise ValueError(f"{r.config.source}: hybrid_engine=False without rollout.n_gpus_per_node: no rollout GPUs")
    r.out.set("placement.kind", "colocated", "the reward model, if any, shares the GPUs", "derived")
    r.out.set("placement.actor_gpus", per_node * nodes + rollout, "trainer (+ rollout) GPUs", per_origin)
    node = per_node
    if rollout:
        r.out.set("placement.rollout_gpus", rollout, "rollout.n_gpus_per_node x rollout.nnodes", rollout_origin)
        _async_knobs(r)
        # verl's scripts split each node between the two pools: a node holds both (the trainer's collectives stay
        # on its NVLink)
        node = per_node + rollout_per_node if rollout_nodes == nodes else per_node
    r.out.set("placement.reward_gpus", 0, f"{ARA}.hybrid_engine (a reward model shares the GPUs)", origin)
    r.out.set("cluster.gpus_per_node", node, "trainer.n_gpus_per_node (+ rollout.n_gpus_per_node)", per_origin)


# verl's asynchronous trainers' knobs (``async_training.*``) and oppo's nearest, for the printed table: read, not
# set (a setup holds no schedule; pass them to run / compare / plan)
ASYNC_KNOBS = {
    "async_training.staleness_threshold": "--queue-groups: mini-batch x require_batches x (1 + threshold) x trigger "
    "prompts may be generated per weight version",
    "async_training.trigger_parameter_sync_step": "--staleness K bounds the lag in steps; this counts trainer steps "
    "between weight syncs; no exact counterpart",
    "async_training.partial_rollout": "--inflight-updates (a sync interrupts the rollouts, which go on after it)",
}


def _async_knobs(r: _Reader) -> None:
    for key, ours in ASYNC_KNOBS.items():
        value, _ = r.get(key)
        if value is not None:
            r.out.ignored.append((key, value, f"a schedule knob, not the setup's: {ours}"))


def _framework(r: _Reader, seq_tokens: float) -> None:
    """The training backend, its micro-batches (``seq_tokens``: a sequence's mean tokens, for dynamic batches)
    and the rollout engine."""
    megatron = "megatron" in (r.config.config_name or "")  # ppo_megatron_trainer.yaml
    strategy, origin = r.get(f"{ARA}.actor.strategy", "megatron" if megatron else "fsdp")
    if megatron and origin == "verl default":
        origin = f"command: --config-name {r.config.config_name}"
    if strategy not in ("fsdp", "fsdp2", "megatron"):
        raise ValueError(f"{r.config.source}: unknown training strategy {strategy!r}; known: fsdp, fsdp2, megatron")
    r.out.set("framework.base", "roofline", "verl's own layer is fitted on its log (calibrate-log)", "derived")
    if strategy == "megatron":
        verl_backends.megatron(r, origin)
    else:
        r.take("framework.gradient_checkpointing", f"{ARA}.model.enable_gradient_checkpointing", False, bool)
        verl_backends.fsdp(r, origin)
    _micro_batches(r, seq_tokens)
    unstated = []  # the priced engine keys the log does not state (priced at verl's default: an assumption)
    eager = not (r.config.date and r.config.date >= CUDA_GRAPHS_FROM)  # verl's default then (undated: eager)
    r.take("framework.decode_cuda_graphs", f"{ARA}.rollout.enforce_eager", eager, lambda eager: not eager)
    if r.get(f"{ARA}.rollout.enforce_eager")[1] == "verl default":
        unstated.append("decode_cuda_graphs")
    r.take("framework.rollout_tensor_parallel", f"{ARA}.rollout.tensor_model_parallel_size", 2, int)
    r.take("framework.rollout_memory_fraction", f"{ARA}.rollout.gpu_memory_utilization", 0.5, float)
    r.out.set(
        "framework.weight_reshard", True, f"{ARA}.hybrid_engine (the trainer's weights loaded into the engine)", origin
    )
    if not _kv_cache_reset(r):
        unstated.append("kv_cache_reset")
    _engine_version(r)
    if unstated:
        r.out.set("framework.engine_unstated", unstated, "the log does not state them: verl's default", "derived")


def _kv_cache_reset(r: _Reader) -> bool:
    """The engine's reset between steps: none without ``free_cache_engine``; sleep mode where the log's vLLM is >= 0.7
    or a V1 engine, else re-initialisation; without a version, by the log's date. Whether the log states it (False:
    neither the key nor a version or date that decides, priced as a recent verl's sleep mode)."""
    free, origin = r.get(f"{ARA}.rollout.free_cache_engine", True)
    stated = origin != "verl default"
    if not free:
        reset, why = "none", f"{ARA}.rollout.free_cache_engine"
    elif r.config.vllm or r.config.vllm_v1:  # sleep mode from vLLM 0.7; verl puts a V1 engine to sleep
        reset = "sleep" if r.config.vllm_v1 or r.config.vllm >= (0, 7) else "reinit"
        version = ".".join(map(str, r.config.vllm)) if r.config.vllm else "V1 engine"
        why = f"{ARA}.rollout.free_cache_engine; the log's vLLM {version}"
    else:
        reset = "sleep" if (r.config.date or "9999") >= SLEEP_MODE_FROM else "reinit"
        why = f"{ARA}.rollout.free_cache_engine; log dated {r.config.date or 'nowhere (taken as recent)'}"
        stated = stated and r.config.date is not None
    r.out.set("framework.kv_cache_reset", reset, why, origin)
    return stated


def _engine_version(r: _Reader) -> None:
    """What the log shows of the rollout engine's version: vLLM's scheduler (V1 where a V1 engine's modules print,
    V0 where the log's vLLM is older than 0.7 or its date before V1 existed, else unknown), chunked prefill
    (``enable_chunked_prefill``; V1 always chunks) and the tokens an iteration computes at most
    (``max_num_batched_tokens``; 0 where the log does not state it)."""
    c = r.config
    if c.vllm_v1:
        scheduler, why = "v1", "a vLLM V1 engine's modules in the log's output"
    elif (c.vllm and c.vllm < (0, 7)) or (c.date and c.date < VLLM_V1_FROM):
        shown = f"vLLM {'.'.join(map(str, c.vllm))}" if c.vllm and c.vllm < (0, 7) else f"date {c.date}"
        scheduler, why = "v0", f"the log's {shown}: before vLLM V1 (0.7.0, {VLLM_V1_FROM})"
    else:
        scheduler, why = "unknown", "no vLLM version, V1 module or date before V1 in the log"
    r.out.set("framework.rollout_scheduler", scheduler, why, "derived")
    chunked, origin = r.get(f"{ARA}.rollout.enable_chunked_prefill")
    if origin != "verl default":
        r.out.set(
            "framework.chunked_prefill", "on" if chunked else "off", f"{ARA}.rollout.enable_chunked_prefill", origin
        )
    elif scheduler == "v1":
        r.out.set("framework.chunked_prefill", "on", "vLLM V1 always chunks its prefill", "derived")
    tokens, origin = r.number(f"{ARA}.rollout.max_num_batched_tokens")
    if origin != "verl default" and tokens:
        r.out.set("framework.max_num_batched_tokens", tokens, f"{ARA}.rollout.max_num_batched_tokens", origin)


def _micro_batches(r: _Reader, seq_tokens: float) -> None:
    """Sequences per GPU per micro-batch: the update's, the critic's where it differs, the scoring passes', the
    critic's values pass where it differs from theirs."""
    fw = r.out.tables["framework"]
    gpus = r.out.tables["placement"]["actor_gpus"]
    # a global micro-batch is split over the data-parallel ranks: every GPU under FSDP (over the sequence-parallel
    # groups with Ulysses), the replicas of tensor x pipeline GPUs under Megatron
    model_parallel = fw.get("train_tensor_parallel", 1) * fw.get("train_pipeline_parallel", 1)
    sp, _ = r.number(f"{ARA}.actor.ulysses_sequence_parallel_size", 1)
    ranks = max(1, gpus // (model_parallel * (sp or 1)))
    train = _micro(r, f"{ARA}.actor", "ppo", ranks, seq_tokens)
    r.out.set("framework.train_micro_batch", *train)
    if r.out.tables[""]["critic"]:
        critic = _micro(r, "critic", "ppo", ranks, seq_tokens)
        if critic[0] != train[0]:
            r.out.set("framework.critic_train_micro_batch", *critic)
    forward = _micro(r, f"{ARA}.rollout", "log_prob", ranks, seq_tokens)
    forward = forward if forward[0] else _micro(r, f"{ARA}.ref", "log_prob", ranks, seq_tokens)
    r.out.set("framework.forward_micro_batch", *forward)
    if r.out.tables[""]["critic"]:
        # the values pass: critic.forward_micro_batch_size, by default the critic's update micro-batch (the only
        # one before verl 2025-01-02, whose compute_values read ppo_micro_batch_size)
        values = _micro(r, "critic", "forward", ranks, seq_tokens)
        values = values if values[0] else critic
        if values[0] and values[0] != forward[0]:  # (0, the whole share, is not a size the layer can say apart)
            r.out.set("framework.critic_forward_micro_batch", *values)


def _micro(r: _Reader, role: str, kind: str, ranks: int, seq_tokens: float) -> tuple[int, str, str]:
    """Sequences per GPU per micro-batch of ``role``'s ``kind`` pass (``ppo``: the update; ``log_prob``: a scoring
    forward; ``forward``: the critic's values pass), with the verl key and its origin. With dynamic batches
    (``use_dynamic_bsz``), as many mean sequences as the token budget per GPU holds; else ``..._per_gpu`` where
    set, else the older ``..._micro_batch_size``, a global size verl divides by the data-parallel ``ranks``
    (``fsdp_workers.py``: ``//= device_mesh.shape[0]`` in December 2024 already; ``megatron_workers.py``: by the
    data-parallel world size); 0 where none is set (the whole share in one pass)."""
    dynamic_key = f"{role}.use_dynamic_bsz" if kind in ("ppo", "forward") else f"{role}.log_prob_use_dynamic_bsz"
    if r.get(dynamic_key, False)[0]:
        budget_key = f"{role}.{kind}_max_token_len_per_gpu"
        budget, origin = r.number(budget_key, 16384)
        return max(1, int(budget // max(seq_tokens, 1.0))), f"{budget_key} / a mean sequence (dynamic batches)", origin
    key = f"{role}.{kind}_micro_batch_size_per_gpu"
    per_gpu, origin = r.number(key)
    if per_gpu:
        return per_gpu, key, origin
    total, origin = r.number(key.removesuffix("_per_gpu"))
    if not total:
        return 0, f"{key} (none set: the whole share)", "verl default"
    return max(1, total // ranks), f"{key.removesuffix('_per_gpu')} / data-parallel ranks (a global size)", origin


def _mean_sequence_tokens(log: TrainingLog) -> float:
    prompts = [s.prompt_mean for s in log.steps if s.prompt_mean is not None]
    return float(np.median(prompts) if prompts else 0.0) + float(np.median([s.response_mean for s in log.steps]))


def _lengths(out: LogSetup, log: TrainingLog) -> None:
    """The length model of the run's steps: the median over steps of the mean prompt; responses lognormal of an
    assumed spread whose mean is the median over steps of the mean response."""
    prompts = [s.prompt_mean for s in log.steps if s.prompt_mean is not None]
    mean = float(np.median([s.response_mean for s in log.steps]))
    if prompts:
        out.set("lengths.prompt_tokens", round(float(np.median(prompts))), "prompt_length/mean (median)", "derived")
    median = round(mean / math.exp(LENGTH_SIGMA**2 / 2))
    out.set("lengths.median_tokens", median, "response_length/mean (median) as a lognormal's mean", "derived")
    out.set("lengths.sigma", LENGTH_SIGMA, "assumed: the log gives each step's mean, min and max only", "derived")


def _ignored(out: LogSetup, config: VerlConfig, read: set[str]) -> None:
    for key, value in config.values.items():
        why = next((w for pattern, costly, w in IGNORED if re.search(pattern, key) and costly(value)), None)
        if why:
            out.ignored.append((key, value, why))
        elif key not in read:
            out.ignored.append((key, value, "no cost in the model"))
