"""The actor's generation of a step, timed: one prefill of the rows it decodes, then decode rounds.

Used by a rank of the actor group (:class:`oppo.exec.step.rank.ActorRank`, which also streams the rounds to its
scorers) and by an asynchronous rollout worker (:class:`~oppo.exec.distributed.rollout_worker.RolloutWorker`), so both
decode, and record, alike.
"""

from __future__ import annotations

import math
import time

from oppo.exec.compute.timing import Recorder
from oppo.exec.config import ExecConfig
from oppo.exec.engines.hf import ChunkedDecoder
from oppo.exec.engines.vllm_engine import EngineError
from oppo.records.schema import TraceRow, engine_lane

# A decode row of the trace covers at most this many iterations, so that a step's rows span its contexts (from the
# prompt's to the longest response's): a calibration on a run that decodes in one round per step (sync) could not
# tell the per-context cost from the per-iteration one.
RECORDED_ITERATIONS = 16


class Rollout:
    def __init__(
        self,
        actor,
        eos_id: int,
        pad_id: int,
        temperature: float,
        recorder: Recorder,
        label: str,
        top_k: int = 0,
        top_p: float = 1.0,
    ) -> None:
        """``label``: the device in the records; ``temperature``, ``top_k``, ``top_p``: the sampling's."""
        self.actor, self.eos_id, self.pad_id, self.temperature = actor, eos_id, pad_id, temperature
        self.top_k, self.top_p = top_k, top_p
        self.rec, self.label = recorder, label
        self.decoder: ChunkedDecoder | None = None
        self.rows: list[int] = []  # sequence id of each decoder row

    def begin(self, step: int, tokens: dict[int, list[int]], decoding: list[tuple]) -> None:
        """Prefill the rows of ``decoding`` ((seq id, token budget, sampling key, forced length or None, response
        tokens so far)), whose contexts are ``tokens[seq id]``."""
        self.rows, self.decoder = [row[0] for row in decoding], None
        self.contexts, self.decoding = tokens, {row[0]: row for row in decoding}
        if not decoding:
            return
        rows = [tokens[seq_id] for seq_id in self.rows]
        with self.rec.op(step, self.label, "actor", "prefill", batch=len(rows)) as info:
            info["tokens"] = len(rows) * max(map(len, rows))  # left-padded: every row computes the width
            budgets, keys, forced, done = ([row[k] for row in decoding] for k in range(1, 5))
            self.decoder = ChunkedDecoder(
                self.actor,
                rows,
                budgets,
                self.eos_id,
                self.pad_id,
                keys,
                self.temperature,
                forced,
                done,
                top_k=self.top_k,
                top_p=self.top_p,
            )

    def decode(self, step: int, n: int) -> tuple[dict[int, int], dict[int, list[int]], dict[int, list[float]]]:
        """Up to ``n`` iterations, timed in rounds of at most :data:`RECORDED_ITERATIONS`. Returns ({seq id: tokens
        decoded this call} of those that hit EOS, {seq id: its new tokens}, {seq id: their behaviour log-probs})."""
        decoder = self.decoder
        if decoder is None:
            return {}, {}, {}
        finished: dict[int, int] = {}
        chunk: list[list[int]] = [[] for _ in self.rows]
        logprobs: list[list[float]] = [[] for _ in self.rows]
        while n > 0 and decoder.running.any():
            done, tokens, logps = self._timed_round(step, min(n, RECORDED_ITERATIONS))
            n -= min(n, RECORDED_ITERATIONS)
            for r in range(len(self.rows)):
                chunk[r] += tokens[r]
                logprobs[r] += logps[r]
            finished |= {r: len(chunk[r]) for r in done}  # a row stops at its EOS: all it decoded this call
        new = {self.rows[r]: tokens for r, tokens in enumerate(chunk) if tokens}
        behaviour = {self.rows[r]: lp for r, lp in enumerate(logprobs) if lp}
        return {self.rows[r]: k for r, k in finished.items()}, new, behaviour

    def _timed_round(self, step: int, n: int) -> tuple[dict[int, int], list[list[int]], list[list[float]]]:
        decoder = self.decoder
        with self.rec.op(step, self.label, "actor", "decode") as info:
            # every row of the batch is computed each iteration, stopped ones too (as in HF generate):
            # tokens processed = iterations x rows; context = cached positions of all rows at the start
            rows = len(self.rows)
            info["batch"], info["context"] = rows, decoder.width * rows + decoder.iterations * rows
            before = decoder.iterations
            out = decoder.decode(n)
            info["tokens"] = (decoder.iterations - before) * rows
        return out

    def refill(self, step: int) -> None:
        """After the actor's weights changed mid-generation (in-flight updates): the rows still running continue
        from a prefill of their context and the tokens decoded so far under the new weights, so every later token
        is sampled from, and its behaviour log-prob is of, the new policy exactly. (Keeping the stale KV cache, as
        PipelineRL does, would save this prefill but sample from a mix that is no version's policy.) Sampling
        noise is keyed by response position, so the tokens do not depend on where the switch fell."""
        decoder = self.decoder
        if decoder is None or not decoder.running.any():
            return
        tokens, decoding = {}, []
        for r in decoder.running.nonzero().flatten().tolist():
            seq_id, budget, key, forced, done = self.decoding[self.rows[r]]
            decoded = len(decoder.new_tokens[r])
            tokens[seq_id] = self.contexts[seq_id] + decoder.new_tokens[r]
            decoding.append((seq_id, budget - decoded, key, forced, done + decoded))
        self.begin(step, tokens, decoding)

    def end(self) -> None:
        self.decoder = None

    @property
    def running(self) -> bool:
        """Whether a row of the step still decodes."""
        return self.decoder is not None and bool(self.decoder.running.any())

    def updated(self) -> None:
        """The trainer changed the actor's weights: this loop decodes with the live module, nothing to move."""

    def halt(self) -> None:
        """The step's generation is over: nothing runs between rounds here."""

    def engine_stats(self) -> None:
        """No engine of its own: no preemptions or prefix cache to report."""

    def close(self) -> None:
        """Nothing to stop."""


