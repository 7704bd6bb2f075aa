"""Placement on Ray: the data-parallel actor group and scorer roles in their own workers.

``--dp N`` runs the actor, with its colocated reference and critic, as N Ray workers (:class:`RankWorker`, one
GPU each, ``num_gpus=1``, or one core each on CPU) joined in one ``torch.distributed`` process group: NCCL on
GPUs, gloo on CPU. Rank 0's weights are broadcast at the start (as DDP does); gradients are all-reduced every
minibatch (:func:`oppo.exec.update.apply_gradients`), or, with ``--shard``, reduce-scattered by FSDP2
(:mod:`oppo.exec.sharding`). On a cluster (``--ray-address``) the ranks are spread over
its nodes. The roles named in ``--remote-roles`` with ``--placement disaggregated`` (default: the reward model)
run in :class:`ScorerWorker` s. Chunks go to remote workers as asynchronous actor calls, executed in order while
the driver decodes the next chunk: true concurrency, no polling. A remote critic receives the trained weights at
every step start (recorded as ``sync``). A worker that dies ends the run (:class:`WorkerDied`). Ray appears
only in this module.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading

import ray
import torch

from oppo.exec.config import ExecConfig
from oppo.exec.models import load_roles, resolve_device, token_ids
from oppo.exec.rank import ActorRank, join_group, trained_roles
from oppo.exec.runner import (
    Executor,
    RunAborted,
    device_name,
    driver_roles,
    driver_scorers,
    local_parts,
    rank_roles,
    scorer_roles,
)
from oppo.exec.scoring import LocalScorer
from oppo.exec.timing import Recorder
from oppo.records import TraceRow


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
        from oppo.exec.models import load_role

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
        # (torch.distributed is used in oppo.exec.rank, not here: Ray pickles this class with the globals its
        # methods name, and torch.distributed.config, a name this method would reach, cannot be pickled)
        join_group(self.backend, address, port, self.index, self.world)
        self.rank = ActorRank.joined(self.config, self.roles, self.rec, self.label, self.colocated)

    def call(self, method: str, *args):
        return getattr(self.rank, method)(*args)

    def collect(self) -> list[TraceRow]:
        rows, self.rec.rows = self.rec.rows, []
        return rows


class RayGroup:
    """The actor group as Ray workers: the methods of :class:`~oppo.exec.rank.LocalGroup`, run on all ranks at
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
        self._owns_ray = _start_ray(config, on_gpu, len(remote))
        if not on_gpu:
            torch.set_num_threads(1)  # one core for the driver: its own "device"
        elsewhere = tuple(r for names in remote for r in names)
        on_driver = driver_roles(config, elsewhere)
        if config.dp > 1:
            group = RayGroup(config, recorder.t0, on_gpu, rank_roles(config, elsewhere))
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
            for i, role in enumerate(names):
                scorers[role] = RemoteScorer(role, worker, collects=i == 0)
            label, pid = _get(worker.ready.remote(), names[0])  # models loaded before the first step's clock
            print(f"placement: {'+'.join(names)} on {label} (worker pid {pid})", file=sys.stderr)
        super().__init__(config, group, scorers, recorder, ids, lengths)

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


def _start_ray(config: ExecConfig, on_gpu: bool, scorer_workers: int) -> bool:
    """Start a local Ray (or join ``config.ray_address``) with room for the run's workers; True if it was started
    here. Too few GPUs or cores for the workers is an error, not a wait."""
    if ray.is_initialized():
        return False
    workers = (config.dp if config.dp > 1 else 0) + scorer_workers
    # Ray lowers its workers' CPU priority (niceness 15) by default; ours do the run's compute and must not yield
    # to the driver or to other work on the machine. Read by the raylet this starts (a joined cluster keeps its own).
    os.environ.setdefault("RAY_worker_niceness", "0")
    env = {k: v for k, v in os.environ.items() if k in ("OPPO_CACHE", "HF_HOME", "HF_HUB_OFFLINE")}
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


