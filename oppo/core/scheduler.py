"""One PPO step's plan and bookkeeping, for every policy. Backends execute; the scheduler decides.

A backend drives a step like this (the clock ``now`` is the backend's, in seconds)::

    plan = scheduler.plan_step(now)              # who is in flight, budgets, chunk size, Δ
    while not scheduler.generation_done:
        n = scheduler.next_round_tokens()        # decode n tokens for every running sequence
        scheduler.report_round(now, n, finished) # finished: {seq_id: tokens it decoded this round, EOS included}
        if scheduler.stream_now:                 # streamed policies: a chunk is complete, hand it to the scorers
            ...
    trained = scheduler.select()                 # score and train these
    outcome = scheduler.close_step(now, mean_reward)   # trained sequences, carried ones, the step record

Over-commit checks for B finished every ``check_tokens`` while streaming goes by ``chunk`` tokens: rounds stop at
whichever boundary comes first, a large chunk does not delay the end of generation, and the chunk size never
changes which sequences are trained.

Sequences that reach their budget stop without being reported: at ``max_new_tokens`` they count as finished
(truncated); at the T-PPO window they pause and continue next step.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import add, gt, itemgetter, not_, sub

from oppo.core.buffer import RolloutBuffer
from oppo.core.chunking import make_chunk_policy
from oppo.core.config import ScheduleConfig
from oppo.core.overcommit import LengthObservation, make_delta_controller
from oppo.records.schema import StepRecord, TrainedColumns


@dataclass(frozen=True)
class StepPlan:
    """What a step runs. Ids are in admission (FIFO) order; token counts are response tokens."""

    step: int
    start_s: float
    active: tuple[int, ...]  # every sequence in the buffer this step
    new: tuple[int, ...]  # admitted this step: the backend attaches prompts to these ids
    restarted: tuple[int, ...]  # tailbatch: aborted earlier, generated again from the prompt (tokens discarded)
    resumed: tuple[int, ...]  # carried unfinished: their prefix must be re-prefilled by the updated actor
    ready: tuple[int, ...]  # carried finished: nothing left to generate
    prefix_tokens: Mapping[int, int]  # response tokens already generated, per active id
    budgets: Mapping[int, int]  # tokens each unfinished sequence may decode this step
    round_tokens: int  # tokens per round at most: the check interval when over-committing, else the chunk
    streaming: bool
    chunk: int  # streamed chunk size in tokens, 0 when not streaming
    delta: int  # Δ: prompts over-committed beyond B this step
    target: int  # prompt groups to train (B; a group is one sequence unless group sampling)
    long_round: bool = False  # tailbatch: a round of previously aborted prompts, waited for to the end


@dataclass(frozen=True)
class Decisions:
    """A run's scheduling decisions as its step records hold them: step s's Δ and chunk size."""

    deltas: tuple[int, ...]
    chunks: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.deltas or len(self.deltas) != len(self.chunks):
            raise ValueError("decisions need one Δ and one chunk size per step, at least one step")

    @classmethod
    def of(cls, records) -> Decisions:
        """From step records (anything with ``delta`` and ``chunk``), in step order."""
        return cls(tuple(int(r.delta) for r in records), tuple(int(r.chunk) for r in records))

    def delta_at(self, step: int) -> int:
        """Step ``step``'s Δ; beyond the record, its last."""
        return self.deltas[min(step, len(self.deltas) - 1)]

    def chunk_at(self, step: int) -> int:
        return self.chunks[min(step, len(self.chunks) - 1)]


@dataclass(frozen=True)
class StepOutcome:
    trained: TrainedColumns  # in training order (finish order; starved sequences first)
    carried: tuple[int, ...]  # ids left in the buffer for the next step
    record: StepRecord


