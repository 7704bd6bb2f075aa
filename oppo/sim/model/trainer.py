"""The SimPy model of PPO-RLHF steps, driven by the scheduling core.

Entities: a :class:`Device` per GPU group (a SimPy ``Resource`` that records what it runs), a
:class:`ChunkPrefiller` per streamed scorer on its own device (a process that prefills chunks from a SimPy
``Store`` while the actor decodes), and the :class:`Trainer` whose ``training`` process runs the steps:
re-prefill resumed prefixes, decode in rounds, score, train, sync weights. Time only moves through
``env.timeout``; the scheduler decides, the model executes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import NamedTuple

import numpy as np
import simpy

from oppo.core.config import ScheduleConfig, check_positive
from oppo.core.scheduler import Decisions, Scheduler
from oppo.records.metrics import Columns, device_count, name_codes
from oppo.records.optrace import OpTrace, cycle_collector_paused
from oppo.records.schema import StepRecord, TrainedColumns
from oppo.sim.cost.engine import CostModel, pass_attended
from oppo.sim.cost.framework import ROLE_STAGES
from oppo.sim.cost.stage import StageLoad
from oppo.sim.model.async_pipeline import FROZEN, AsyncConfig, start_pipeline
from oppo.sim.model.decode import Generation, new_chunk
from oppo.sim.setup.presets import Setup
from oppo.sim.workload import LengthSampler, RewardProgress, SeqLengths

STAGES_OF = {role: tuple(s for s in stages if s) for role, stages in ROLE_STAGES.items()}  # scoring, update


@dataclass(frozen=True)
class SimConfig:
    """Root config of a simulation: the schedule (policy, B, Δ, chunk) and the setup (hardware, workload)."""

    schedule: ScheduleConfig
    setup: Setup
    steps: int = 100
    seed: int = 0
    rollout: AsyncConfig = field(default_factory=AsyncConfig)  # how async feeds the trainer

    def __post_init__(self) -> None:
        check_positive("steps", self.steps)
        self.rollout.check(self.schedule, self.setup)


@dataclass
class SimResult:
    steps: list[StepRecord] = field(default_factory=list)
    trained: TrainedColumns = field(default_factory=TrainedColumns)  # read as a sequence of TrainedSeq
    stats: dict = field(default_factory=dict)  # run-level figures of some policies (async: mean_token_lag)
    # Operations as devices record them, one per GPU group: (step, member GPUs, role, phase, start_s, each
    # member's end_s, batch, tokens, context). Read as one TraceRow per GPU through :attr:`trace`.
    ops: list[tuple] = field(default_factory=list, repr=False)

    @property
    def trace(self) -> OpTrace:
        """One :class:`TraceRow` per GPU per operation, in the order the operations were recorded (built when
        first read: an evaluation that reads its summary alone never builds them)."""
        if self._trace is None:
            self._trace = OpTrace(self.ops)
        return self._trace

    _trace = None

    def columns(self) -> Columns:
        """The trace as the metrics' columns (what :meth:`trace` would give ``Columns.of``), from the operations:
        a group's fields repeated per member in C, no rows built."""
        ops = self.ops
        counts = list(map(len, map(itemgetter(1), ops)))  # rows per operation
        rows = sum(counts)
        if not rows:
            return Columns.of([])

        def repeated(k: int, dtype) -> np.ndarray:  # an operation's field on each of its rows, shape (rows,)
            return np.repeat(np.fromiter(map(itemgetter(k), ops), dtype, len(ops)), counts)

        def coded(k: int) -> tuple[list[str], np.ndarray]:  # first seen in the same order as over the rows
            names, code = name_codes(list(map(itemgetter(k), ops)))
            return names, np.repeat(code, counts)

        end = np.fromiter(chain.from_iterable(map(itemgetter(5), ops)), float, rows)
        device = name_codes(list(chain.from_iterable(map(itemgetter(1), ops))))
        start, tokens = repeated(4, float), repeated(7, float)
        return Columns.build(repeated(0, np.int64), device, coded(2), coded(3), start, end, tokens)


