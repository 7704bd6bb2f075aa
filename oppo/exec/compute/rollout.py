"""The actor's generation of a step, timed: one prefill of the rows it decodes, then decode rounds.

Used by a rank of the actor group (:class:`oppo.exec.step.rank.ActorRank`, which also streams the rounds to its
scorers) and by an asynchronous rollout worker (:class:`~oppo.exec.distributed.rollout_worker.RolloutWorker`), so both
decode, and record, alike.
"""

from __future__ import annotations

from oppo.exec.compute.timing import Recorder
from oppo.exec.engines.hf import ChunkedDecoder

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
                self.actor, rows, budgets, self.eos_id, self.pad_id, keys, self.temperature, forced, done,
                top_k=self.top_k, top_p=self.top_p,
            )  # fmt: skip

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
