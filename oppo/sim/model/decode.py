"""The actor's decode rounds in the simulator: a step's running rows, a round's busy seconds per GPU, the chunks
streamed to the scorers while it decodes.

A step runs ~16 rounds at B = 112 and ~24 at B = 512, hundreds of thousands in a plan, so a round's fixed cost
matters more than its per-row cost: the rows are sorted once per step by the token at which each stops, a round's
token and context sums come from prefix sums over that order, and the left-padded batch's per-GPU busy seconds
from each GPU's last row (no per-round arrays). Every float is computed in the order numpy's ``cumsum`` would:
the records are the same bytes as when each round built its arrays.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

import numpy as np

from oppo.sim.cost.engine import pass_attended


def new_chunk(batch: int, tokens: int, context: int) -> tuple[int, int, int, float]:
    """A streamed chunk: (rows, new tokens, cached tokens, attended pairs)."""
    return batch, tokens, context, pass_attended(tokens, context, batch)


class DecodeBatch:
    """A step's decode rows, sorted by the step token at which each stops (stable: admission order among equals),
    so that the rows stopping in a round are the first ones still running. Python lists of length ``rows``:
    ``ids``, ``stop`` (tokens into the step: EOS or the end of the budget), ``eos`` (it stops by EOS),
    ``context`` (prompt and resumed prefix), ``gpu`` (the generating GPU that decodes it); the numpy arrays of
    the same (``*_a``) for the compacting engines' per-position pricing."""

    def __init__(self, ids: np.ndarray, stop: np.ndarray, eos: np.ndarray, context: np.ndarray, gpus: int) -> None:
        order = stop.argsort(kind="stable")
        self.ids_a, self.stop_a, self.context_a = ids[order], stop[order], context[order]
        self.gpu_a = self.ids_a % gpus
        self.ids, self.stop, self.eos = self.ids_a.tolist(), self.stop_a.tolist(), eos[order].tolist()
        self.rows = len(self.ids)
        self._stop_sum = _prefix_sums(self.stop_a)  # [i]: stop summed over rows < i
        self._context_sum = _prefix_sums(self.context_a)
        last = np.full(gpus, -1)  # each GPU's last row in this order (-1: none); it decodes longest there
        np.maximum.at(last, self.gpu_a, np.arange(self.rows))
        self.last_row = last.tolist()

    def end(self, first: int, until: int) -> int:
        """Rows before it have stopped by step token ``until`` (``first``: the first row still running)."""
        return bisect_right(self.stop, until, first)

    def tokens(self, first: int, end: int, step_tokens: int, n: int) -> int:
        """Tokens a round of ``n`` decodes: rows first..end stop in it, the rest decode n each."""
        return self._stop_sum[end] - self._stop_sum[first] - (end - first) * step_tokens + (self.rows - end) * n

    def context_tokens(self, first: int, step_tokens: int) -> int:
        """Context of the running rows at the round's start, summed."""
        return self._context_sum[-1] - self._context_sum[first] + (self.rows - first) * step_tokens

    def last_tokens(self, first: int, end: int, step_tokens: int, n: int) -> list[int]:
        """Tokens each GPU decodes in the round, shape (gpus,): its last row's (0 where it has none running)."""
        stop = self.stop
        return [n if r >= end else stop[r] - step_tokens if r >= first else 0 for r in self.last_row]

    def finished(self, first: int, end: int, step_tokens: int) -> dict[int, int]:
        """The rows that reach EOS in the round: id -> tokens decoded in it."""
        rows = zip(self.ids[first:end], self.stop[first:end], self.eos[first:end])
        return {i: stop - step_tokens for i, stop, eos in rows if eos}


def _prefix_sums(values: np.ndarray) -> list[int]:
    """``list(accumulate(values, initial=0))`` by numpy, as Python ints (integers: exact), shape (len + 1,)."""
    sums = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=sums[1:])
    return sums.tolist()