# ---------------------------------------------------------------------------------------------------------
# Asynchronous RL: rollout workers generating ahead of the trainer
# ---------------------------------------------------------------------------------------------------------


@ray.remote
class RolloutWorker:
    """A rollout worker of ``async``: its own copy of the actor on one device (one core or one GPU), generating
    the sequences it is dealt with the weights version it was last sent, timed on the driver's clock (``t0``)."""

    def __init__(self, model_config, t0: float, label: str, temperature: float, frozen: tuple[str, ...]):
        """``frozen``: the scorer roles that never change (reward model, reference) this worker scores its
        sequences with, as they finish, off the trainer's device."""
        from oppo.exec.models import load_role
        from oppo.exec.rollout import Rollout

        if not ray.get_gpu_ids():
            torch.set_num_threads(1)  # one core per worker
        device, self.label = _worker_device(label)
        self.actor = load_role(model_config, "actor", device).requires_grad_(False)
        self.pad_id, eos_id, _ = token_ids(model_config)
        self.temperature = temperature
        self.frozen = {role: load_role(model_config, role, device).requires_grad_(False) for role in frozen}
        self.rec = Recorder(t0)
        self.rollout = Rollout(self.actor, eos_id, self.pad_id, temperature, self.rec, self.label)
        self.version: int | None = None

    def ready(self) -> tuple[str, int]:
        return self.label, os.getpid()

    def load_weights(self, step: int, version: int, state: dict) -> None:
        with self.rec.op(step, self.label, "actor", "sync", batch=1):
            self.actor.load_state_dict(state)
        self.version = version

    def generate(self, step: int, tokens: dict[int, list[int]], decoding: list[tuple], n: int):
        """Prefill and decode ``decoding``'s rows up to ``n`` tokens, then score the sequences with the frozen
        roles. Returns the decoding's results (:meth:`Rollout.decode`), the frozen roles' outputs ({role: {seq id:
        tensor}}), the weights version that generated them and the trace rows recorded."""
        from oppo.exec.scoring import ROLE_KINDS, score_once

        self.rollout.begin(step, tokens, decoding)
        finished, new, behaviour = self.rollout.decode(step, n)
        self.rollout.end()
        # (seq id, prompt + response, prompt length); a row's context holds its prompt and `done` response tokens
        seqs = [(i, tokens[i] + new.get(i, []), len(tokens[i]) - done) for i, _, _, _, done in decoding]
        scored = {}
        for role, model in self.frozen.items():
            length = sum(len(s[1]) for s in seqs)
            with self.rec.op(step, self.label, role, "score", batch=len(seqs), tokens=length):
                outputs = score_once(model, ROLE_KINDS[role], seqs, self.pad_id, self.temperature)
            scored[role] = {s[0]: t.cpu() for s, t in zip(seqs, outputs)}
        rows, self.rec.rows = self.rec.rows, []
        return finished, new, behaviour, scored, self.version, rows


