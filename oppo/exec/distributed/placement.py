"""Placement on Ray: the data-parallel actor group and scorer roles in their own workers.

``--dp N`` runs the actor, with its colocated reference and critic, as N Ray workers (:class:`RankWorker`, one
GPU each, ``num_gpus=1``, or one core each on CPU) joined in one ``torch.distributed`` process group: NCCL on
GPUs, gloo on CPU. Rank 0's weights are broadcast at the start (as DDP does); gradients are all-reduced every
minibatch (:func:`oppo.exec.compute.update.apply_gradients`), or, with ``--shard``, reduce-scattered by FSDP2
(:mod:`oppo.exec.compute.sharding`). On a cluster (``--ray-address``) the ranks are spread over
its nodes. The roles named in ``--remote-roles`` with ``--placement disaggregated`` (default: the reward model)
run in :class:`ScorerWorker` s. Chunks go to remote workers as asynchronous actor calls, executed in order while
the driver decodes the next chunk: true concurrency, no polling. A remote critic receives the trained weights at
every step start (recorded as ``sync``). A worker that dies ends the run (:class:`WorkerDied`). Ray appears
only in this module and in :mod:`oppo.exec.distributed.async_pipeline` (rollout workers).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys

import ray
import torch

from oppo.exec.compute.scoring import LocalScorer
from oppo.exec.compute.timing import Recorder
from oppo.exec.config import ExecConfig
from oppo.exec.engines.vllm_engine import EngineError
from oppo.exec.models.roles import load_roles, resolve_device, token_ids
from oppo.exec.step.parts import device_name, driver_roles, driver_scorers, local_parts, rank_roles, scorer_roles
from oppo.exec.step.rank import ActorRank, join_group, trained_roles
from oppo.exec.step.runner import Executor, RunAborted
from oppo.records.schema import TraceRow


class WorkerDied(RunAborted):
    """A remote role's process ended; the run stops with the records written so far."""


def _worker_device(label: str) -> tuple[torch.device, str]:
    """The device Ray gave this worker (its first GPU, else the CPU) and its label in the records."""
    gpu_ids = ray.get_gpu_ids()
    if gpu_ids:
        return torch.device("cuda", 0), f"cuda:{int(gpu_ids[0])}"
    return resolve_device("cpu"), label


@ray.remote
class ScorerWorker:
    """Scorer roles on one device (one core or one GPU): a :class:`LocalScorer` per role, timed on the driver's
    clock (``t0``), so local and remote roles run the same code and record the same rows."""

    def __init__(
        self,
        model_config,
        roles: list[str],
        pad_id: int,
        t0: float,
        device_label: str,
        threads: int,
        temperature: float,
    ):
        """``temperature``: the sampling temperature (the reference's log-probs are of the sampled distribution)."""
        from oppo.exec.models.roles import load_role

        torch.set_num_threads(threads)
        device, self.label = _worker_device(device_label)
        self.rec = Recorder(t0)  # the driver's clock zero: one time axis for every process
        self.scorers = {
            role: LocalScorer.for_role(
                role,
                load_role(model_config, role, device).requires_grad_(False),
                pad_id,
                self.rec,
                self.label,
                temperature,
            )
            for role in roles
        }

    def ready(self) -> tuple[str, int]:
        """The device label and the worker's process id (shown to the user, used to stop it)."""
        return self.label, os.getpid()

    def begin(self, role, step, seqs):
        self.scorers[role].begin(step, seqs)

    def feed(self, role, step, new_tokens):
        self.scorers[role].feed(step, new_tokens)

    def outputs(self, role, step, seq_ids):
        return [t.cpu() for t in self.scorers[role].outputs(step, seq_ids).get()]

    def score(self, role, step, seqs):
        return [t.cpu() for t in self.scorers[role].score(step, seqs).get()]

    def end(self, role, carried):
        self.scorers[role].end(carried)

    def load_weights(self, role, step, state):
        with self.rec.op(step, self.label, role, "sync", batch=1):
            self.scorers[role].model.load_state_dict(state)

    def collect(self):
        rows, self.rec.rows = self.rec.rows, []
        return rows


class Pending:
    """A remote result; ``get`` turns a dead worker into :class:`WorkerDied`."""

    def __init__(self, ref, role: str) -> None:
        self.ref, self.role = ref, role

    def get(self):
        return _get(self.ref, self.role)


