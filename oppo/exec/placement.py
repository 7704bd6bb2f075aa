"""Disaggregated placement: scorer roles in Ray actors, each on its own device.

The driver process holds the actor (generation and training) and the critic's training; the roles named in
``--remote-roles`` (default: the reward model) run in Ray actors with one GPU each (``num_gpus=1``) or, on CPU,
one core each (``num_cpus=1``, torch limited to one thread). Chunks go to a remote scorer as asynchronous actor
calls, executed in order while the driver decodes the next chunk: true concurrency, no polling. A remote critic
receives the trained weights at every step start (recorded as ``sync``). Ray appears only in this module.
"""

from __future__ import annotations

import os
import sys

import ray
import torch

from oppo.exec.config import ExecConfig
from oppo.exec.models import Roles
from oppo.exec.runner import Executor, device_name, local_scorers
from oppo.exec.scoring import LocalScorer
from oppo.exec.timing import Recorder
from oppo.records import TraceRow


class WorkerDied(RuntimeError):
    """A remote role's process ended; the run stops with the records written so far."""


@ray.remote
class ScorerWorker:
    """Scorer roles on one device (one core or one GPU): a :class:`LocalScorer` per role, timed on the driver's
    clock (``t0``), so local and remote roles run the same code and record the same rows."""

    def __init__(self, model_config, roles: list[str], pad_id: int, t0: float, device_label: str, threads: int):
        from oppo.exec.models import load_role, resolve_device

        torch.set_num_threads(threads)
        gpu_ids = ray.get_gpu_ids()
        device = torch.device("cuda", 0) if gpu_ids else resolve_device("cpu")
        self.label = f"cuda:{int(gpu_ids[0])}" if gpu_ids else device_label
        self.rec = Recorder(t0)  # the driver's clock zero: one time axis for every process
        self.scorers = {
            role: LocalScorer.for_role(role, load_role(model_config, role, device).requires_grad_(False), pad_id,
                                       self.rec, self.label)
            for role in roles
        }  # fmt: skip

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

    def sync_weights(self, step, model) -> None:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        self._sent.append(self.worker.load_weights.remote(self.role, step, state))

    def collect(self) -> list[TraceRow]:
        return _get(self.worker.collect.remote(), self.role) if self.collects else []


class DisaggregatedExecutor(Executor):
    """The executor with ``remote_roles`` in Ray actors; the loop itself is :class:`Executor`'s."""

    def __init__(self, config: ExecConfig, roles: Roles, recorder, lengths=None):
        """``config.remote_roles``: one entry per worker device; "reward+reference" puts two roles on one device;
        ``config.ray_address``: an existing cluster to join (default: start a local one)."""
        ray_address, remote_roles = config.ray_address, config.remote_roles
        on_gpu = roles.device.type == "cuda"
        if not ray.is_initialized():
            env = {k: v for k, v in os.environ.items() if k in ("OPPO_CACHE", "HF_HOME", "HF_HUB_OFFLINE")}
            ray.init(address=ray_address, num_cpus=None if ray_address else max(2, len(remote_roles) + 1),
                     include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                     runtime_env={"env_vars": env} if env else None)  # fmt: skip
        self._owns_ray = ray_address is None
        if not on_gpu:
            torch.set_num_threads(1)  # one core for the driver: its own "device"
        scorers = local_scorers(config, roles, recorder)
        wall_t0 = recorder.t0  # the recorder's zero on the wall clock
        groups = [[r for r in entry.split("+") if r in scorers] for entry in remote_roles]
        for k, group in enumerate(g for g in groups if g):
            options = {"num_gpus": 1} if on_gpu else {"num_cpus": 1}
            worker = ScorerWorker.options(**options).remote(config.model, group, roles.pad_id, wall_t0,
                                                            f"cpu{k + 1}", 1)  # fmt: skip
            for i, role in enumerate(group):
                scorers[role] = RemoteScorer(role, worker, collects=i == 0)
        for role, scorer in scorers.items():  # models loaded before the first step's clock starts
            if isinstance(scorer, RemoteScorer) and scorer.collects:
                label, pid = _get(scorer.worker.ready.remote(), role)
                roles_there = "+".join(r for r, s in scorers.items() if getattr(s, "worker", None) is scorer.worker)
                print(f"placement: {roles_there} on {label} (worker pid {pid})", file=sys.stderr)
        super().__init__(config, roles, recorder, lengths, scorers)
        self.device = device_name(roles.device)

    def close(self) -> None:
        for scorer in self.scorers.values():
            if isinstance(scorer, RemoteScorer) and scorer.collects:
                ray.kill(scorer.worker)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