class Scheduler:
    """The scheduling core: buffer, chunk policy and Δ controller driven by one :class:`ScheduleConfig`."""

    def __init__(self, config: ScheduleConfig) -> None:
        self.config = config
        self._overcommit = config.overcommit  # read every round (a derived property of the frozen config)
        self.buffer = RolloutBuffer(config.max_new_tokens, config.group_size)
        self.chunking = make_chunk_policy(config)
        self.delta = make_delta_controller(config)
        self.decisions: Decisions | None = None  # a recorded run's, made in place of the controllers' (follow)
        self.step = -1
        self.plan: StepPlan | None = None
        self.long_queue: deque[list[int]] = deque()  # tailbatch: aborted groups (their seq ids), FIFO
        self._pending: deque = deque()  # generated steps waiting for close_step: (plan, trained, lengths, carried)
        self._last_close_s = float("-inf")

    def follow(self, decisions: Decisions) -> None:
        """Plan with a recorded run's Δ and chunk sizes, step by step, in place of this config's controllers: a
        replay whose rewards and step times differ from the run's still makes the run's decisions."""
        self.decisions = decisions

    def _delta(self) -> int:
        """Δ of the step being planned: the record's where following one (by the step's index, whatever was
        closed before: a pipelined policy plans a step before closing the last), else the controller's."""
        return self.delta.value if self.decisions is None else self.decisions.delta_at(self.step)

    def _chunk(self) -> int:
        if self.decisions is not None:
            return self.decisions.chunk_at(self.step)
        return self.chunking.chunk_for(self.step)

    # -- planning ---------------------------------------------------------------------------------------
    def plan_step(self, now: float, version: int | None = None) -> StepPlan:
        """Plan the next step. ``version``: the policy version (updates applied) of the weights that generate it;
        default: every earlier step trained (on-policy). A pipelined backend passes an older one."""
        if self.plan is not None:
            raise RuntimeError("plan_step called before the previous step's generation finished")
        if not self.config.asynchronous and self._pending:  # only a pipelined policy plans ahead
            raise RuntimeError("plan_step called before the previous step was closed")
        self.step += 1
        if version is not None and not self.step - self.config.staleness <= version <= self.step:
            raise ValueError(
                f"step {self.step} generated by version {version}: staleness above {self.config.staleness}"
            )
        cfg, buffer = self.config, self.buffer
        carried = list(buffer.ids)
        long_round = cfg.spec.aborts and len(self.long_queue) >= cfg.batch
        restarted: list[int] = []
        if long_round:  # a full batch of aborted prompts, no over-provisioning
            for _ in range(cfg.batch):
                restarted += buffer.readmit(self.long_queue.popleft())
            new, delta = [], 0
        else:
            delta = self._delta()
            new = buffer.fill(cfg.batch + delta, self.step)
        # a long round runs only its restarted prompts; groups completed earlier wait for the next short round
        active = tuple(restarted) if long_round else (*carried, *new)
        chunk = self._chunk() if cfg.streaming else 0
        # read for the sequences held before (new ones: nothing generated, unfinished, no version; one budget each)
        held = active if long_round else carried
        generated = list(map(buffer.generated.__getitem__, held))
        held_finished = list(map(buffer.finished.__getitem__, held))
        unfinished = list(map(not_, held_finished))
        # a resumed sequence does not get a fresh budget: what is left of max_new_tokens (T-PPO: up to the window)
        left = map(sub, repeat(buffer.max_new_tokens), compress(generated, unfinished))
        budgets = dict(
            zip(compress(held, unfinished), map(min, left, repeat(cfg.window_tokens)) if cfg.truncated else left)
        )
        # first decoded now, by this step's weights (one version per step): the unfinished ones without a version
        first_version, versions = self.step if version is None else version, buffer.first_version
        for seq_id in budgets:
            if versions[seq_id] is None:
                versions[seq_id] = first_version
        if new:  # the last ids admitted: one slice of each column
            fresh = min(buffer.max_new_tokens, cfg.window_tokens) if cfg.truncated else buffer.max_new_tokens
            budgets.update(dict.fromkeys(new, fresh))
            versions[new[0] : new[-1] + 1] = repeat(first_version, len(new))
            generated += repeat(0, len(new))
        carried_finished = held_finished if not long_round else list(map(buffer.finished.__getitem__, carried))
        self.plan = StepPlan(
            step=self.step,
            start_s=now,
            active=active,
            new=tuple(new),
            restarted=tuple(restarted),
            resumed=tuple(filter(budgets.__contains__, carried)),
            ready=() if long_round else tuple(compress(carried, carried_finished)),
            prefix_tokens=dict(zip(active, generated)),
            budgets=budgets,
            # only over-commit needs mid-generation checks; otherwise a round runs until every budget is spent
            round_tokens=cfg.check_tokens if cfg.overcommit else chunk if cfg.streaming else cfg.max_new_tokens,
            streaming=cfg.streaming,
            chunk=chunk,
            delta=delta,
            target=cfg.batch,
            long_round=long_round,
        )
        self._start_generation(self.plan)
        return self.plan

    def _start_generation(self, plan: StepPlan) -> None:
        # Incremental state so that a round costs O(sequences that stop in it), not O(B).
        buffer = self.buffer
        self._step_tokens = 0  # tokens decoded this step by every sequence still running
        self._prefix = plan.prefix_tokens
        self._running = dict.fromkeys(plan.budgets)  # FIFO-ordered set
        self._by_budget = deque(sorted(plan.budgets, key=plan.budgets.__getitem__))  # ascending; stale ids skipped
        group_of = buffer.group_id.__getitem__
        # group -> samples still to finish: the unfinished ones are exactly those with a budget (counted in C; a
        # group of one sample has one)
        unfinished_groups = map(group_of, plan.budgets)
        if buffer.group_size == 1:
            self._group_left = dict.fromkeys(unfinished_groups, 1)
        else:
            self._group_left = Counter(unfinished_groups)
        # every sample finished already: the groups of the carried finished ones (the active ones without a budget)
        complete = set(map(group_of, plan.ready)).difference(self._group_left)
        groups, ranks = buffer.groups, buffer.finish_rank  # complete groups -> rank of their last sample
        if buffer.group_size == 1:  # a group's one sample
            members = chain.from_iterable(map(groups.__getitem__, complete))
            self._completed = dict(zip(complete, map(ranks.__getitem__, members)))
        else:
            self._completed = {g: max(map(ranks.__getitem__, groups[g])) for g in complete}
        self._selection: TrainedColumns | None = None
        self._since_stream = 0  # tokens decoded since the last streamed chunk
        self.stream_now = False  # after a round: a chunk is complete (or generation ended), stream it
        # starved: admitted max_deferrals steps ago or earlier (ids below the bound), waited for; usually none
        starved_below = buffer.admitted_after(self.step - self.config.max_deferrals)
        self._starved_waiting: set[int] = set()
        if plan.budgets and min(plan.budgets) < starved_below:
            starved = map(gt, repeat(starved_below), plan.budgets)
            self._starved_waiting = set(compress(map(group_of, plan.budgets), starved))
        self._finished_lengths: list[int] = []  # lengths of the sequences that finish this step

    # -- generation -------------------------------------------------------------------------------------
    def running(self) -> list[int]:
        """Ids still decoding this step, FIFO order."""
        self._require_plan()
        return list(self._running)

    def budget_left(self, seq_id: int) -> int:
        """Tokens ``seq_id`` may still decode this step."""
        return max(0, self._require_plan().budgets[seq_id] - self._step_tokens)

    def next_round_tokens(self) -> int:
        """Tokens to decode in the next round: the round size, or less when every runner's budget is smaller."""
        plan = self._require_plan()
        while self._by_budget and self._by_budget[-1] not in self._running:
            self._by_budget.pop()
        if not self._by_budget:
            return 0
        to_boundary = plan.round_tokens - self._step_tokens % plan.round_tokens  # rounds end on check boundaries
        n = min(to_boundary, plan.budgets[self._by_budget[-1]] - self._step_tokens)
        return min(n, plan.chunk - self._since_stream) if plan.streaming else n

    def report_round(self, now: float, tokens: int, finished: Mapping[int, int]) -> bool:
        """Record a round: running sequences decoded ``tokens`` each (fewer if their budget ended), except
        ``finished`` ones, which ended with EOS after the given number of tokens (1..tokens). Returns
        :attr:`generation_done`."""
        plan = self._require_plan()
        if tokens <= 0:
            raise ValueError(f"a round decodes at least one token, got {tokens}")
        if finished:
            self._check_finished(tokens, finished)
            self._finish(sorted(zip(finished.values(), finished.keys())))  # EOS order, then id
        self._step_tokens += tokens
        self._since_stream += tokens
        order = self._by_budget
        while order and plan.budgets[order[0]] <= self._step_tokens:
            seq_id = order.popleft()
            if seq_id in self._running:  # budget spent: capped (finished) or paused at the T-PPO window
                capped = plan.prefix_tokens[seq_id] + plan.budgets[seq_id] >= self.buffer.max_new_tokens
                self._stop(seq_id, plan.budgets[seq_id], finished=capped)
        done = self.generation_done
        self.stream_now = plan.streaming and (self._since_stream >= plan.chunk or done)
        if self.stream_now:
            self._since_stream = 0
        return done

    def _check_finished(self, tokens: int, finished: Mapping[int, int]) -> None:
        """Every reported sequence is running, and ended within the round and its budget. Where every running
        budget outlasts the round (the lowest, first in ``_by_budget``), the bounds alone (two C passes); else a loop
        over the sequences."""
        running, budgets, step_tokens = self._running, self.plan.budgets, self._step_tokens
        if not running.keys() >= finished.keys():
            stray = next(i for i in finished if i not in running)
            raise ValueError(f"seq {stray} reported finished but is not running")
        used = finished.values()
        if budgets[self._by_budget[0]] - step_tokens >= tokens and min(used) >= 1 and max(used) <= tokens:
            return
        for seq_id, used in finished.items():
            if not 1 <= used <= tokens or used > budgets[seq_id] - step_tokens:  # budget left at the round's start
                allowed = min(tokens, budgets[seq_id] - step_tokens)
                raise ValueError(f"seq {seq_id} finished after {used} tokens; 1..{allowed} allowed")

    def _finish(self, ended: list[tuple[int, int]]) -> None:
        """Stop the sequences that reached EOS this round, (tokens decoded in it, id) in finish order: as
        :meth:`_stop` with ``finished``, inlined (a step finishes hundreds); groups of one, none starved (the usual
        case), by a shorter loop: each sample completes its group."""
        buffer, prefix, running, left, lengths = (
            self.buffer,
            self._prefix,
            self._running,
            self._group_left,
            self._finished_lengths,
        )
        generated, finished, ranks, group_of = buffer.generated, buffer.finished, buffer.finish_rank, buffer.group_id
        step, step_tokens = self.step, self._step_tokens
        if buffer.group_size == 1 and not self._starved_waiting:  # each completes its group, ranked by itself
            completed = self._completed
            for used, seq_id in ended:
                tokens = step_tokens + used
                generated[seq_id] = total = prefix[seq_id] + tokens
                del running[seq_id]
                lengths.append(total)
                finished[seq_id] = True
                group = group_of[seq_id]
                ranks[seq_id] = completed[group] = (step, tokens, seq_id)
                left[group] = 0
            return
        for used, seq_id in ended:
            tokens = step_tokens + used
            generated[seq_id] = total = prefix[seq_id] + tokens
            del running[seq_id]
            lengths.append(total)
            finished[seq_id] = True
            ranks[seq_id] = rank = (step, tokens, seq_id)
            group = group_of[seq_id]
            left[group] -= 1
            if not left[group]:  # complete: it ranks by its last sample
                members = buffer.groups[group]
                if len(members) > 1:
                    rank = max(map(ranks.__getitem__, members))
                self._completed[group] = rank
                self._starved_waiting.discard(group)

    def _stop(self, seq_id: int, step_tokens: int, finished: bool) -> None:
        buffer = self.buffer
        buffer.generated[seq_id] = generated = self._prefix[seq_id] + step_tokens
        del self._running[seq_id]
        if finished:
            self._finished_lengths.append(generated)
            buffer.finished[seq_id] = True
            buffer.finish_rank[seq_id] = rank = (self.step, step_tokens, seq_id)
            group, left = buffer.group_id[seq_id], self._group_left
            left[group] -= 1
            if not left[group]:  # complete: it ranks by its last sample
                members = buffer.groups[group]
                if len(members) > 1:
                    rank = max(map(buffer.finish_rank.__getitem__, members))
                self._completed[group] = rank
                self._starved_waiting.discard(group)

    @property
    def generation_done(self) -> bool:
        """Sync-like policies wait for every sequence; over-commit stops at B complete groups, starved ones
        included, checked at multiples of ``check_tokens`` only, so the decision does not depend on the chunk
        size."""
        plan = self._require_plan()
        if not self._running:
            return True
        if not self._overcommit or self._step_tokens % self.config.check_tokens:
            return False
        return len(self._completed) >= plan.target and not self._starved_waiting

    # -- closing ----------------------------------------------------------------------------------------
    def select(self) -> TrainedColumns:
        """The sequences this step trains, in training order (call once generation is done; changes nothing).

        Sync-like policies train every group; over-commit trains the first B complete groups in the order they
        completed (a group completes with its last sample), starved ones first; T-PPO trains the segment every
        sequence generated this step. A group's samples are trained together, in admission order.
        """
        plan = self._require_plan()
        if self._selection is not None:
            return self._selection
        groups = self.buffer.groups
        if self.config.truncated:
            chosen, complete = list(plan.active), None
        else:
            complete = sorted(self._completed, key=self._completed.__getitem__)
            if self.config.overcommit:  # starved: waited max_deferrals steps or more (ids below the bound)
                starved_below = self.buffer.admitted_after(self.step - self.config.max_deferrals)
                if complete and groups[min(complete)][0] < starved_below:  # lower group ids hold lower seq ids
                    firsts = map(itemgetter(0), map(groups.__getitem__, complete))
                    starved = list(map(gt, repeat(starved_below), firsts))
                    # starved groups first, each part in completion order
                    complete = [*compress(complete, starved), *compress(complete, map(not_, starved))]
                complete = complete[: plan.target]
            chosen = list(chain.from_iterable(map(groups.__getitem__, complete)))
        if self.generation_done:  # final: cache it for close_step
            self._selection = self._trained(chosen, complete)
            return self._selection
        return self._trained(chosen, complete)

    def finish_generation(self) -> TrainedColumns:
        """End generation: the :meth:`select` ed sequences leave the buffer to be trained, the rest is carried (or,
        for tailbatch, aborted). A pipelined backend (``async``) may plan the next step before this one closes;
        :meth:`close_step` closes the oldest finished one. Returns the sequences to train."""
        plan = self._require_plan()
        trained = self.select()
        buffer = self.buffer
        if self._running:  # stopped early by over-commit: keep what was decoded (as _stop, not finished)
            stopped = list(self._running)
            decoded = map(min, repeat(self._step_tokens), map(plan.budgets.__getitem__, stopped))  # as _decoded
            _assign(buffer.generated, stopped, map(add, map(self._prefix.__getitem__, stopped), decoded))
            self._running.clear()
        ids = trained.column("seq_id")  # complete groups (finished) unless truncated
        buffer.remove(list(compress(ids, trained.column("finished"))) if self.config.truncated else ids)
        if self.config.spec.aborts:  # tailbatch: every unfinished group is aborted, waits for a long round
            finished = buffer.finished.__getitem__
            aborted = [list(m) for m in buffer.groups.values() if not all(map(finished, m))]  # copies: lists empty
            buffer.abort(list(chain.from_iterable(aborted)))  # as their sequences leave
            self.long_queue.extend(aborted)
        left = list(buffer.ids)
        unfinished = map(not_, map(buffer.finished.__getitem__, left))
        censored = tuple(compress(map(buffer.generated.__getitem__, left), unfinished))
        lengths = LengthObservation(tuple(self._finished_lengths), censored)
        self._pending.append((plan, trained, lengths, tuple(left)))
        self.plan = None
        return trained

    def close_step(self, now: float, mean_reward: float) -> StepOutcome:
        """Train the oldest generated step's sequences (finishing its generation first if that was not done),
        update the controllers with its reward and return its outcome. A step's time runs from its plan, or from
        the previous close when it was generated ahead (pipelined), to ``now``."""
        if self.plan is not None and not self._pending:
            self.finish_generation()
        if not self._pending:
            raise RuntimeError("no generated step to close: call plan_step first")
        plan, trained, lengths, carried = self._pending.popleft()
        start_s = max(plan.start_s, self._last_close_s)
        step_s = now - start_s
        if plan.streaming:
            self.chunking.observe(plan.step, plan.chunk, step_s)
        self.delta.update(mean_reward, lengths)
        record = StepRecord(
            step=plan.step,
            start_s=start_s,
            end_s=now,
            step_s=step_s,
            mean_reward=mean_reward,
            delta=plan.delta,
            chunk=plan.chunk,
            finished=sum(trained.column("finished")),
            deferred=len(carried),
        )
        self._last_close_s = now
        return StepOutcome(trained=trained, carried=carried, record=record)

    def _decoded(self, seq_id: int) -> int:
        """Tokens a still-running sequence decoded this step."""
        return min(self._step_tokens, self.plan.budgets[seq_id])

    def _trained(self, chosen: list[int], complete: list[int] | None = None) -> TrainedColumns:
        """The records of these sequences trained now, by column, each built in C (half a million of these in a
        long simulation): a running one counts what it decoded so far. ``complete``: the groups ``chosen`` holds
        whole, in its order (every sample finished: none running), or None (T-PPO's segments: any sequence)."""
        buffer, prefix = self.buffer, list(map(self._prefix.__getitem__, chosen))
        if complete is not None or self._running.keys().isdisjoint(chosen):
            total = list(map(buffer.generated.__getitem__, chosen))
        else:
            running, decoded, generated = self._running, self._decoded, buffer.generated
            total = [p + decoded(i) if i in running else generated[i] for i, p in zip(chosen, prefix)]
        if complete is not None and buffer.group_size == 1:  # a sample's group: the one it completes
            group_ids = list(complete)
        else:
            group_ids = list(map(buffer.group_id.__getitem__, chosen))
        finished = [True] * len(chosen) if complete is not None else list(map(buffer.finished.__getitem__, chosen))
        step, admitted = repeat(self.step), list(map(buffer.admitted_step.__getitem__, chosen))
        return TrainedColumns(
            (
                list(repeat(self.step, len(chosen))),
                chosen,
                group_ids,
                admitted,
                list(map(sub, step, admitted)),  # deferrals
                total,
                list(map(sub, total, prefix)),  # decoded this step
                finished,
                list(map(sub, step, map(buffer.first_version.__getitem__, chosen))),  # policy lag
            )
        )

    def _require_plan(self) -> StepPlan:
        if self.plan is None:
            raise RuntimeError("no step in progress: call plan_step first")
        return self.plan


def _assign(column, keys, values) -> None:
    """``column[k] = v`` for each pair, in C (a list or dict column)."""
    deque(map(column.__setitem__, keys, values), maxlen=0)