def _get(ref, role: str):
    try:
        return ray.get(ref)
    except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as err:
        raise WorkerDied(f"the {role} worker died: {type(err).__name__}") from None
    except ray.exceptions.RayTaskError as err:  # a worker's rollout engine failed: its one line, not Ray's traceback
        if isinstance(err.cause, EngineError):
            raise type(err.cause)(str(err.cause)) from None
        raise


class RemoteScorer:
    """The driver-side handle of one role of a :class:`ScorerWorker`: the methods of a local scorer role.
    Calls from the driver to one worker run in the order they were made."""

    def __init__(self, role: str, worker, collects: bool) -> None:
        self.role, self.worker, self.collects = role, worker, collects  # one handle per worker collects rows
        self._sent: list = []  # fire-and-forget calls, checked at the step end

    def begin(self, step, seqs) -> None:
        self._sent.append(self.worker.begin.remote(self.role, step, seqs))

    def feed(self, step, new_tokens) -> None:
        self._sent.append(self.worker.feed.remote(self.role, step, new_tokens))

    def outputs(self, step, seq_ids) -> Pending:
        return Pending(self.worker.outputs.remote(self.role, step, seq_ids), self.role)

    def score(self, step, seqs) -> Pending:
        return Pending(self.worker.score.remote(self.role, step, seqs), self.role)

    def end(self, carried) -> None:
        self._sent.append(self.worker.end.remote(self.role, carried))
        sent, self._sent = self._sent, []
        for ref in sent:
            _get(ref, self.role)

    def sync_weights(self, step, state: dict) -> None:
        """Load ``state`` (the trained critic's weights) before this step's calls."""
        self._sent.append(self.worker.load_weights.remote(self.role, step, state))

    def collect(self) -> list[TraceRow]:
        return _get(self.worker.collect.remote(), self.role) if self.collects else []


@ray.remote
class RankWorker:
    """One rank of the data-parallel actor group: an :class:`ActorRank` in its own process, timed on the driver's
    clock (``t0``)."""

    def __init__(self, config: ExecConfig, rank: int, world: int, t0: float, label: str, colocated: tuple[str, ...]):
        if not ray.get_gpu_ids():
            torch.set_num_threads(1)  # one core per rank
        device, self.label = _worker_device(label)
        self.config, self.colocated = config, colocated
        self.index, self.world, self.backend = rank, world, "nccl" if device.type == "cuda" else "gloo"
        torch.manual_seed(config.seed)  # a head the checkpoint lacks starts alike everywhere (and is broadcast)
        self.held = tuple(dict.fromkeys((*trained_roles(config), *colocated)))  # no critic under GRPO
        self.roles = load_roles(config.model, device, which=self.held)
        self.rec = Recorder(t0)
        self.rank: ActorRank | None = None  # made once the group is joined (the optimizers need final parameters)

    def ready(self) -> tuple[str, int, str, tuple[str, ...]]:
        """The device label, the worker's process id (shown to the user, used to stop it), its node and the roles
        it loaded."""
        return self.label, os.getpid(), ray.get_runtime_context().get_node_id(), self.held

    def rendezvous(self) -> tuple[str, int]:
        """An address and a free port on this node for the process group's store (asked of rank 0)."""
        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def join(self, address: str, port: int) -> None:
        """Join the process group, take rank 0's weights (as DDP does at construction), shard them if asked."""
        # (torch.distributed is used in oppo.exec.step.rank, not here: Ray pickles this class with the globals its
        # methods name, and torch.distributed.config, a name this method would reach, cannot be pickled)
        join_group(self.backend, address, port, self.index, self.world)
        self.rank = ActorRank.joined(self.config, self.roles, self.rec, self.label, self.colocated)

    def call(self, method: str, *args):
        return getattr(self.rank, method)(*args)

    def collect(self) -> list[TraceRow]:
        rows, self.rec.rows = self.rec.rows, []
        return rows