class EngineRollout:
    """The actor's generation on a rollout engine in a process of its own (:class:`~oppo.exec.engines.vllm_engine.
    VllmEngine`), with :class:`Rollout`'s methods, so the scheduling core decides alike on either.

    The engine generates between calls: :meth:`decode` hands the core at most ``n`` new tokens per sequence and keeps
    what the engine ran ahead for the next call, so the core sees the rounds it asked for. Sequences the step leaves
    unfinished are aborted in the engine at :meth:`end` (their KV blocks freed) and resume next step as prompt +
    partial response under the new weights. Trace rows: the engine's own iterations on a lane of their own
    (``<label>/vllm``): ``prefill`` for a pass with prompt tokens (the running requests' decode tokens in the same
    pass are counted in it), else ``decode`` (``batch``: the requests in the pass, ``context``: the tokens already in
    their KV caches); on the trainer's lane, ``sync`` for each weight push. The trainer's waits on the engine are
    the gaps on its own lane."""

    def __init__(self, engine, actor, recorder: Recorder, label: str, sampling: dict) -> None:
        """``engine``: a started engine on ``actor``'s checkpoint; ``sampling``: temperature, top_k, top_p."""
        self.engine, self.actor, self.rec, self.label = engine, actor, recorder, label
        self.sampling = sampling
        self.stale = False  # the trainer updated the actor since the engine's weights were loaded
        self.requests = 0  # requests made so far: each gets an id of its own
        self.seq_of: dict[str, int] = {}  # live request id -> seq id
        self.buffer: dict[int, list[tuple[int, float]]] = {}  # seq id -> (token, log-prob) not yet handed over
        self.handed: dict[int, list[int]] = {}  # seq id -> tokens handed over this step
        self.over: dict[int, bool] = {}  # seq id -> the engine ended it (on EOS: True; at its budget: False)
        self.contexts: dict[int, list[int]] = {}
        self.decoding: dict[int, tuple] = {}
        self.lane = engine_lane(label, engine.name)  # the engine's own process
        self.began: list[tuple[float, int]] = []  # (time, step) at each begin: which step an iteration served
        self.budgets: dict[int, int] = {}  # seq id -> tokens its live request may still make
        self.forced_end: set[int] = set()  # seq ids whose live request ends at their traced length (EOS put there)

    # -- weights ----------------------------------------------------------------------------------------
    def updated(self) -> None:
        """The trainer changed the actor's weights: the engine takes them before it generates again."""
        self.stale = True

    def refresh(self, step: int) -> None:
        """Push the actor's weights into the engine if they changed (a ``sync`` row: what verl times as the
        reshard / weight update)."""
        if not self.stale:
            return
        with self.rec.op(step, self.label, "actor", "sync", batch=1) as info:
            state = self.actor.state_dict()
            info["tokens"] = sum(v.numel() for v in state.values())  # parameters moved
            self.engine.load_weights(state)
        self.stale = False

    # -- a step's generation ---------------------------------------------------------------------------
    def begin(self, step: int, tokens: dict[int, list[int]], decoding: list[tuple]) -> None:
        """Send the rows of ``decoding`` ((seq id, budget, sampling key, forced length (None), response tokens so
        far)) to the engine, with contexts ``tokens[seq id]``."""
        self.engine.wake()  # (CUDA) the weights back on the device before new ones are loaded into them
        self.refresh(step)
        self.contexts, self.decoding = tokens, {row[0]: row for row in decoding}
        self.buffer = {row[0]: [] for row in decoding}
        self.handed, self.over = {row[0]: [] for row in decoding}, {}
        self._handed_before = {row[0]: 0 for row in decoding}  # handed over before its live request began
        self.began = self.began[-1:] + [(self.rec.now(), step)]  # an iteration is collected at most a step late
        for seq_id, budget, key, forced, done in decoding:
            self._request(seq_id, tokens[seq_id], budget, key, done, forced)

    def _request(
        self, seq_id: int, context: list[int], budget: int, key: int, position: int, forced: int | None
    ) -> None:
        """Ask the engine for up to ``budget`` tokens after ``context``, the response's token ``position`` next. The
        request's generator is seeded by the sequence's key and that position: a resumed sequence draws fresh noise,
        not again the noise its first tokens drew (vLLM restarts a request's generator from its seed).

        ``forced``: a traced response length (``--lengths``), as the hf loop forces it: EOS is banned before it
        (vLLM's ``min_tokens``: the request makes every token it is asked for) and the token at that length is EOS,
        put in place of the one the engine sampled there. The engine gives no log-prob of that EOS: NaN (the
        trainer's recomputed log-probs train; the engine-trainer gap leaves it out), and its log-probs before it are
        of the distribution with EOS banned (renormalised without it)."""
        request = f"{seq_id}.{self.requests}"
        self.requests += 1
        self.seq_of[request] = seq_id
        sampling = self.sampling
        if forced is not None:
            budget = min(budget, forced - position)
            sampling = sampling | {"min_tokens": budget}
            if position + budget == forced:
                self.forced_end.add(seq_id)
        self.budgets[seq_id] = budget
        self.engine.add(request, context, budget, resumed_seed(key, position), sampling)

    def decode(self, step: int, n: int) -> tuple[dict[int, int], dict[int, list[int]], dict[int, list[float]]]:
        """At most ``n`` new tokens per sequence: ({seq id: tokens handed over} of those that hit EOS among them,
        {seq id: new tokens}, {seq id: their log-probs under the engine's weights})."""
        if any(self._owed(s, n) for s in self.buffer):
            self._wait(step, n)
        finished, new, logprobs = {}, {}, {}
        for seq_id, pending in self.buffer.items():
            handed, self.buffer[seq_id] = pending[:n], pending[n:]
            if not handed:
                continue
            new[seq_id], logprobs[seq_id] = [t for t, _ in handed], [lp for _, lp in handed]
            self.handed[seq_id] += new[seq_id]
            if self.over.get(seq_id) and not self.buffer[seq_id]:  # its last token, the EOS, handed over now
                finished[seq_id] = len(handed)
        return finished, new, logprobs

    @property
    def running(self) -> bool:
        """Whether a sequence of the step still has tokens to come (from the engine, or held here)."""
        return bool(self.seq_of) or any(self.buffer.values())

    def _owed(self, seq_id: int, n: int) -> bool:
        """Whether the engine still owes ``seq_id`` tokens for a round of ``n``."""
        return seq_id not in self.over and len(self.buffer[seq_id]) < n

    def _wait(self, step: int, n: int) -> None:
        while any(self._owed(s, n) for s in self.buffer):
            self._take(step, self.engine.poll())
        self._record_iterations()

    def _record_iterations(self) -> None:
        """The engine's iterations collected so far, as trace rows on its lane, each in the step that was generating
        when it ended (an iteration collected late, after the trainer moved on, keeps its own time and step)."""
        offset = self.rec.now() - time.monotonic()  # engine times (monotonic, any process) -> the run's axis
        for it in self.engine.take_iterations():
            start, end = it.end_s - it.elapsed_s + offset, it.end_s + offset
            step = next((s for began, s in reversed(self.began) if began <= end), self.began[0][1])
            if it.prefill_tokens:  # the running requests' decode tokens in the same pass count in it
                requests, tokens = it.prefill_requests + it.decode_requests, it.prefill_tokens + it.decode_tokens
                sizes = (requests, tokens, it.decode_context)
            else:
                sizes = (it.decode_requests, it.decode_tokens, it.decode_context)
            phase = "prefill" if it.prefill_tokens else "decode"
            self.rec.add(TraceRow(step, self.lane, "actor", phase, start, end, *sizes))

    def _take(self, step: int, outputs: dict) -> None:
        for request, out in outputs.items():
            seq_id = self.seq_of.get(request)
            if seq_id is None:  # aborted since (its last tokens were on their way)
                continue
            self.buffer[seq_id] += zip(out.tokens, out.logprobs)
            if out.finished:
                self.over[seq_id] = out.eos
                del self.seq_of[request]
                made = len(self.buffer[seq_id]) + len(self.handed[seq_id]) - self._handed_before[seq_id]
                if not out.eos and made < self.budgets[seq_id]:  # the core would count tokens that never come
                    raise EngineError(
                        f"the engine ended sequence {seq_id} after {made} of its {self.budgets[seq_id]} tokens "
                        "without EOS"
                    )
                if seq_id in self.forced_end:  # its traced length: EOS there
                    self.buffer[seq_id][-1] = (self.engine.eos_id, math.nan)
                    self.over[seq_id] = True
                    self.forced_end.discard(seq_id)

    def refill(self, step: int) -> None:
        """After new weights mid-generation: every sequence with tokens still to come (a running request, or tokens
        the engine made ahead that were not handed over) goes on from its context and the tokens handed over so far,
        under the new weights; what the engine made ahead with the old ones is dropped, so every token handed over
        from here on is the new version's."""
        ahead = {s for s in self.seq_of.values()} | {s for s, pending in self.buffer.items() if pending}
        self._abort()
        self.refresh(step)
        for seq_id in sorted(ahead):
            _, budget, key, forced, done = self.decoding[seq_id]
            self.buffer[seq_id] = []
            self.over.pop(seq_id, None)
            handed = self.handed[seq_id]
            self._handed_before[seq_id] = len(handed)
            self.forced_end.discard(seq_id)
            context = self.contexts[seq_id] + handed
            self._request(seq_id, context, budget - len(handed), key, done + len(handed), forced)

    def _abort(self) -> None:
        self.engine.abort(list(self.seq_of))
        self.seq_of = {}
        self.forced_end = set()

    def halt(self) -> None:
        """The step has what it trains: the requests still running are aborted now (their KV blocks freed), so the
        engine does not decode, with the old weights, tokens that would be dropped while the trainer scores and
        trains (the sequences resume from what was handed over)."""
        self._abort()
        self._record_iterations()

    def end(self) -> None:
        """Abort what is still generating (carried sequences resume from their tokens next step)."""
        self._abort()
        self._record_iterations()
        self.buffer, self.handed, self.over, self.decoding = {}, {}, {}, {}
        self.engine.sleep()

    def engine_stats(self):
        """The engine's counts since the last call (:class:`~oppo.exec.engines.vllm_engine.EngineStats`)."""
        return self.engine.stats.take()

    def answers(self, prompts: list[list[int]], budget: int, keys: list[int], greedy: bool) -> list[list[int]]:
        """Each prompt's answer under the actor's current weights, until EOS or ``budget`` tokens (held-out
        evaluation: its requests run alone, between two steps, off the run's clock). Weights the trainer changed are
        loaded without a trace row and stay marked as changed: the next step loads them again on its clock, as every
        step does (one more push per evaluation, so that every step's records read alike)."""
        self.engine.wake()
        if self.stale:
            self.engine.load_weights(self.actor.state_dict())
        sampling = {"temperature": 0.0} if greedy else self.sampling
        requests = {}  # request id -> prompt index
        for i, (prompt, key) in enumerate(zip(prompts, keys)):
            request = f"eval{i}.{self.requests}"
            self.requests += 1
            requests[request] = i
            self.engine.add(request, prompt, budget, key, sampling)
        out: list[list[int]] = [[] for _ in prompts]
        while self.engine.busy:
            for request, result in self.engine.poll().items():
                out[requests[request]] += result.tokens
        self.engine.take_iterations()  # off the clock: no rows
        self.engine.sleep()
        return out

    def close(self) -> None:
        self.engine.close()


