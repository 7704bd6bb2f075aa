"""Disaggregated placement: scorer roles in Ray actors, each on its own device.

The driver process holds the actor (generation and training) and the critic's training; the roles named in
``--remote-roles`` (default: the reward model) run in Ray actors with one GPU each (``num_gpus=1``) or, on CPU,
one core each (``num_cpus=1``, torch limited to one thread). Chunks go to a remote scorer as asynchronous actor
calls, executed in order while the driver decodes the next chunk: true concurrency, no polling. A remote critic
receives the trained weights at every step start (recorded as ``sync``). Ray appears only in this module.
"""

from __future__ import annotations

import os
import time

import ray
import torch

from oppo.exec.config import ExecConfig
from oppo.exec.models import Roles
from oppo.exec.runner import SCORER_KINDS, Executor, device_name, local_scorers
from oppo.exec.scoring import StreamingScorer, score_once
from oppo.records import TraceRow


class WorkerDied(RuntimeError):
    """A remote role's process ended; the run stops with the records written so far."""


@ray.remote
class ScorerWorker:
    """One scorer role on its own device. Times its work on the driver's wall clock (``t0``)."""

    def __init__(self, model_config, role: str, t0: float, device_label: str, threads: int) -> None:
        from oppo.exec.models import load_role, resolve_device

        torch.set_num_threads(threads)
        gpu_ids = ray.get_gpu_ids()
        device = torch.device("cuda", 0) if gpu_ids else resolve_device("cpu")
        self.model = load_role(model_config, role, device)
        self.model.requires_grad_(False)
        self.role, self.t0 = role, t0
        self.label = f"cuda:{int(gpu_ids[0])}" if gpu_ids else device_label
        self.pad_id = self.model.config.pad_token_id or 0
        self.streamer = StreamingScorer(self.model, SCORER_KINDS[role], role != "critic", self.pad_id)
        self.rows: list[TraceRow] = []

    def _timed(self, step, phase, batch, fn):
        if self.label.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.time() - self.t0
        result, tokens = fn()
        if self.label.startswith("cuda"):
            torch.cuda.synchronize()
        self.rows.append(TraceRow(step, self.label, self.role, phase, start, time.time() - self.t0, batch, tokens, 0))
        return result

    def ready(self) -> str:
        return self.label

    def begin(self, step, seqs):
        return self._timed(step, "prefill", len(seqs), lambda: (None, self.streamer.begin(seqs)))

    def feed(self, step, new_tokens):
        return self._timed(step, "prefill", len(new_tokens), lambda: (None, self.streamer.feed(new_tokens)))

    def outputs(self, step, seq_ids):
        fn = lambda: ([t.cpu() for t in self.streamer.outputs(seq_ids)], 0)  # noqa: E731
        return self._timed(step, "score", len(seq_ids), fn)

    def score(self, step, seqs):
        kind = SCORER_KINDS[self.role]
        fn = lambda: ([t.cpu() for t in score_once(self.model, kind, seqs, self.pad_id)], sum(len(s[1]) for s in seqs))  # noqa: E731
        return self._timed(step, "score", len(seqs), fn)

    def end(self, carried):
        self.streamer.end(carried)

    def load_weights(self, step, state):
        def load():
            self.model.load_state_dict(state)
            return None, 0

        return self._timed(step, "sync", 1, load)

    def collect(self):
        rows, self.rows = self.rows, []
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
    """The driver-side handle of a :class:`ScorerWorker`: the methods of a local scorer role."""

    def __init__(self, role: str, worker) -> None:
        self.role, self.worker = role, worker
        self._sent: list = []  # fire-and-forget calls, checked at the step end

    def begin(self, step, seqs) -> None:
        self._sent.append(self.worker.begin.remote(step, seqs))

    def feed(self, step, new_tokens) -> None:
        self._sent.append(self.worker.feed.remote(step, new_tokens))

    def outputs(self, step, seq_ids) -> Pending:
        return Pending(self.worker.outputs.remote(step, seq_ids), self.role)

    def score(self, step, seqs) -> Pending:
        return Pending(self.worker.score.remote(step, seqs), self.role)

    def end(self, carried) -> None:
        self._sent.append(self.worker.end.remote(carried))
        sent, self._sent = self._sent, []
        for ref in sent:
            _get(ref, self.role)

    def sync_weights(self, step, model) -> None:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        self._sent.append(self.worker.load_weights.remote(step, state))

    def collect(self) -> list[TraceRow]:
        return _get(self.worker.collect.remote(), self.role)


class DisaggregatedExecutor(Executor):
    """The executor with ``remote_roles`` in Ray actors; the loop itself is :class:`Executor`'s."""

    def __init__(self, config: ExecConfig, roles: Roles, recorder, lengths=None, ray_address=None,
                 remote_roles: tuple[str, ...] = ("reward",)):  # fmt: skip
        on_gpu = roles.device.type == "cuda"
        if not ray.is_initialized():
            env = {k: v for k, v in os.environ.items() if k in ("OPPO_CACHE", "HF_HOME", "HF_HUB_OFFLINE")}
            ray.init(address=ray_address, num_cpus=None if ray_address else max(2, len(remote_roles) + 1),
                     include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                     runtime_env={"env_vars": env} if env else None)  # fmt: skip
        self._owns_ray = ray_address is None
        torch.set_num_threads(1) if not on_gpu else None  # one core for the driver: its own "device"
        scorers = local_scorers(config, roles, recorder)
        wall_t0 = time.time() - recorder.now()  # the recorder's zero on the wall clock
        for k, role in enumerate(r for r in remote_roles if r in scorers):
            options = {"num_gpus": 1} if on_gpu else {"num_cpus": 1}
            worker = ScorerWorker.options(**options).remote(config.model, role, wall_t0, f"cpu{k + 1}", 1)
            scorers[role] = RemoteScorer(role, worker)
        for scorer in scorers.values():  # models loaded before the first step's clock starts
            if isinstance(scorer, RemoteScorer):
                _get(scorer.worker.ready.remote(), scorer.role)
        super().__init__(config, roles, recorder, lengths, scorers)
        self.device = device_name(roles.device)

    def close(self) -> None:
        for scorer in self.scorers.values():
            if isinstance(scorer, RemoteScorer):
                ray.kill(scorer.worker)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