class Generation:
    """The generating device's part of a step (a mixin of :class:`~oppo.sim.model.trainer.Trainer`): decode rounds until
    the scheduler says the batch is complete, chunks streamed to the scorers, colocated prefills co-run."""

    def _generate(self, plan, pending, rows: DecodeBatch):
        """Decode rounds until the scheduler says the step's batch is complete."""
        env, sched, actor = self.env, self.scheduler, self.device[self.gen]
        first, step_tokens, fused = 0, 0, pending  # fused: a chunk to co-run with the next round
        decoded = None  # since the last stream: (most rows in a round, tokens, context at its first round)
        done = sched.generation_done
        while not done:
            n = sched.next_round_tokens()
            end = rows.end(first, step_tokens + n)  # rows first..end stop in this round, the rest decode n tokens
            busy_s = self._round_s(rows, first, end, step_tokens, n)
            batch, tokens = rows.rows - first, rows.tokens(first, end, step_tokens, n)
            context_tokens = rows.context_tokens(first, step_tokens)
            yield from self._hold(actor, plan.step, max(busy_s), fused, batch, tokens, context_tokens, busy_s)
            fused = None
            if decoded is None:
                decoded = (batch, tokens, context_tokens)
            else:
                decoded = (max(decoded[0], batch), decoded[1] + tokens, decoded[2])
            done = sched.report_round(env.now, n, rows.finished(first, end, step_tokens))
            first, step_tokens = end, step_tokens + n
            if sched.stream_now:  # the chunk, priced once it is complete
                chunk = new_chunk(*decoded)
                yield from self._stream(plan.step, chunk)
                fused, decoded = (chunk if self.fused else None), None
        if fused is not None:  # the last chunk is prefilled alone
            yield from self._fused_prefill(plan.step, fused)

    def _round_s(self, rows: DecodeBatch, first: int, end: int, step_tokens: int, n: int) -> list[float]:
        """Busy seconds of each generating GPU in a round of ``n`` tokens from step token ``step_tokens``."""
        if self.engine.compacts_batch:
            k = np.minimum(rows.stop_a[first:], step_tokens + n) - step_tokens  # tokens each running row decodes
            context = rows.context_a[first:] + step_tokens
            return self._decode_s(k, context, n, rows.gpu_a[first:], step_tokens).tolist()
        # left-padded: the batch is whole until its last row stops, a GPU busy until its own last row stops
        elapsed = list(accumulate(self._padded_s[step_tokens : step_tokens + n], initial=0.0))  # as np.cumsum
        return [elapsed[k] for k in rows.last_tokens(first, end, step_tokens, n)]

    def _running_rows(self, plan) -> tuple[DecodeBatch, np.ndarray]:
        """The rows this step decodes (see :class:`DecodeBatch`) and their contexts in admission order, shape
        (rows,); prices the left-padded batch once per step."""
        budgets, prefix = plan.budgets, plan.prefix_tokens
        listed = list(budgets)  # the unfinished active ones, in admission order
        ids = np.array(listed, dtype=np.int64)
        budget = np.fromiter(budgets.values(), np.int64, len(listed))
        decoded = np.fromiter(map(prefix.__getitem__, listed), np.int64, len(listed))  # looked up in C
        rest = self.lengths.response[ids] - decoded  # tokens to EOS
        context = self.lengths.prompt[ids] + decoded
        self._decode_rows = len(ids)  # rows in the (non-compacting) decode batch
        self._decode_width = int(context.max(initial=0))  # its left-padded width
        stop = np.minimum(budget, rest)
        if not self.engine.compacts_batch:  # per-position seconds up to the last stop, as Python floats (sliced
            # per round: a round's rows all stop by then, or it ends before it; each position priced on its own)
            last = int(stop.max(initial=0))
            self._padded_s = self._padded_decode_s(self._decode_rows, self._decode_width, last).tolist()
        return DecodeBatch(ids, stop, rest <= budget, context, len(self.device[self.gen].members)), context

    def _hold(self, actor, step: int, seconds: float, fused, rows: int, tokens: int, context: int, busy_s):
        """One decode round on the generating device (with a colocated scorer's prefill of the previous chunk)."""
        request = actor.resource.request() if actor.shared else None  # see Device.shared
        if request is not None:
            yield request
        total = self._co_run_fused(step, seconds, fused)
        actor.record(step, "actor", "decode", self.env.now, seconds, rows, tokens, context, busy_s)
        yield self.env.timeout(total)
        if request is not None:
            actor.resource.release(request)

    def _stream(self, step: int, chunk):
        """Hand a complete chunk to the scorers; the actor stalls ``chunk_handoff_s`` to do it."""
        if self.handoff_s > 0:
            yield from self.device[self.gen].run(step, "actor", "other", self.handoff_s, chunk[0], chunk[1], 0)
        for scorer in self.scorers:
            scorer.submit(step, *chunk)

    def _decode_s(self, k: np.ndarray, context: np.ndarray, n: int, gpu: np.ndarray, offset: int) -> np.ndarray:
        """Busy seconds of each actor GPU in a round where row i decodes k[i] tokens from context[i] on GPU
        gpu[i]. The batch shrinks as rows finish: integrated per token position (vectorised, not one event
        per token); a GPU is busy until its own last row stops (data-parallel generation)."""
        if self.engine.compacts_batch:  # finished rows leave the batch
            t = np.arange(1, n + 1)
            stopped = np.cumsum(np.bincount(k, minlength=n + 1))[:n]  # rows done before position t
            batch = len(k) - stopped  # rows still decoding at position t
            ctx = context.sum() - np.cumsum(np.bincount(k, weights=context, minlength=n + 1))[:n] + (t - 1) * batch
            per_token = np.where(batch > 0, self.costs[self.gen].decode_s(np.maximum(batch, 1), ctx), 0.0)
        else:  # every row of the left-padded batch is computed until the last one stops: priced once per step
            per_token = np.array(self._padded_s[offset : offset + n])
        elapsed = np.concatenate([[0.0], np.cumsum(per_token)])  # seconds until position t
        last = np.zeros(len(self.device[self.gen].members), dtype=np.int64)
        np.maximum.at(last, gpu, k)
        return elapsed[last]

    def _padded_decode_s(self, rows: int, width: int, positions: int) -> np.ndarray:
        """Seconds of each decode position 0, 1, ... of a step's left-padded batch: ``rows`` rows, each attending
        to ``width`` + position tokens, shape (positions,). Only positions up to the last running row's stop
        are read (:meth:`_round_s`), where the batch is still whole."""
        batch = np.full(positions, rows)
        return self.costs[self.gen].decode_s(np.maximum(batch, 1), batch * (width + np.arange(positions)))

    def _co_run_fused(self, step: int, decode_s: float, pending) -> float:
        """Colocated streaming: the previous chunk's prefill shares the device with this round's decode."""
        if not self.fused or pending is None:
            return decode_s
        batch, tokens, context, attended = pending
        prefill_s = sum(self.costs[r].prefill_s(tokens, attended, rows=batch) for r in self.fused)
        hidden = self.config.setup.contention.colocated_overlap_frac * min(decode_s, prefill_s)
        total = decode_s + prefill_s - hidden
        start = self.env.now + total - prefill_s  # the prefills end with the round, the hidden part under decode
        for role in self.fused:
            seconds = self.costs[role].prefill_s(tokens, attended, rows=batch)
            self.device[role].record(step, role, "prefill", start, seconds, batch, tokens, context)
            start += seconds
        return total

    def _fused_prefill(self, step: int, pending):
        batch, tokens, context, attended = pending
        for role in self.fused:
            seconds = self.costs[role].prefill_s(tokens, attended, rows=batch)
            yield from self.device[role].run(step, role, "prefill", seconds, batch, tokens, context)