def resumed_seed(key: int, position: int) -> int:
    """A request's seed: the sequence's sampling key mixed with the response position it starts at (64 bits)."""
    return (key * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) % 2**63


def make_rollout(config: ExecConfig, actor, eos_id: int, pad_id: int, recorder: Recorder, label: str):
    """The rollout of ``config``'s engine for ``actor`` (its checkpoint folder is what a vLLM engine loads first)."""
    ppo = config.ppo
    if config.rollout.rollout_engine == "hf":
        return Rollout(actor, eos_id, pad_id, ppo.temperature, recorder, label, ppo.top_k, ppo.top_p)
    from oppo.exec.engines.vllm_engine import VllmEngine, check_budget, check_model
    from oppo.exec.models.roles import role_paths

    task = config.task
    max_model_len = max(task.prompt_tokens, task.max_prompt_tokens) + config.schedule.max_new_tokens
    dtype, device = next(actor.parameters()).dtype, str(next(actor.parameters()).device)
    check_model(actor.config, device, config.model.preset)
    check_budget(config.rollout.engine_memory, actor.config, dtype, max_model_len, device)
    engine = VllmEngine(
        role_paths(config.model)["actor"],
        dtype,
        config.rollout.engine_memory,
        max_model_len,
        eos_id,
        seed=config.seed,
        eager=config.rollout.engine_eager,
        device=device,
    )
    sampling = {"temperature": ppo.temperature, "top_k": ppo.top_k, "top_p": ppo.top_p}
    return EngineRollout(engine, actor, recorder, label, sampling)