class Device:
    """A data-parallel GPU group ("gpu0-6") running one operation at a time, in lockstep. Every operation
    becomes one :class:`TraceRow` per member GPU ("gpu0", ..., "gpu6"), so utilisation is per GPU. Its SimPy
    ``Resource`` is requested only where two processes may ask for the device at once (:attr:`shared`)."""

    def __init__(self, env: simpy.Environment, name: str, ops: list) -> None:
        self.env, self.name, self.ops = env, name, ops  # ops: the run's operations (SimResult.ops), appended to
        self.resource = simpy.Resource(env, capacity=1)
        # Two processes may ask for it at once (set by the Trainer). Otherwise an operation skips the SimPy
        # request: granted at once, nothing could queue behind it, so it would only add an event.
        self.shared = False
        first = int(name[3:].split("-")[0])
        self.members = [f"gpu{first + i}" for i in range(device_count(name))]

    def run(self, step: int, role: str, phase: str, seconds: float, batch: int, tokens: int, context: int):
        request = self.resource.request() if self.shared else None
        if request is not None:
            yield request
        self.record(step, role, phase, self.env.now, seconds, batch, tokens, context)
        yield self.env.timeout(seconds)
        if request is not None:
            self.resource.release(request)

    def record(self, step, role, phase, start, seconds, batch, tokens, context, busy_s=None) -> None:
        """``busy_s``: per-member busy seconds when members finish early (decode of an uneven batch)."""
        members = self.members
        if busy_s is None:  # every member busy alike: one end time
            if seconds <= 0:
                return
            ends = [start + seconds] * len(members)
        elif min(busy_s) > 0:
            ends = [start + s for s in busy_s]
        else:  # a member with no row this round records nothing
            members = [g for g, s in zip(members, busy_s) if s > 0]
            ends = [start + s for s in busy_s if s > 0]
            if not members:
                return
        self.ops.append((step, members, role, phase, start, ends, int(batch), int(tokens), int(context)))


class Chunk(NamedTuple):  # immutable and cheap to make: one per streamed chunk and scorer
    step: int
    batch: int
    tokens: int
    context: int  # tokens already cached, summed over the batch
    attended: float
    done: simpy.Event


class ChunkPrefiller:
    """A streamed scorer's work in the simulator: a frozen scorer (reward, reference or critic) on its own device
    prefills the chunks handed to it, in order (the executor's scorer itself is :mod:`oppo.exec.compute.scoring`)."""

    def __init__(self, env: simpy.Environment, role: str, device: Device, cost: CostModel) -> None:
        self.env, self.role, self.device, self.cost = env, role, device, cost
        self.chunks = simpy.Store(env)
        self.last: simpy.Event = env.event().succeed()
        self.process = env.process(self.prefilling())

    def submit(self, step: int, batch: int, tokens: int, context: int, attended: float) -> None:
        self.last = self.env.event()
        self.chunks.put(Chunk(step, batch, tokens, context, attended, self.last))

    def prefilling(self):
        while True:
            chunk = yield self.chunks.get()
            seconds = self.cost.prefill_s(chunk.tokens, chunk.attended, rows=chunk.batch)
            yield from self.device.run(
                chunk.step, self.role, "prefill", seconds, chunk.batch, chunk.tokens, chunk.context
            )
            chunk.done.succeed()