class RayGroup:
    """The actor group as Ray workers: the methods of :class:`~oppo.exec.step.rank.LocalGroup`, run on all ranks at
    once (calls to one worker run in the order they were made)."""

    def __init__(self, config: ExecConfig, t0: float, on_gpu: bool, colocated: tuple[str, ...]) -> None:
        self.size, self.sharded = config.dp, config.shard
        options = _one_device(on_gpu)
        if config.ray_address:
            options["scheduling_strategy"] = "SPREAD"  # over the cluster's nodes
        self.workers = [
            RankWorker.options(**options).remote(config, r, self.size, t0, f"cpu{r}", colocated)
            for r in range(self.size)
        ]
        self._sent: list = []
        ready = self._all([w.ready.remote() for w in self.workers])  # models loaded before the clock starts
        self.labels = [label for label, _, _, _ in ready]
        self.held = [roles for _, _, _, roles in ready]  # the roles each rank loaded
        for r, (label, pid, node, roles) in enumerate(ready):
            print(
                f"placement: actor rank {r} on {label} (worker pid {pid}, node {node[:8]}): {', '.join(roles)}",
                file=sys.stderr,
            )
        address, port = self._all([self.workers[0].rendezvous.remote()])[0]
        self._all([w.join.remote(address, port) for w in self.workers])

    def call(self, method: str, args: list[tuple]) -> list:
        return self._all([w.call.remote(method, *a) for w, a in zip(self.workers, args)])

    def send(self, method: str, args: list[tuple]) -> None:
        self._sent += [w.call.remote(method, *a) for w, a in zip(self.workers, args)]

    def first(self, method: str, *args):
        if self.sharded:  # gathering sharded weights takes every rank; rank 0 answers
            return self.call(method, [args] * self.size)[0]
        return self._all([self.workers[0].call.remote(method, *args)])[0]

    def collect(self) -> list[TraceRow]:
        sent, self._sent = self._sent, []
        self._all(sent)
        return [row for rows in self._all([w.collect.remote() for w in self.workers]) for row in rows]

    def close(self) -> None:
        for worker in self.workers:
            ray.kill(worker)

    def _all(self, refs: list):
        try:
            return ray.get(refs)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as err:
            raise WorkerDied(f"an actor rank's worker died: {type(err).__name__}") from None
        except ray.exceptions.RayTaskError:  # a collective with a dead rank fails on the live ones first
            dead = self._dead()
            if dead:
                raise WorkerDied(f"an actor rank's worker died: rank {dead[0]}") from None
            raise

    def _dead(self) -> list[int]:
        """The ranks whose worker no longer answers (a live one answers at once: its call just failed)."""
        dead = []
        for r, worker in enumerate(self.workers):
            try:
                ray.get(worker.ready.remote(), timeout=60)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError, ray.exceptions.GetTimeoutError):
                dead.append(r)
        return dead


class RayExecutor(Executor):
    """The executor with its actor group (``--dp``) and/or remote scorer roles (``--placement disaggregated``)
    in Ray workers; the loop itself is :class:`Executor`'s."""

    def __init__(self, config: ExecConfig, recorder: Recorder, lengths=None):
        """``config.remote_roles``: one entry per worker device; "reward+reference" puts two roles on one device;
        ``config.ray_address``: an existing cluster to join (default: start a local one)."""
        device, ids = resolve_device(config.model.device), token_ids(config.model)
        on_gpu = device.type == "cuda"
        entries = config.remote_roles if config.placement == "disaggregated" else ()
        remote = [[r for r in entry.split("+") if r in scorer_roles(config)] for entry in entries]
        remote = [names for names in remote if names]
        elsewhere = tuple(r for names in remote for r in names)
        on_driver = driver_roles(config, elsewhere)
        holds_models = config.dp == 1 or bool(on_driver)  # the driver's own GPU then is no worker's
        self._owns_ray = _start_ray(config, on_gpu, len(remote), device if holds_models else None)
        self._started: list = []  # what _place started, for _abandon
        try:
            self._place(config, recorder, lengths, device, ids, on_gpu, remote, elsewhere, on_driver)
        except BaseException:
            self._abandon()
            raise

    def _place(self, config, recorder, lengths, device, ids, on_gpu, remote, elsewhere, on_driver) -> None:
        """Load the driver's models and start the workers (the rest of ``__init__``)."""
        if not on_gpu:
            torch.set_num_threads(1)  # one core for the driver: its own "device"
        if config.dp > 1:
            group = RayGroup(config, recorder.t0, on_gpu, rank_roles(config, elsewhere))
            self._started.append(group)
            label = device_name(device) if on_gpu else f"cpu{config.dp}"  # the driver's own device
            roles = load_roles(config.model, device, which=on_driver)
            scorers = driver_scorers(config, roles, recorder, label, elsewhere)
        else:  # the one rank here: the trained models, its colocated scorers and the driver's (not the remote ones)
            which = (*trained_roles(config), *rank_roles(config, elsewhere), *on_driver)
            group, scorers = local_parts(config, load_roles(config.model, device, which=which), recorder, elsewhere)
        first = config.dp + (config.dp > 1)  # the scorer workers' device labels follow the ranks' and the driver's
        for k, names in enumerate(remote):
            worker = ScorerWorker.options(**_one_device(on_gpu)).remote(
                config.model, names, ids[0], recorder.t0, f"cpu{first + k}", 1, config.ppo.temperature
            )
            self._started.append(worker)
            for i, role in enumerate(names):
                scorers[role] = RemoteScorer(role, worker, collects=i == 0)
            label, pid = _get(worker.ready.remote(), names[0])  # models loaded before the first step's clock
            print(f"placement: {'+'.join(names)} on {label} (worker pid {pid})", file=sys.stderr)
        super().__init__(config, group, scorers, recorder, ids, lengths)

    def _abandon(self) -> None:
        """A failed start: end what it started (the workers, the Ray it started), leaving nothing behind."""
        for started in self._started:
            if isinstance(started, RayGroup):
                started.close()
            else:
                ray.kill(started)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    def close(self) -> None:
        self.group.close()
        for scorer in self.scorers.values():
            if isinstance(scorer, RemoteScorer) and scorer.collects:
                ray.kill(scorer.worker)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()


