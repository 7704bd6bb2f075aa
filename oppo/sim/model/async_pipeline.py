"""``async`` in the simulator: generation on the rollout devices ahead of training, K versions at most.

Two ways to feed the trainer, chosen by :class:`AsyncConfig`:

- :class:`StepPipeline` (``rollout_concurrency = 0``, the executor's rollout workers): the rollout generates a
  step's B groups as one batch through the scheduling core, the next once it ends, with the newest weights (or,
  ``weights = "oldest"``, version s - K exactly, as the executor does); the trainer trains the steps in order.
- :class:`ContinuousPipeline` (``rollout_concurrency = C``, AReaL / PipelineRL): the engine holds up to C groups
  and admits a new one between decode rounds as others finish; finished groups queue; the trainer takes B
  (:class:`oppo.core.async_queue.GroupQueue`: the due ones first, then in finish order). Without in-flight updates a
  new version waits until the running sequences drain (one set of weights in the engine); with them
  (``inflight_updates``, PipelineRL) the running sequences switch at the next round and keep their KV cache
  (computed by the older weights: no recompute, as PipelineRL), so one sequence has tokens of several versions.

Both bound every trained sample's first-token lag by K; ``queue_groups`` bounds the groups in flight, queued or
being trained (the executor's ``--queue-groups``); ``rollout_scores`` scores what the rollout generated with the
frozen roles (reward model, reference) on the rollout devices, as AReaL's rollout and the executor's workers do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress

import numpy as np
import simpy

from oppo.core.async_queue import GroupQueue
from oppo.core.config import opt
from oppo.records.schema import StepRecord, TrainedColumns, TrainedSeq
from oppo.sim.cost.engine import pass_attended

WEIGHTS = ("newest", "oldest")
PUSHES = ("after_update", "before_step")
FROZEN = ("reward", "reference")  # scorers whose weights never change: the rollout may run them


@dataclass(frozen=True)
class AsyncConfig:
    """How ``async`` feeds the trainer (the defaults are the step-synchronous rollout with the newest weights)."""

    queue_groups: int = opt(
        0, "async: groups in flight, queued or being trained at most, >= --batch (0: as many as K lets through)"
    )
    rollout_concurrency: int = opt(
        0,
        "async: groups the rollout engine generates at once, admitting a new one as one finishes (continuous "
        "batching; needs a compacting engine such as vllm); 0: a step's B groups as one batch",
    )
    inflight_updates: bool = opt(
        False, "async, continuous: running sequences switch to a new version at the next decode round (PipelineRL)"
    )
    rollout_scores: bool = opt(
        False, "async: the rollout devices score what they generated with the reward model and reference"
    )
    weights: str = opt("newest", "async, step batches: the newest weights, or the oldest the bound allows (s - K)")
    push: str = opt(
        "after_update",
        "async, step batches: the trainer pushes its weights to the rollout after each update, or before_step: at "
        "the start of its next step, once that step's batch is generated, the next generation waiting for it "
        "(verl's one-step-off trainer)",
    )

    def __post_init__(self) -> None:
        if self.queue_groups < 0 or self.rollout_concurrency < 0:
            raise ValueError("queue_groups and rollout_concurrency must be >= 0")
        if self.weights not in WEIGHTS:
            raise ValueError(f"unknown weights {self.weights!r}; choose from {', '.join(WEIGHTS)}")
        if self.inflight_updates and not self.rollout_concurrency:
            raise ValueError("inflight_updates needs continuous admission (rollout_concurrency >= 1)")
        if self.rollout_concurrency and self.weights != "newest":
            raise ValueError("continuous admission generates with the newest weights (weights = newest)")
        if self.push not in PUSHES:
            raise ValueError(f"unknown push {self.push!r}; choose from {', '.join(PUSHES)}")
        if self.rollout_concurrency and self.push != "after_update":
            raise ValueError("push before_step is for step batches (rollout_concurrency 0)")

    @property
    def is_default(self) -> bool:
        return self == AsyncConfig()

    def check(self, schedule, setup) -> None:
        """Refuse what the policy or the engine cannot run (ValueError, one line)."""
        if self.is_default:
            return
        if not schedule.asynchronous:
            raise ValueError(f"queue, concurrency, in-flight and push options are async's, not {schedule.policy}'s")
        if self.push == "before_step" and schedule.staleness < 1:
            raise ValueError("push before_step generates a step while the one before trains: needs staleness >= 1")
        if self.queue_groups and self.queue_groups < schedule.batch:
            raise ValueError(f"queue_groups {self.queue_groups} cannot hold one step's {schedule.batch} groups")
        if self.rollout_concurrency and not setup.engine_spec.compacts_batch:
            raise ValueError(
                f"rollout_concurrency admits prompts mid-batch: engine {setup.engine!r} does not (use engine = vllm)"
            )
        if self.rollout_scores:
            # a role's pass is priced for the GPUs of its own device (data parallel over them); on the rollout's
            # devices it would need a cost of its own: refused rather than mispriced
            devices = setup.devices_for(schedule.policy)
            rollout = _gpus(devices.get("rollout", devices["actor"]))
            for role in (r for r in FROZEN if r in devices and r in setup.roles(schedule.algo)):
                if _gpus(devices[role]) != rollout:
                    raise ValueError(
                        f"rollout_scores: the {role} is priced on its own {_gpus(devices[role])} GPU(s), the rollout "
                        f"has {rollout}; give them as many GPUs (placement) or score on the {role}'s devices"
                    )


def start_pipeline(trainer):
    options = trainer.config.rollout
    return (ContinuousPipeline if options.rollout_concurrency else StepPipeline)(trainer, options)


def score_on_rollout(trainer, step: int, trained: Sequence[TrainedSeq]) -> simpy.events.Event:
    """The frozen scorers' full passes over ``trained``, on the rollout devices, one after another."""
    trained = TrainedColumns.of(trained)
    roles = [r for r in FROZEN if r in trainer.scored_by_rollout]
    device = trainer.device[trainer.gen]
    for role in roles:
        done = trained.column("finished")
        ids, response = compress(trained.column("seq_id"), done), compress(trained.column("response_tokens"), done)
        lengths = trainer.lengths.prompt[list(ids)] + np.array(list(response), dtype=np.int64)
        if not len(lengths):
            continue
        computed = trainer.framework.pass_tokens(lengths)
        cost = trainer.costs[role].score_s(computed, pass_attended(computed, 0.0, len(lengths)), rows=len(lengths))
        yield from device.run(step, role, "score", cost, len(lengths), float(lengths.sum()), 0)