class Trainer(Generation):
    """Runs PPO steps on the devices of a setup, one after another, as the scheduler plans them."""

    def __init__(
        self,
        env: simpy.Environment,
        config: SimConfig,
        costs: dict[str, CostModel],
        trace,
        result,
        progress=None,
        decisions: Decisions | None = None,
    ):
        self.env, self.config, self.costs, self.result = env, config, costs, result
        self.progress = progress if progress is not None else _ignore  # called with each closed step's record
        setup, schedule = config.setup, config.schedule
        self.scheduler = Scheduler(schedule)
        if decisions is not None:
            self.scheduler.follow(decisions)
        length_rng, reward_rng = np.random.default_rng(config.seed).spawn(2)
        self.sampler = LengthSampler(setup.lengths, schedule.max_new_tokens, length_rng, trace)
        self.reward = RewardProgress(setup.reward_curve, schedule.batch * schedule.group_size, reward_rng)
        self.roles = setup.roles(schedule.algo)
        names = {
            role: name
            for role, name in setup.devices_for(schedule.policy).items()
            if role in self.roles or role == "rollout"
        }
        devices = {name: Device(env, name, result.ops) for name in sorted(set(names.values()))}
        self.device = {role: devices[name] for role, name in names.items()}
        self.gen = "rollout" if "rollout" in names else "actor"  # device and cost of the actor's generation
        actor = self.device[self.gen]
        streamed = [r for r in schedule.streamed_scorers if r in self.roles] if schedule.streaming else []
        self.scorers = [
            ChunkPrefiller(env, r, self.device[r], costs[r]) for r in streamed if self.device[r] is not actor
        ]
        self.fused = [r for r in streamed if self.device[r] is actor]  # share the actor's device (colocated)
        # Which devices two processes may ask for at once. Every policy but async runs one step's operations in
        # one process, beside chunk prefillers on devices of their own (the scorers' passes run in parallel
        # processes, one per device); async's learner runs beside generation, sharing its devices unless
        # generation has rollout GPUs of its own.
        actor.shared = schedule.asynchronous and any(self.device[r] is actor for r in self.roles)
        self.handoff_s = setup.contention.chunk_handoff_s if streamed else 0.0
        self.push_after_update = True  # else the async pipeline pushes (AsyncConfig.push = "before_step")
        self.engine = setup.engine_spec
        self.framework = setup.framework
        self._fixed_s: dict[tuple[str, tuple[str, ...]], float] = {}  # a role's per-step stage seconds
        self.lengths = SeqLengths()  # every admitted sequence's response (EOS position) and prompt lengths
        # async: the rollout devices score with the frozen roles what they generated (the trainer does not)
        scored = config.rollout.rollout_scores and schedule.asynchronous
        self.scored_by_rollout = {r for r in FROZEN if r in self.roles} if scored else set()
        if schedule.asynchronous:  # generation runs ahead on its own devices, training follows
            self.process = start_pipeline(self).process
        else:
            self.process = env.process(self.training())

    def training(self):
        """One step after another: generate, score, train (every policy but ``async``)."""
        for _ in range(self.config.steps):
            plan = self.scheduler.plan_step(self.env.now)
            yield from self._rollout(plan)
            yield from self._learn(plan, self.scheduler.select())

    def _rollout(self, plan):
        """Prompts in, generation until the scheduler stops it (streaming chunks to the scorers)."""
        env = self.env
        response, prompt = self.sampler.sample(plan.step, len(plan.new), self.config.schedule.group_size)
        self.lengths.add(np.array(plan.new, dtype=np.int64), response, prompt)
        yield from self._fixed(plan.step, {self.gen: ("gen",)})  # e.g. resharding weights into the rollout engine
        # 1. the actor prefills every context it decodes: new prompts, and resumed prefixes (their KV cache went
        #    stale when the weights changed)
        rows, contexts = self._running_rows(plan)  # the rows it decodes; their contexts in admission order
        if rows.rows:
            yield from self._pass("actor", "prefill", plan.step, self._prefilled(plan, contexts), on=self.gen)
        # 2. generation in rounds; streamed scorers prefill each complete chunk while the next is decoded
        new_prompts = self.lengths.prompt[np.array(plan.new + plan.restarted, dtype=np.int64)]
        pending = new_chunk(len(new_prompts), int(new_prompts.sum()), 0)
        for scorer in self.scorers:
            scorer.submit(plan.step, *pending)
        yield from self._generate(plan, pending, rows)
        yield simpy.AllOf(env, [s.last for s in self.scorers])

    def release_records(self) -> None:
        """Let go of the run's records (call once it has ended). SimPy's processes, events and their owners
        reference one another: the devices (through their resources and waiting processes) and, under ``async``,
        the trainer (through its pipeline's processes) live until the cyclic collector's next pass, and records
        they still held would live, and be scanned, with them; without them the records are freed with their
        :class:`SimResult`, by reference counting."""
        self.result, self.progress = None, _ignore
        for device in self.device.values():
            device.ops = None

    def _learn(self, plan, trained):
        """Score what was not streamed, train, push the weights, close the step."""
        yield from self._update(plan.step, trained)
        outcome = self.scheduler.close_step(self.env.now, self.reward.step(trained))
        self.record_step(outcome.record, outcome.trained)

    def record_step(self, record: StepRecord, trained: TrainedColumns) -> None:
        """Keep a closed step's records (and tell the progress callback)."""
        self.result.steps.append(record)
        self.result.trained.extend(trained)
        self.progress(record)

    def _update(self, step: int, trained: TrainedColumns):
        """The trainer's part of a step: the framework's per-step stages, scoring, training, the weight push."""
        yield from self._fixed(step, {role: STAGES_OF[role] for role in self.roles})
        ids = trained.column("seq_id")  # tokens of each trained one (empty: float, as np.array([]))
        full = self.lengths.prompt[ids] + np.array(trained.column("response_tokens")) if ids else np.array([])
        yield from self._score(step, trained, full)
        yield from self._train(step, full)

    def _fixed(self, step: int, stages_by_role: dict[str, tuple[str, ...]]):
        """The framework's per-step seconds of these stages, one ``other`` operation per role."""
        for role, stages in stages_by_role.items():
            if (role, stages) not in self._fixed_s:  # the same every step
                self._fixed_s[role, stages] = self.costs[role].fixed_s(stages)
            seconds = self._fixed_s[role, stages]
            if seconds > 0:
                yield from self.device[role].run(step, role, "other", seconds, 0, 0, 0)

    def _prefilled(self, plan, contexts: np.ndarray) -> np.ndarray:
        """The contexts the engine prefills, of the running rows' ``contexts`` (admission order): on an engine that
        pads its batch, every row to the longest; on one that samples a prompt's responses as one request (vLLM's
        ``n``: the samples share the prompt's prefill and its KV blocks), each group's fresh prompt once, and every
        resumed prefix (its own tokens); on one that takes a request per sample, every row its own context."""
        if not self.engine.compacts_batch:  # left-padded batch: every row computes the longest context
            return np.full_like(contexts, contexts.max())
        if self.config.schedule.group_size == 1 or not self.engine.group_prefill:
            return contexts
        group_of, seen, keep = self.scheduler.buffer.group_id, set(), []
        for row, seq_id in enumerate(plan.budgets):
            if not plan.prefix_tokens[seq_id]:  # a fresh row: its group's prompt, prefilled by the first one
                if group_of[seq_id] in seen:
                    continue
                seen.add(group_of[seq_id])
            keep.append(row)
        return contexts[keep]

    def _pass(self, role: str, phase: str, step: int, lengths: np.ndarray, on: str | None = None):
        """A full forward pass of ``role`` over sequences of the given lengths (nothing cached), on the devices
        of ``on`` (default: the role's own)."""
        tokens = float(lengths.sum())
        computed = self.framework.pass_tokens(lengths)  # padded to the longest row unless packed
        attended = pass_attended(computed, 0.0, len(lengths))
        cost = self.costs[on or role]
        pass_s = cost.prefill_s if phase == "prefill" else cost.score_s
        seconds = pass_s(computed, attended, rows=len(lengths))
        yield from self.device[on or role].run(step, role, phase, seconds, len(lengths), tokens, 0)

    def _score(self, step: int, trained: TrainedColumns, full: np.ndarray):
        """Full forward passes for the scorers that were not streamed, plus the actor's log-probs under the
        current policy (always recomputed); passes on different devices run in parallel."""
        finished = full[trained.column("finished")] if len(full) else full
        if "reward" not in self.roles:  # a rule scores the responses on the driver's CPU; the step waits for it
            seconds = self.framework.reward.seconds(StageLoad(units=float(len(finished)), steps=1.0))
            if seconds > 0:
                yield from self.device["actor"].run(step, "reward", "score", seconds, len(finished), 0, 0)
        streamed = set(self.config.schedule.streamed_scorers) if self.config.schedule.streaming else set()
        streamed |= self.scored_by_rollout  # scored where they were generated
        passes = [("actor", full)] + [
            (r, full) for r in ("reference", "critic") if r in self.roles and r not in streamed
        ]
        if "reward" in self.roles and "reward" not in streamed:
            passes.append(("reward", finished))
        by_device: dict[Device, list] = {}
        for role, new in passes:
            by_device.setdefault(self.device[role], []).append((role, new))
        jobs = [self.env.process(self._run_passes(step, work)) for work in by_device.values()]
        yield simpy.AllOf(self.env, jobs)

    def _run_passes(self, step: int, work):
        for role, lengths in work:
            if len(lengths):
                yield from self._pass(role, "score", step, lengths)

    def _train(self, step: int, full: np.ndarray):
        """``ppo_epochs`` x ``minibatches`` passes of the actor then the critic, as the executor runs them."""
        setup = self.config.setup
        rows, tokens = len(full) / setup.minibatches, float(full.sum()) / setup.minibatches
        computed = self.framework.pass_tokens(full) / setup.minibatches  # padded to the longest unless packed
        passes = (("actor", "train_actor"), ("critic", "train_critic"))[: 1 + ("critic" in self.roles)]
        attended = pass_attended(computed, 0.0, rows)
        seconds = {role: self.costs[role].train_s(computed, attended, rows=rows) for role, _ in passes}  # alike
        for role, phase in passes:  # an offloaded trainer's copies from the host, once around the whole update
            if (copies_s := self.costs[role].update_host_s()) > 0:
                yield from self.device[role].run(step, role, phase, copies_s, 0, 0, 0)
        for _ in range(setup.ppo_epochs * setup.minibatches):
            for role, phase in passes:
                yield from self.device[role].run(step, role, phase, seconds[role], round(rows), tokens, 0)
        if self.push_after_update:
            yield from self.push_weights(step)

    def push_weights(self, step: int):
        """The weights pushed to the generation engine: its own copy (vLLM) or its own devices."""
        sync_s = self.costs["actor"].transfer_s() if self.gen == "rollout" else self.costs["actor"].sync_s()
        if sync_s > 0:
            yield from self.device["actor"].run(step, "actor", "sync", sync_s, 0, 0, 0)


def _ignore(record: StepRecord) -> None:
    pass


def simulate(
    config: SimConfig,
    trace=None,
    costs: dict[str, CostModel] | None = None,
    progress=None,
    decisions: Decisions | None = None,
) -> SimResult:
    """Run ``config.steps`` PPO steps and return their records. Pure: same config and trace, same records.

    ``trace``: a :class:`~oppo.catalog.lengths.LengthTrace` to replay (else the setup's lognormal); ``costs``: a cost
    model per role (default: the setup's); ``progress``: called with each finished step's record; ``decisions``:
    a recorded run's Δ and chunk per step, made in place of the schedule's controllers (replaying that run).
    """
    env = simpy.Environment()
    result = SimResult()
    costs = costs or config.setup.costs(config.schedule.policy)
    trainer = Trainer(env, config, costs, trace, result, progress, decisions)
    with cycle_collector_paused():
        env.run(until=trainer.process)
    trainer.release_records()
    return result
