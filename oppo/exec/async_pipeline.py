"""Asynchronous RL with rollout workers (``--mode async --rollout-workers N``): generation on its own devices,
ahead of the trainer, staleness bounded; with ``--inflight-updates``, generations switch to newer weights
mid-sequence (PipelineRL).

A :class:`RolloutWorker` (a Ray actor, one core or GPU) holds its own copy of the actor and the frozen scorer roles;
:class:`AsyncPipeline` is the driver: a rollout thread plans and deals steps to the workers, the trainer (this
process) scores, trains and publishes version-tagged weights.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from typing import NamedTuple

import ray
import torch

from oppo.exec.config import ExecConfig
from oppo.exec.models import load_roles, resolve_device, token_ids
from oppo.exec.placement import _get, _one_device, _start_ray, _worker_device
from oppo.exec.runner import Executor, RunAborted, local_parts, scorer_roles
from oppo.exec.timing import Recorder


class TokenLag(NamedTuple):
    """``token_lag.csv``: per trained sample, the weights versions that generated its tokens (the trainer's
    version at its update is ``step``; a token's lag is ``step`` minus its version)."""

    step: int
    seq_id: int
    first_version: int  # of the first token: the bounded one (policy_lag in sequences.csv = step - this)
    last_version: int
    switches: int  # weight switches inside this step's tokens of the sequence (in-flight updates)
    mean_lag: float  # over the sequence's tokens generated this step
    versions: str  # run-length per token in order, "version x tokens" joined by ";", e.g. "3x40;4x88"


def token_lag(step: int, seq_id: int, versions: list[int]) -> TokenLag:
    runs: list[list[int]] = []
    for v in versions:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    mean = sum(step - v for v in versions) / len(versions) if versions else 0.0
    first, last = (versions[0], versions[-1]) if versions else (step, step)
    return TokenLag(step, seq_id, first, last, max(len(runs) - 1, 0), mean, ";".join(f"{v}x{n}" for v, n in runs))


def shareable(state: dict[str, torch.Tensor]) -> dict:
    """Weights as Ray moves them cheaply: numpy arrays, which ``ray.put`` copies once into the object store and a
    worker reads in place (torch tensors are pickled: copied into the pickle, then out of it on the worker). On the
    small-cpu actor (100 MB), measured on this machine under load: 0.045 s to publish and 0.04 s to load, against
    0.24 s and 0.19 s for a clone of the tensors (the trainer's and the rollout's critical paths, every step).
    bfloat16, which numpy lacks, travels as its bits (int16)."""
    return {
        k: (v.view(torch.int16).numpy(), "bfloat16") if v.dtype == torch.bfloat16 else v.numpy()
        for k, v in state.items()
    }


def unshared(state: dict) -> dict[str, torch.Tensor]:
    """:func:`shareable`'s weights as tensors over the same (read-only, shared) memory: ``load_state_dict`` only
    copies from them."""
    import warnings

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns that the arrays are read-only: only read here
        for k, v in state.items():
            out[k] = torch.from_numpy(v[0]).view(torch.bfloat16) if isinstance(v, tuple) else torch.from_numpy(v)
    return out


@ray.remote
class RolloutWorker:
    """A rollout worker of ``async``: its own copy of the actor on one device (one core or one GPU), generating
    the sequences it is dealt with the weights version it was last sent, timed on the driver's clock (``t0``)."""

    def __init__(
        self, model_config, t0: float, label: str, temperature: float, frozen: tuple[str, ...], core: int | None
    ):
        """``frozen``: the scorer roles that never change (reward model, reference) this worker scores its
        sequences with, as they finish, off the trainer's device; ``core``: the CPU core it runs on (None: where
        the OS puts it, as on a cluster's other node)."""
        from oppo.exec.models import load_role
        from oppo.exec.rollout import Rollout

        if not ray.get_gpu_ids():
            torch.set_num_threads(1)  # one core per worker
            if core is not None:  # that core alone: its own device, as the simulator's placement has it
                os.sched_setaffinity(0, {core})
        device, self.label = _worker_device(label)
        self.actor = load_role(model_config, "actor", device).requires_grad_(False)
        self.pad_id, eos_id, _ = token_ids(model_config)
        self.temperature = temperature
        self.frozen = {role: load_role(model_config, role, device).requires_grad_(False) for role in frozen}
        self.rec = Recorder(t0)
        self.rollout = Rollout(self.actor, eos_id, self.pad_id, temperature, self.rec, self.label)
        self.version: int | None = None
        self.step, self.tokens, self.decoding = -1, {}, []
        self.finished: dict[int, int] = {}  # seq id -> tokens it decoded this step, EOS included
        self.new: dict[int, list[int]] = {}  # seq id -> its tokens this step
        self.behaviour: dict[int, list[float]] = {}  # their log-probs under the weights that sampled them
        self.versions: dict[int, list[int]] = {}  # and those weights' versions

    def ready(self) -> tuple[str, int]:
        return self.label, os.getpid()

    def load_weights(self, step: int, version: int, state: dict) -> None:
        with self.rec.op(step, self.label, "actor", "sync", batch=1):
            self.actor.load_state_dict(unshared(state))
        self.version = version

    def start(self, step: int, tokens: dict[int, list[int]], decoding: list[tuple]) -> None:
        """Prefill ``decoding``'s rows ((seq id, budget, key, forced length, response tokens so far)) whose
        contexts are ``tokens[seq id]``."""
        self.step, self.tokens, self.decoding = step, tokens, decoding
        self.finished, self.new, self.behaviour, self.versions = {}, {}, {}, {}
        self.rollout.begin(step, tokens, decoding)

    def decode(self, n: int) -> bool:
        """Up to ``n`` tokens of every running row; whether any row still runs."""
        finished, new, behaviour = self.rollout.decode(self.step, n)
        for seq_id, tokens in new.items():
            self.new.setdefault(seq_id, []).extend(tokens)
            self.behaviour.setdefault(seq_id, []).extend(behaviour[seq_id])
            self.versions.setdefault(seq_id, []).extend([self.version] * len(tokens))
        self.finished |= {seq_id: len(self.new[seq_id]) for seq_id in finished}
        decoder = self.rollout.decoder
        return decoder is not None and bool(decoder.running.any())

    def switch(self, version: int, state: dict) -> None:
        """In-flight update: the rows still running go on under ``version``'s weights (their prefix re-prefilled,
        :meth:`Rollout.refill`)."""
        self.load_weights(self.step, version, state)
        self.rollout.refill(self.step)

    def finish(self):
        """Score this step's sequences with the frozen roles. Returns ({seq id: tokens decoded this step} of those
        that hit EOS, {seq id: new tokens}, {seq id: their behaviour log-probs}, {seq id: their versions}, the
        frozen roles' outputs ({role: {seq id: tensor}}) and the trace rows recorded."""
        from oppo.exec.scoring import ROLE_KINDS, score_once

        self.rollout.end()
        # (seq id, prompt + response, prompt length); a row's context holds its prompt and `done` response tokens
        seqs = [(i, self.tokens[i] + self.new.get(i, []), len(self.tokens[i]) - done) for i, *_, done in self.decoding]
        scored = {}
        for role, model in self.frozen.items():
            length = sum(len(s[1]) for s in seqs)
            with self.rec.op(self.step, self.label, role, "score", batch=len(seqs), tokens=length):
                outputs = score_once(model, ROLE_KINDS[role], seqs, self.pad_id, self.temperature)
            scored[role] = {s[0]: t.cpu() for s, t in zip(seqs, outputs)}
        rows, self.rec.rows = self.rec.rows, []
        return self.finished, self.new, self.behaviour, self.versions, scored, rows

    def generate(self, step: int, tokens: dict[int, list[int]], decoding: list[tuple], n: int):
        """The whole step in one call (no in-flight updates): :meth:`start`, :meth:`decode` of ``n``,
        :meth:`finish`."""
        self.start(step, tokens, decoding)
        self.decode(n)
        return self.finish()


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
    only: a sequence is generated by one version from its first token to its last (under ``async`` nothing is
    carried over a step, so no prefix's KV cache goes stale).

    ``--inflight-updates`` (PipelineRL): a step is still started by version s - K (its first tokens' lag is the
    bounded one), but it decodes in chunks, and between chunks the workers switch to the newest version the
    trainer has published (at most s: version s + 1 needs this step trained); the running rows are re-prefilled
    under it. The versions of every token are recorded (``token_lag.csv``, ``mean_token_lag`` in metrics.csv).
    Where a switch falls depends on when the trainer publishes, so such a run is not deterministic; given its
    switch points, its tokens and log-probs are (sampling noise is keyed by sequence and position)."""

    # Tokens decoded between two chances to switch weights under --inflight-updates: a Ray call round trip (about
    # a millisecond) per chunk against about 16 decode iterations of 5-20 ms each on a small-cpu core.
    INFLIGHT_CHUNK = 16

    # Generation goes on while the trainer evaluates (--eval-every): the clock runs on, the workers' clocks (the
    # same t0) stay in step with it, and held_out_s says what the evaluation took from the trainer.
    pause_for_evaluation = False

    def __init__(self, config: ExecConfig, recorder: Recorder, lengths=None):
        device = resolve_device(config.model.device)
        on_gpu = device.type == "cuda"
        _check_devices(config, on_gpu)
        self._owns_ray = _start_ray(config, on_gpu, config.rollout_workers, device)  # the trainer's GPU is no worker's
        self.workers: list = []
        self._affinity: set[int] | None = None  # this process's cores before the trainer was pinned
        self._threads: int | None = None  # and its torch threads before the trainer took one
        try:
            self._place(config, recorder, lengths, device, on_gpu)
        except BaseException:  # a failed start leaves no worker, no Ray of its own and no pinning behind
            self._release()
            raise

    def _place(self, config: ExecConfig, recorder: Recorder, lengths, device: torch.device, on_gpu: bool) -> None:
        """Load the trainer's models and start the rollout workers (the rest of ``__init__``)."""
        from oppo.exec.models import load_role
        from oppo.exec.runner import run_roles

        cores = _cores(config, on_gpu) if self._owns_ray else None  # trainer's core, then each worker's
        if cores:  # one core for the trainer: its own device, beside the workers' (restored by close)
            self._affinity = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {cores[0]})
        if not on_gpu and not config.model.threads:
            self._threads = torch.get_num_threads()
            torch.set_num_threads(1)
        frozen = tuple(r for r in scorer_roles(config) if r in ("reward", "reference"))  # scored by the workers
        which = tuple(r for r in run_roles(config) if r not in frozen)
        group, scorers = local_parts(config, load_roles(config.model, device, which=which), recorder, frozen)
        super().__init__(config, group, scorers, recorder, token_ids(config.model), lengths)
        if self.held_out and "reward" in frozen:  # held-out answers are scored by a reward model of the trainer's
            self.held_out.reward = load_role(config.model, "reward", device).requires_grad_(False)
        spawn = RolloutWorker.options(**_one_device(on_gpu)).remote
        for k in range(config.rollout_workers):
            core = cores[k + 1] if cores else None
            self.workers.append(spawn(config.model, recorder.t0, f"cpu{k + 1}", config.ppo.temperature, frozen, core))
        for k, (label, pid) in enumerate(_get([w.ready.remote() for w in self.workers], "rollout")):
            print(f"placement: rollout worker {k} on {label} (worker pid {pid})", file=sys.stderr)
        self.cond = threading.Condition()  # guards the scheduling core, the version and the queue count
        self.version = 0  # updates the trainer has applied and published
        self.published = {0: ray.put(self._actor_state())}  # version -> its weights (the last K + 1)
        self.queued_groups = 0
        self.generated: queue.Queue = queue.Queue()  # (plan, trained, rollout idle s, generated at) or an error
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.versions: dict[int, list[int]] = {}  # seq id -> the weights version of each of its response tokens
        self.token_lags: list[TokenLag] = []  # per trained sample (token_lag.csv)

    def _actor_state(self) -> dict:
        return shareable({k: v.detach().cpu() for k, v in self.group.rank.roles.actor.state_dict().items()})

    # -- the rollout thread -----------------------------------------------------------------------------
    def _rolling(self, steps: int) -> None:
        try:
            sent = None  # the version the workers hold
            for step in range(steps):
                planned = self._next_plan(step)
                if planned is None:
                    return
                plan, version, state, n, shares, idle = planned
                if version != sent:
                    _get([w.load_weights.remote(plan.step, version, state) for w in self.workers], "rollout")
                    sent = version
                if self.config.inflight_updates:
                    results, sent = self._generate_inflight(plan.step, version, shares)
                else:
                    calls = [w.generate.remote(plan.step, *share, n) for w, share in zip(self.workers, shares)]
                    results = _get(calls, "rollout")
                with self.cond:
                    self._collect(plan, version, n, results)
                    trained = self.scheduler.finish_generation()
                    self.queued_groups += len({t.group_id for t in trained})
                    self.generated.put((plan, trained, idle, self.rec.now()))
        except BaseException as err:  # the trainer raises it (a dead worker: exit 1, records kept)
            self.generated.put(err)

    def _next_plan(self, step: int):
        """Wait until ``step`` may be generated, then plan it: (plan, its version, that version's weights, tokens
        of its one round, each worker's share, seconds held back); None once the run stops."""
        with self.cond:
            waited = self.rec.now()
            while not self.stopping and self._held_back(step):
                self.cond.wait()
            if self.stopping:
                return None
            idle = self.rec.now() - waited
            version = max(0, step - self.config.schedule.staleness)
            plan = self.scheduler.plan_step(self.rec.now(), version)
            for seq_id in plan.new:
                self.data[seq_id] = self._new_sequence(seq_id)
                self.rank_of[seq_id] = 0  # scored and trained by the one rank of this process
            n = self.scheduler.next_round_tokens()
            return plan, version, self.published[version], n, self._shares(plan), idle

    def _generate_inflight(self, step: int, version: int, shares) -> tuple[list, int]:
        """The step in chunks; between chunks, the workers take the newest published weights if newer than
        theirs. Returns the workers' results (:meth:`RolloutWorker.finish`) and the version they hold."""
        _get([w.start.remote(step, *share) for w, share in zip(self.workers, shares)], "rollout")
        running = list(self.workers)
        while running:
            alive = _get([w.decode.remote(self.INFLIGHT_CHUNK) for w in running], "rollout")
            running = [w for w, more in zip(running, alive) if more]
            with self.cond:
                newest = self.version
                state = self.published[newest]
            if running and newest > version:
                _get([w.switch.remote(newest, state) for w in self.workers], "rollout")
                version = newest
        return _get([w.finish.remote() for w in self.workers], "rollout"), version

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
        for done, new, behaviour, versions, scored, rows in results:
            finished |= done
            for seq_id, tokens in new.items():
                if versions[seq_id][0] != version:  # the bounded one: the version the step was planned with
                    raise RunAborted(
                        f"step {plan.step}: a rollout worker started with version {versions[seq_id][0]}, not {version}"
                    )
                data = self.data[seq_id]
                data.response.extend(tokens)
                data.behaviour_logprobs.extend(behaviour[seq_id])
                self.versions.setdefault(seq_id, []).extend(versions[seq_id])
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
        with self.rec.op(plan.step, self.group.rank.label, "actor", "sync", batch=1):  # publishing: one copy
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
        lags = [token_lag(plan.step, t.seq_id, self.versions.pop(t.seq_id, [])) for t in trained]
        self.token_lags.extend(lags)
        for t in outcome.trained:
            if t.finished:
                del self.data[t.seq_id], self.rank_of[t.seq_id]
        tokens = sum(t.response_tokens for t in trained)
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
            mean_token_lag=sum(lag.mean_lag * t.response_tokens for lag, t in zip(lags, trained)) / max(tokens, 1),
        )
        return outcome, self._held_out_metrics(plan.step, metrics)

    def close(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self._release()

    def _release(self) -> None:
        """Kill the workers (which ends the rollout thread's calls), shut down the Ray started here and give this
        process its cores and torch threads back."""
        for worker in self.workers:
            ray.kill(worker)
        thread = getattr(self, "thread", None)  # None until the first step, absent if the start failed
        if thread is not None:
            thread.join(timeout=60)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        if self._affinity is not None:
            os.sched_setaffinity(0, self._affinity)
        if self._threads is not None:
            torch.set_num_threads(self._threads)


def _cores(config: ExecConfig, on_gpu: bool) -> list[int] | None:
    """On CPU with a local Ray, the cores of the trainer and of each rollout worker (the lowest of those this
    process may use, in order); None where nothing is pinned: on GPUs, on a joined cluster (workers on other
    nodes) and where the OS has no affinity."""
    if on_gpu or config.ray_address is not None or not hasattr(os, "sched_getaffinity"):
        return None
    return sorted(os.sched_getaffinity(0))[: 1 + config.rollout_workers]


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