class AsyncPipeline(Executor):
    """``--mode async --rollout-workers N``: generation ahead of training, staleness bounded.

    The driver trains (the actor's old log-probs, the critic, both updates, as one rank in this process); N rollout
    workers, one device each, generate and score what they generated with the roles that never change (reward
    model, reference: the same outputs wherever they run), as AReaL's rollout computes rewards. A rollout thread in
    the driver plans step s as soon as version s - K is published (the trainer has applied s - K updates; with
    ``--queue-groups Q``, also once Q groups can take the step's B), sends the workers that version's weights,
    deals them the step's prompts and queues what they return; the trainer takes generated steps in order, scores
    and trains them, and publishes its weights.

    Step s is generated by version max(0, s - K) exactly, the oldest the bound allows, as the one-process
    ``async`` does, even when a newer one is out: which version generates a step then never depends on timing, so
    a run's records are deterministic and equal the one-process run's, and every trained sample's lag is K once
    the run is K steps in (the scheduling core checks the bound, ``plan_step``). Weights change between steps
    only: a sequence is generated by one version from its first token to its last (no in-flight updates; under
    ``async`` nothing is carried over a step, so no prefix's KV cache goes stale)."""

    # Generation goes on while the trainer evaluates (--eval-every): the clock runs on, the workers' clocks (the
    # same t0) stay in step with it, and held_out_s says what the evaluation took from the trainer.
    pause_for_evaluation = False

    def __init__(self, config: ExecConfig, recorder: Recorder, lengths=None):
        from oppo.exec.models import load_role
        from oppo.exec.runner import run_roles

        device = resolve_device(config.model.device)
        on_gpu = device.type == "cuda"
        _check_devices(config, on_gpu)
        self._owns_ray = _start_ray(config, on_gpu, config.rollout_workers)
        if not on_gpu and not config.model.threads:
            torch.set_num_threads(1)  # one core for the trainer: its own device, beside the workers'
        frozen = tuple(r for r in scorer_roles(config) if r in ("reward", "reference"))  # scored by the workers
        which = tuple(r for r in run_roles(config) if r not in frozen)
        group, scorers = local_parts(config, load_roles(config.model, device, which=which), recorder, frozen)
        super().__init__(config, group, scorers, recorder, token_ids(config.model), lengths)
        if self.held_out and "reward" in frozen:  # held-out answers are scored by a reward model of the trainer's
            self.held_out.reward = load_role(config.model, "reward", device).requires_grad_(False)
        options = _one_device(on_gpu)
        temperature = config.ppo.temperature
        self.workers = [
            RolloutWorker.options(**options).remote(config.model, recorder.t0, f"cpu{k + 1}", temperature, frozen)
            for k in range(config.rollout_workers)
        ]
        for k, (label, pid) in enumerate(_get([w.ready.remote() for w in self.workers], "rollout")):
            print(f"placement: rollout worker {k} on {label} (worker pid {pid})", file=sys.stderr)
        self.cond = threading.Condition()  # guards the scheduling core, the version and the queue count
        self.version = 0  # updates the trainer has applied and published
        self.published = {0: ray.put(self._actor_state())}  # version -> its weights (the last K + 1)
        self.queued_groups = 0
        self.generated: queue.Queue = queue.Queue()  # (plan, trained, rollout idle s, generated at) or an error
        self.stopping = False
        self.thread: threading.Thread | None = None

    def _actor_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.group.rank.roles.actor.state_dict().items()}

    # -- the rollout thread -----------------------------------------------------------------------------
    def _rolling(self, steps: int) -> None:
        try:
            sent = None  # the version the workers hold
            for step in range(steps):
                with self.cond:
                    waited = self.rec.now()
                    while not self.stopping and self._held_back(step):
                        self.cond.wait()
                    if self.stopping:
                        return
                    idle = self.rec.now() - waited
                    version = max(0, step - self.config.schedule.staleness)
                    state = self.published[version]
                    plan = self.scheduler.plan_step(self.rec.now(), version)
                    for seq_id in plan.new:
                        self.data[seq_id] = self._new_sequence(seq_id)
                        self.rank_of[seq_id] = 0  # scored and trained by the one rank of this process
                    n = self.scheduler.next_round_tokens()
                    shares = self._shares(plan)
                if version != sent:
                    _get([w.load_weights.remote(plan.step, version, state) for w in self.workers], "rollout")
                    sent = version
                calls = [w.generate.remote(plan.step, *share, n) for w, share in zip(self.workers, shares)]
                results = _get(calls, "rollout")
                with self.cond:
                    self._collect(plan, version, n, results)
                    trained = self.scheduler.finish_generation()
                    self.queued_groups += len({t.group_id for t in trained})
                    self.generated.put((plan, trained, idle, self.rec.now()))
        except BaseException as err:  # the trainer raises it (a dead worker: exit 1, records kept)
            self.generated.put(err)

    def _held_back(self, step: int) -> bool:
        """Whether generating ``step`` now would break the staleness bound or overfill the queue."""
        config = self.config
        if step - self.version > config.schedule.staleness:
            return True
        return bool(config.queue_groups) and self.queued_groups + config.schedule.batch > config.queue_groups

    def _shares(self, plan) -> list[tuple[dict, list]]:
        """Each worker's (contexts, decoding rows) of ``plan``, dealt by expected work (longest first)."""
        from oppo.exec.update import longest_first

        decoding = self._decoding(0, plan)  # every sequence that decodes this step (one rank here)
        work = [len(self.data[i].tokens) + plan.budgets[i] for i in plan.budgets]
        owner = longest_first(work, len(self.workers), [0] * len(self.workers))
        shares = []
        for w in range(len(self.workers)):
            mine = [row for row, o in zip(decoding, owner) if o == w]
            shares.append(({row[0]: self.data[row[0]].tokens for row in mine}, mine))
        return shares

    def _collect(self, plan, version: int, n: int, results) -> None:
        finished: dict[int, int] = {}
        for done, new, behaviour, scored, held, rows in results:
            if held != version:
                raise RunAborted(f"step {plan.step}: a rollout worker generated with version {held}, not {version}")
            finished |= done
            for seq_id, tokens in new.items():
                self.data[seq_id].response.extend(tokens)
                self.data[seq_id].behaviour_logprobs.extend(behaviour[seq_id])
            for role, outputs in scored.items():
                self.precomputed.setdefault(role, {}).update(outputs)
            for row in rows:
                self.rec.add(row)
        self.scheduler.report_round(self.rec.now(), n, finished)
        if not self.scheduler.generation_done:  # async decodes every budget in one round
            raise RunAborted(f"step {plan.step}: generation did not finish in one round")

    # -- the trainer ------------------------------------------------------------------------------------
    def step(self):
        from oppo.exec.runner import StepMetrics

        if self.thread is None:
            self.thread = threading.Thread(target=self._rolling, args=(self.config.steps,), daemon=True)
            self.thread.start()
        waited = self.rec.now()
        item = self.generated.get()
        if isinstance(item, BaseException):
            raise item if isinstance(item, RunAborted) else RunAborted(f"the rollout stopped: {item}")
        plan, trained, rollout_idle, generated_at = item
        started = self.rec.now()
        depth = self.generated.qsize() + 1
        scores = self._score(plan.step, trained)
        losses = self._train(plan.step, trained, scores)
        state = ray.put(self._actor_state())
        with self.cond:
            self.version += 1
            self.published[self.version] = state
            self.published.pop(self.version - self.config.schedule.staleness - 1, None)  # no step needs it again
            self.queued_groups -= len({t.group_id for t in trained})
            outcome = self.scheduler.close_step(self.rec.now(), scores["mean_reward"])
            self.cond.notify_all()
        for scorer in self.scorers.values():
            scorer.end([])
            for row in scorer.collect():
                self.rec.add(row)
        for t in outcome.trained:
            if t.finished:
                del self.data[t.seq_id], self.rank_of[t.seq_id]
        metrics = StepMetrics(
            plan.step,
            scores["mean_reward"],
            scores["rule_score"],
            scores["kl"],
            *losses,
            response_len=sum(t.response_tokens for t in trained) / len(trained),
            trainer_idle_s=started - waited,
            rollout_idle_s=rollout_idle,
            queue_wait_s=started - generated_at,
            queue_depth=depth,
        )
        return outcome, self._held_out_metrics(plan.step, metrics)

    def close(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        for worker in self.workers:
            ray.kill(worker)
        if self.thread is not None:
            self.thread.join(timeout=60)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()


def _check_devices(config: ExecConfig, on_gpu: bool) -> None:
    """On the CPU a device is a core: the trainer's and one per rollout worker (exit 2 if there are fewer)."""
    if on_gpu:
        return  # the Ray cluster's GPU count is checked when it starts
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if config.ray_address is None and 1 + config.rollout_workers > cores:
        raise ValueError(
            f"--rollout-workers {config.rollout_workers} and the trainer need {1 + config.rollout_workers} cores; "
            f"this machine has {cores}"
        )