def _gpus(device: str) -> int:
    """GPUs (or cores) of a device name: "gpu0-6" -> 7, "gpu7" -> 1."""
    first, _, last = device.lstrip("abcdefghijklmnopqrstuvwxyz").partition("-")
    return int(last) - int(first) + 1 if last else 1


class StepPipeline:
    """A step's groups as one batch: ``rolling`` generates step after step, ``learning`` trains them in order.

    ``push = "before_step"`` (verl's one-step-off trainer): the trainer, once step s's batch is generated, pushes
    its weights (s updates) before training it, and the rollout starts step s + K only after that push: a step
    takes the push and the longer of generation and training, where pushing after each update hides the push
    behind a generation still running."""

    def __init__(self, trainer, options: AsyncConfig) -> None:
        self.trainer, self.options, env = trainer, options, trainer.env
        self.batches, self.version, self.updated = simpy.Store(env), 0, env.event()
        self.queued = 0  # groups generated (or generating) and not yet trained
        self.pushes = 0  # with push before_step: pushes made, one at the start of each trainer step
        trainer.push_after_update = options.push == "after_update"
        env.process(self.rolling())
        self.process = env.process(self.learning())

    def _held_back(self, step: int) -> bool:
        schedule, q = self.trainer.config.schedule, self.options.queue_groups
        if self.trainer.push_after_update:
            behind = step - self.version > schedule.staleness
        else:  # step s + K waits for the push that opens trainer step s
            behind = self.pushes < step - schedule.staleness + 1
        return behind or bool(q) and self.queued + schedule.batch > q

    def rolling(self):
        """Generate step after step, at most ``staleness`` versions ahead (and within the queue bound)."""
        t = self.trainer
        staleness = t.config.schedule.staleness
        for step in range(t.config.steps):
            while self._held_back(step):
                yield self.updated
            version = max(0, step - staleness) if self.options.weights == "oldest" else self._newest()
            plan = t.scheduler.plan_step(t.env.now, version=version)
            self.queued += t.config.schedule.batch
            yield from t._rollout(plan)
            trained = t.scheduler.finish_generation()
            yield from score_on_rollout(t, plan.step, trained)
            yield self.batches.put((plan, trained))

    def learning(self):
        """Train each generated step in order; the weights pushed to the rollout devices after each update, or
        (push before_step) before it."""
        t = self.trainer
        for _ in range(t.config.steps):
            plan, trained = yield self.batches.get()
            if not t.push_after_update:
                yield from t.push_weights(plan.step)
                self.pushes += 1
                self._wake()
            yield from t._learn(plan, trained)
            self.version += 1
            self.queued -= t.config.schedule.batch
            self._wake()

    def _newest(self) -> int:
        """The version the rollout holds: the last update's, or with push before_step the last push's (a push at the
        start of trainer step s carries s updates)."""
        return self.version if self.trainer.push_after_update else max(0, self.pushes - 1)

    def _wake(self) -> None:
        """Tell the rolling process that the bound may have moved."""
        updated, self.updated = self.updated, self.trainer.env.event()
        updated.succeed()