def _one_device(on_gpu: bool) -> dict:
    """Ray resources of a worker that owns one device: a GPU, or on CPU one core."""
    return {"num_gpus": 1} if on_gpu else {"num_cpus": 1}


def _start_ray(config: ExecConfig, on_gpu: bool, scorer_workers: int, driver_gpu: torch.device | None = None) -> bool:
    """Start a local Ray (or join ``config.ray_address``) with room for the run's workers; True if it was started
    here. Too few GPUs or cores for the workers is an error, not a wait. ``driver_gpu``: the GPU this process holds
    models on, kept out of a local Ray's GPUs so that no worker is given it where the others are enough for the
    workers (else one worker shares it, as ``--dp N`` on N GPUs with the reward model on the driver; a joined
    cluster offers what its nodes were started with: leave the driver's GPU out of the head node's ``--num-gpus``)."""
    if ray.is_initialized():
        return False
    workers = (config.dp if config.dp > 1 else 0) + scorer_workers
    # Ray lowers its workers' CPU priority (niceness 15) by default; ours do the run's compute and must not yield
    # to the driver or to other work on the machine. Read by the raylet this starts (a joined cluster keeps its own).
    os.environ.setdefault("RAY_worker_niceness", "0")
    env = {k: v for k, v in os.environ.items() if k in ("OPPO_CACHE", "HF_HOME", "HF_HUB_OFFLINE")}
    others = workers_gpus(driver_gpu) if config.ray_address is None else None
    if others is not None and len([g for g in others.split(",") if g]) < workers:  # too few: share it, as before
        print(f"placement: {workers} GPU workers beside the driver: one shares the driver's GPU", file=sys.stderr)
        others = None
    with _environment("CUDA_VISIBLE_DEVICES", others):  # the raylet started here reads it; the driver keeps its own
        ray.init(
            address=config.ray_address,
            num_cpus=None if config.ray_address else max(2, workers + 1),
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
            runtime_env={"env_vars": env} if env else None,
        )
    resource = "GPU" if on_gpu else "CPU"
    have = ray.cluster_resources().get(resource, 0)
    if have < workers:
        ray.shutdown()
        raise ValueError(
            f"the run needs {workers} {resource}s for its workers (--dp, --remote-roles, --rollout-workers); the Ray "
            f"cluster has {have:g}"
        )
    return config.ray_address is None


def workers_gpus(driver_gpu: torch.device | None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a local Ray's workers: this process's visible GPUs less ``driver_gpu`` (None:
    leave Ray's own detection, as when the driver holds no model on a GPU)."""
    if driver_gpu is None or driver_gpu.type != "cuda":
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    return ",".join(gpu for k, gpu in enumerate(ids) if k != (driver_gpu.index or 0))


@contextlib.contextmanager
def _environment(name: str, value: str | None):
    """``os.environ[name] = value`` inside the block (nothing if ``value`` is None), restored after."""
    if value is None:
        yield
        return
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
