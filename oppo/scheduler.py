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

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from oppo.buffer import RolloutBuffer
from oppo.chunking import make_chunk_policy
from oppo.config import ScheduleConfig
from oppo.overcommit import LengthObservation, make_delta_controller
from oppo.records import StepRecord, TrainedSeq


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
class StepOutcome:
    trained: tuple[TrainedSeq, ...]  # in training order (finish order; starved sequences first)
    carried: tuple[int, ...]  # ids left in the buffer for the next step
    record: StepRecord


class Scheduler:
    """The scheduling core: buffer, chunk policy and Δ controller driven by one :class:`ScheduleConfig`."""

    def __init__(self, config: ScheduleConfig, prompt_limit: int | None = None) -> None:
        self.config = config
        self.buffer = RolloutBuffer(config.max_new_tokens, prompt_limit, config.group_size)
        self.chunking = make_chunk_policy(config)
        self.delta = make_delta_controller(config)
        self.step = -1
        self.plan: StepPlan | None = None
        self.long_queue: deque[list[int]] = deque()  # tailbatch: aborted groups (their seq ids), FIFO

    # -- planning ---------------------------------------------------------------------------------------
    def plan_step(self, now: float) -> StepPlan:
        if self.plan is not None:
            raise RuntimeError("plan_step called before the previous step was closed")
        self.step += 1
        cfg = self.config
        carried = list(self.buffer.seqs.values())
        long_round = cfg.policy == "tailbatch" and len(self.long_queue) >= cfg.batch
        restarted: list[int] = []
        if long_round:  # a full batch of aborted prompts, no over-provisioning
            for _ in range(cfg.batch):
                restarted += self.buffer.readmit(self.long_queue.popleft())
            new = []
        else:
            new = self.buffer.fill(cfg.batch + self.delta.value, self.step)
        seqs = self.buffer.seqs
        chunk = self.chunking.chunk_for(self.step) if cfg.streaming else 0
        budgets = {}
        for seq_id, seq in seqs.items():
            if not seq.finished:
                left = self.buffer.remaining_tokens(seq_id)
                budgets[seq_id] = min(left, cfg.window_tokens) if cfg.truncated else left
                if seq.first_version is None:  # decoded with this step's weights: one version per step
                    seq.first_version = self.step
        self.plan = StepPlan(
            step=self.step,
            start_s=now,
            active=tuple(seqs),
            new=tuple(new),
            restarted=tuple(restarted),
            resumed=tuple(s.seq_id for s in carried if not s.finished),
            ready=tuple(s.seq_id for s in carried if s.finished),
            prefix_tokens={i: s.generated_tokens for i, s in seqs.items()},
            budgets=budgets,
            # only over-commit needs mid-generation checks; otherwise a round runs until every budget is spent
            round_tokens=cfg.check_tokens if cfg.overcommit else chunk if cfg.streaming else cfg.max_new_tokens,
            streaming=cfg.streaming,
            chunk=chunk,
            delta=0 if long_round else self.delta.value,
            target=len(self.buffer.groups) if long_round else cfg.batch,
            long_round=long_round,
        )
        self._start_generation(self.plan)
        return self.plan

    def _start_generation(self, plan: StepPlan) -> None:
        # Incremental state so that a round costs O(sequences that stop in it), not O(B).
        self._step_tokens = 0  # tokens decoded this step by every sequence still running
        self._running = dict.fromkeys(plan.budgets)  # FIFO-ordered set
        self._by_budget = deque(sorted(plan.budgets, key=plan.budgets.__getitem__))  # ascending; stale ids skipped
        seqs, groups = self.buffer.seqs, self.buffer.groups
        self._group_left = {g: sum(not seqs[i].finished for i in members) for g, members in groups.items()}
        self._complete = sum(left == 0 for left in self._group_left.values())  # groups with every sample done
        self._selection: tuple[TrainedSeq, ...] | None = None
        self._since_stream = 0  # tokens decoded since the last streamed chunk
        self.stream_now = False  # after a round: a chunk is complete (or generation ended), stream it
        self._starved_waiting = {seqs[i].group_id for i in plan.budgets if self._starved(i)}  # groups waited for
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
        for seq_id, used in finished.items():
            if seq_id not in self._running:
                raise ValueError(f"seq {seq_id} reported finished but is not running")
            allowed = min(tokens, plan.budgets[seq_id] - self._step_tokens)
            if not 1 <= used <= allowed:
                raise ValueError(f"seq {seq_id} finished after {used} tokens; 1..{allowed} allowed")
        for seq_id, used in sorted(finished.items(), key=lambda item: (item[1], item[0])):
            self._stop(seq_id, self._step_tokens + used, finished=True)
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

    def _stop(self, seq_id: int, step_tokens: int, finished: bool) -> None:
        seq = self.buffer.seqs[seq_id]
        seq.generated_tokens = self.plan.prefix_tokens[seq_id] + step_tokens
        del self._running[seq_id]
        if finished:
            self._finished_lengths.append(seq.generated_tokens)
            seq.finished = True
            seq.finish_rank = (self.step, step_tokens, seq_id)
            self._group_left[seq.group_id] -= 1
            if self._group_left[seq.group_id] == 0:
                self._complete += 1
                self._starved_waiting.discard(seq.group_id)

    @property
    def generation_done(self) -> bool:
        """Sync-like policies wait for every sequence; over-commit stops at B complete groups, starved ones
        included, checked at multiples of ``check_tokens`` only, so the decision does not depend on the chunk
        size."""
        plan = self._require_plan()
        if not self._running:
            return True
        if not self.config.overcommit or self._step_tokens % self.config.check_tokens:
            return False
        return self._complete >= plan.target and not self._starved_waiting

    def _starved(self, seq_id: int) -> bool:
        return self.buffer.seqs[seq_id].deferrals(self.step) >= self.config.max_deferrals

    # -- closing ----------------------------------------------------------------------------------------
    def select(self) -> tuple[TrainedSeq, ...]:
        """The sequences this step trains, in training order (call once generation is done; changes nothing).

        Sync-like policies train every group; over-commit trains the first B complete groups in the order they
        completed (a group completes with its last sample), starved ones first; T-PPO trains the segment every
        sequence generated this step. A group's samples are trained together, in admission order.
        """
        plan = self._require_plan()
        if self._selection is not None:
            return self._selection
        seqs, groups = self.buffer.seqs, self.buffer.groups
        if self.config.truncated:
            chosen = list(plan.active)
        else:
            complete = [g for g, left in self._group_left.items() if left == 0]
            complete.sort(key=lambda g: max(seqs[i].finish_rank for i in groups[g]))
            if self.config.overcommit:
                starved = {g for g in complete if self._starved(groups[g][0])}
                complete = sorted(complete, key=lambda g: g not in starved)[: plan.target]
            chosen = [i for g in complete for i in groups[g]]
        if self.generation_done:  # final: cache it for close_step
            self._selection = tuple(self._trained(i) for i in chosen)
            return self._selection
        return tuple(self._trained(i) for i in chosen)

    def close_step(self, now: float, mean_reward: float) -> StepOutcome:
        """Train the :meth:`select` ed sequences, carry the rest, update the controllers with the step's reward."""
        plan = self._require_plan()
        trained = self.select()
        for seq_id in list(self._running):  # stopped early by over-commit: keep what was decoded
            self._stop(seq_id, self._decoded(seq_id), finished=False)
        self.buffer.remove([t.seq_id for t in trained if t.finished])
        if self.config.policy == "tailbatch":  # aborted: every unfinished group waits for a long round
            groups = self.buffer.groups
            for members in [m for m in groups.values() if not all(self.buffer.seqs[i].finished for i in m)]:
                self.long_queue.append([s.seq_id for s in self.buffer.abort(members)])
        step_s = now - plan.start_s
        if plan.streaming:
            self.chunking.observe(self.step, plan.chunk, step_s)
        censored = tuple(s.generated_tokens for s in self.buffer.seqs.values() if not s.finished)
        self.delta.update(mean_reward, LengthObservation(tuple(self._finished_lengths), censored))
        record = StepRecord(
            step=self.step,
            start_s=plan.start_s,
            end_s=now,
            step_s=step_s,
            mean_reward=mean_reward,
            delta=plan.delta,
            chunk=plan.chunk,
            finished=sum(t.finished for t in trained),
            deferred=len(self.buffer),
        )
        self.plan = None
        return StepOutcome(trained=trained, carried=tuple(self.buffer.seqs), record=record)

    def _decoded(self, seq_id: int) -> int:
        """Tokens a still-running sequence decoded this step."""
        return min(self._step_tokens, self.plan.budgets[seq_id])

    def _trained(self, seq_id: int) -> TrainedSeq:
        plan, seq = self.plan, self.buffer.seqs[seq_id]
        total = plan.prefix_tokens[seq_id] + self._decoded(seq_id) if seq_id in self._running else seq.generated_tokens
        return TrainedSeq(
            step=self.step,
            seq_id=seq_id,
            group_id=seq.group_id,
            admitted_step=seq.admitted_step,
            deferrals=seq.deferrals(self.step),
            response_tokens=total,
            step_tokens=total - plan.prefix_tokens[seq_id],
            finished=seq.finished,
            policy_lag=self.step - seq.first_version,
        )

    def _require_plan(self) -> StepPlan:
        if self.plan is None:
            raise RuntimeError("no step in progress: call plan_step first")
        return self.plan