class ContinuousPipeline:
    """Continuous admission (AReaL / PipelineRL): ``generating`` runs the engine in decode rounds of
    ``check_tokens``, admitting groups between rounds as the :class:`GroupQueue` allows; ``learning`` takes B
    finished groups a step, trains them and publishes a version."""

    def __init__(self, trainer, options: AsyncConfig) -> None:
        self.trainer, self.options, env = trainer, options, trainer.env
        schedule = trainer.config.schedule
        self.queue = GroupQueue(schedule.batch, schedule.staleness, options.queue_groups, options.rollout_concurrency)
        self.total_groups = schedule.batch * trainer.config.steps  # admitted over the run, then the engine stops
        self.engine_version = 0  # the weights the engine holds
        self.groups: dict[int, list[int]] = {}  # group id -> its sequence ids
        self.admitted_for: dict[int, int] = {}  # group id -> the first step that could train it (batches taken then)
        self.segments: dict[int, list[list[int]]] = {}  # seq id -> [[version, tokens], ...] it was generated by
        self.running: dict[int, int] = {}  # seq id -> response tokens decoded so far (running sequences only)
        self.left: dict[int, int] = {}  # group id -> samples still running
        self.admitted = 0
        self.token_lags: list[float] = []  # per trained sample: mean lag of its tokens
        self.idle_s = {"trainer": 0.0, "rollout": 0.0}  # seconds each side waited for the other
        self.queued: list[int] = []  # finished groups waiting when each step took its B
        self.wake_engine, self.wake_trainer = env.event(), env.event()
        env.process(self.generating())
        self.process = env.process(self.learning())

    # -- the rollout engine -----------------------------------------------------------------------------
    def _admit(self):
        """Admit groups while the queue allows; their prompts are prefilled in one pass."""
        t, size = self.trainer, self.trainer.config.schedule.group_size
        new = []
        while self.admitted < self.total_groups and self.queue.can_admit():
            group = self.admitted
            self.queue.admit(group)
            ids = list(range(group * size, (group + 1) * size))
            response, prompt = t.sampler.sample(self.queue.taken, size, size)
            t.lengths.add(np.array(ids), response, prompt)
            self.groups[group], self.left[group] = ids, size
            self.admitted_for[group] = self.queue.taken
            for i in ids:
                self.running[i], self.segments[i] = 0, [[self.engine_version, 0]]
            new += ids
            self.admitted += 1
        if new:
            contexts = t.lengths.prompt[new]
            yield from t._pass("actor", "prefill", self.queue.taken, contexts, on=t.gen)

    def _update_weights(self) -> None:
        """A published version reaches the engine: at once with in-flight updates, else once it has drained."""
        if self.engine_version == self.queue.version or (self.running and not self.options.inflight_updates):
            return
        self.engine_version = self.queue.version
        for i in self.running:
            self.segments[i].append([self.engine_version, 0])

    def generating(self):
        t = self.trainer
        while self.admitted < self.total_groups or self.running:
            self._update_weights()
            if self.engine_version == self.queue.version:  # no admission while a new version waits for a drain
                yield from self._admit()
            if not self.running:  # held back by the bound, the queue or a version to load: wait for the trainer
                self.wake_engine, waited = t.env.event(), t.env.now
                yield self.wake_engine
                self.idle_s["rollout"] += t.env.now - waited
                continue
            yield from self._round(t.config.schedule.check_tokens)

    def _round(self, n: int):
        """One decode round of up to ``n`` tokens over the running rows (finished rows leave the batch)."""
        t, env = self.trainer, self.trainer.env
        ids = np.array(list(self.running), dtype=np.int64)
        decoded = np.array([self.running[i] for i in ids])
        rest = t.lengths.response[ids] - decoded
        k = np.minimum(n, rest)
        context = t.lengths.prompt[ids] + decoded
        device = t.device[t.gen]
        busy_s = t._decode_s(k, context, n, ids % len(device.members), 0)
        with device.resource.request() as request:
            yield request
            seconds = float(busy_s.max())
            step = self.queue.taken
            device.record(
                step, "actor", "decode", env.now, seconds, len(ids), int(k.sum()), int(context.sum()), busy_s.tolist()
            )
            yield env.timeout(seconds)
        done = []
        for i, tokens, ends in zip(ids.tolist(), k.tolist(), (k == rest).tolist()):
            self.running[i] += tokens
            self.segments[i][-1][1] += tokens
            if ends:  # its EOS reached
                del self.running[i]
                group = i // t.config.schedule.group_size
                self.left[group] -= 1
                if not self.left[group]:
                    done.append(group)
        for group in done:
            if self.trainer.scored_by_rollout:
                yield from score_on_rollout(t, self.queue.taken, [_finished(t, i) for i in self.groups[group]])
            self.queue.finish(group)
        if done:
            _wake(self.wake_trainer)

    # -- the trainer ------------------------------------------------------------------------------------
    def learning(self):
        t, env = self.trainer, self.trainer.env
        last = 0.0
        for step in range(t.config.steps):
            waited = env.now
            while not self.queue.ready():  # a waiter checks, then waits on a fresh event: nothing is missed
                self.wake_trainer = env.event()
                yield self.wake_trainer
            self.idle_s["trainer"] += env.now - waited
            self.queued.append(len(self.queue.finished))
            chosen = self.queue.take()
            _wake(self.wake_engine)  # the taken groups left the queue: room for more
            trained = TrainedColumns.of(self._trained(step, i, v) for g, v in chosen for i in self.groups[g])
            yield from t._update(step, trained)
            self.queue.publish()
            _wake(self.wake_engine)
            untaken = self.queue.untaken * t.config.schedule.group_size  # sequences left for later steps
            record = StepRecord(
                step, last, env.now, env.now - last, t.reward.step(trained), 0, 0, len(trained), untaken
            )
            last = env.now
            t.record_step(record, trained)
            for g, _ in chosen:
                del self.admitted_for[g]
                for i in self.groups.pop(g):
                    del self.segments[i]
        t.result.stats.update(
            mean_token_lag=float(np.mean(self.token_lags)),
            trainer_idle_s=self.idle_s["trainer"],  # waiting for B finished groups (or for due ones)
            rollout_idle_s=self.idle_s["rollout"],  # nothing running: held back by the bound or the queue
            mean_queued_groups=float(np.mean(self.queued)),  # finished groups waiting when a step began
        )

    def _trained(self, step: int, seq_id: int, version: int) -> TrainedSeq:
        segments = np.array(self.segments[seq_id], dtype=float)  # (versions, 2): version, tokens
        tokens = segments[:, 1].sum()
        self.token_lags.append(float(step - (segments[:, 0] * segments[:, 1]).sum() / max(tokens, 1.0)))
        length = int(self.trainer.lengths.response[seq_id])
        group = seq_id // self.trainer.config.schedule.group_size
        admitted = self.admitted_for[group]  # >= version: admitted while step `version` trained, it waits for the next
        return TrainedSeq(step, seq_id, group, admitted, step - admitted, length, length, True, step - version)


def _wake(event: simpy.Event) -> None:
    if not event.triggered:
        event.succeed()


def _finished(trainer, seq_id: int) -> TrainedSeq:
    """A just-finished sequence, as the rollout's scorers see it (only its lengths matter)."""
    length = int(trainer.lengths.response[seq_id])
    return TrainedSeq(-1, seq_id, -1, -1, 0, length, length, True, 0)
