"""EngineRollout's bookkeeping against a scripted engine (no vLLM): rounds of at most n tokens, EOS, tokens the
engine made ahead, aborts and resumptions, in-flight new weights, weight pushes and their trace rows."""

from __future__ import annotations

import math
import time

import pytest
import torch

from oppo.exec.compute.rollout import EngineRollout, resumed_seed
from oppo.exec.compute.timing import Recorder
from oppo.exec.engines.vllm_engine import EngineError, EngineStats, Iteration, Output

EOS = 2


class ScriptedEngine:
    """An engine whose requests make the tokens of ``script[seq id]`` (from the token their context already holds),
    ``ahead`` tokens a poll, ending on EOS if the script has one, else at the request's budget; each poll is reported
    as one iteration (its first for a request as its prefill)."""

    name = "scripted"

    def __init__(self, script: dict[int, list[int]], ahead: int = 3) -> None:
        self.script, self.ahead, self.eos_id = script, ahead, EOS
        self.stats = EngineStats()
        self.requests: dict[str, dict] = {}
        self.added: list[tuple] = []  # (request, context, budget, seed)
        self.aborted: list[str] = []
        self.loads = 0
        self.iterations: list[Iteration] = []

    def take_iterations(self):
        taken, self.iterations = self.iterations, []
        return taken

    def add(self, request, context, budget, seed, sampling):
        seq_id = int(request.split(".")[0].removeprefix("eval"))  # held-out requests: eval<prompt index>
        start = len(context) - 1  # contexts here are [seq id] + response so far
        self.requests[request] = {"seq": seq_id, "at": start, "left": budget, "context": len(context), "new": True}
        self.added.append((request, list(context), budget, seed, sampling))

    def poll(self):
        out = {}
        fresh = [r for r in self.requests.values() if r["new"]]
        decoding = [r for r in self.requests.values() if not r["new"]]
        self.iterations.append(
            Iteration(
                end_s=time.monotonic(),
                elapsed_s=1e-3,
                prefill_requests=len(fresh),
                prefill_tokens=sum(r["context"] for r in fresh),
                decode_requests=len(decoding),
                decode_tokens=len(decoding),
                decode_context=sum(r["context"] for r in decoding),
            )
        )
        for request, r in list(self.requests.items()):
            r["new"] = False
            tokens = self.script[r["seq"]][r["at"] : r["at"] + min(self.ahead, r["left"])]
            r["at"] += len(tokens)
            r["left"] -= len(tokens)
            r["context"] += len(tokens)
            eos = bool(tokens) and tokens[-1] == EOS
            finished = eos or r["left"] == 0 or r["at"] >= len(self.script[r["seq"]])
            out[request] = Output(tokens, [-0.5] * len(tokens), finished, eos)
            if finished:
                del self.requests[request]
        self.stats.iterations += 1
        return out

    def abort(self, requests):
        for request in requests:
            self.requests.pop(request, None)
            self.aborted.append(request)

    @property
    def busy(self):
        return bool(self.requests)

    def load_weights(self, state):
        self.loads += 1

    def wake(self):
        pass

    def sleep(self):
        pass

    def close(self):
        pass


def rollout_on(engine) -> EngineRollout:
    return EngineRollout(engine, torch.nn.Linear(2, 2), Recorder(), "cpu0", {"temperature": 1.0})


def test_rounds_hand_at_most_n_tokens_and_a_sequence_finishes_when_its_eos_is_handed():
    engine = ScriptedEngine({0: [5, 6, 7, 8, EOS], 1: [9, 9, 9, 9, 9, 9, 9, 9]}, ahead=4)
    rollout = rollout_on(engine)
    rollout.begin(0, {0: [0], 1: [1]}, [(0, 8, 11, None, 0), (1, 6, 12, None, 0)])
    rounds = [rollout.decode(0, 2) for _ in range(4)]
    assert [r[1] for r in rounds] == [
        {0: [5, 6], 1: [9, 9]},
        {0: [7, 8], 1: [9, 9]},
        {0: [EOS], 1: [9, 9]},  # sequence 1 stops at its budget of 6 without EOS
        {},
    ]
    assert [r[0] for r in rounds] == [{}, {}, {0: 1}, {}]  # finished: the tokens handed in the round of its EOS
    assert not rollout.running


def test_a_request_that_ends_short_of_its_budget_without_eos_stops_the_run():
    engine = ScriptedEngine({0: [5, 6, 7]}, ahead=3)  # the script runs out: the engine "ends" it after 3 of 8
    rollout = rollout_on(engine)
    rollout.begin(0, {0: [0]}, [(0, 8, 11, None, 0)])
    with pytest.raises(EngineError, match="ended sequence 0 after 3 of its 8 tokens without EOS"):
        rollout.decode(0, 4)


def test_new_weights_in_flight_drop_every_token_made_ahead_with_the_old_ones():
    """Sequence 0 finished in the engine with tokens not yet handed over, sequence 1 still runs: both go on from
    what was handed over, under the new weights, with noise from the position they resume at."""
    engine = ScriptedEngine({0: [5, 6, EOS], 1: [7] * 10}, ahead=3)
    rollout = rollout_on(engine)
    rollout.begin(0, {0: [0], 1: [1]}, [(0, 8, 11, None, 0), (1, 8, 12, None, 0)])
    assert rollout.decode(0, 1)[1] == {0: [5], 1: [7]}  # the engine made 3 of each
    rollout.updated()
    rollout.refill(0)
    assert engine.loads == 1 and set(engine.aborted) == {"1.1"}  # the running one aborted; 0 had ended
    resumed = engine.added[2:]
    assert [(c, b, s) for _, c, b, s, _ in resumed] == [
        ([0, 5], 7, resumed_seed(11, 1)),
        ([1, 7], 7, resumed_seed(12, 1)),
    ]
    assert rollout.decode(0, 8)[1] == {0: [6, EOS], 1: [7] * 7}


def test_halt_aborts_the_requests_still_running_and_the_next_step_resumes_them():
    engine = ScriptedEngine({0: [5, 6, 7, 8, 9, EOS]}, ahead=2)
    rollout = rollout_on(engine)
    rollout.begin(0, {0: [0]}, [(0, 6, 11, None, 0)])
    assert rollout.decode(0, 2)[1] == {0: [5, 6]}
    rollout.halt()
    assert not engine.busy and engine.aborted == ["0.0"]
    rollout.end()
    rollout.begin(1, {0: [0, 5, 6]}, [(0, 4, 11, None, 2)])
    assert engine.added[-1][1:4] == ([0, 5, 6], 4, resumed_seed(11, 2))


def test_weights_are_pushed_once_per_update_as_a_sync_row_and_evaluation_keeps_the_step_records_alike():
    engine = ScriptedEngine({0: [EOS], 1: [EOS]})
    rollout = rollout_on(engine)
    rollout.begin(0, {0: [0]}, [(0, 4, 11, None, 0)])
    rollout.decode(0, 4)
    rollout.end()
    assert engine.loads == 0  # the engine started from the actor's checkpoint
    rollout.updated()
    rollout.answers([[1]], 4, [3], greedy=True)  # evaluation: pushed off the clock, no row
    assert engine.loads == 1 and not [r for r in rollout.rec.rows if r.phase == "sync"]
    rollout.begin(1, {0: [0]}, [(0, 4, 11, None, 0)])  # the step pushes again, on its clock
    assert engine.loads == 2 and [r.step for r in rollout.rec.rows if r.phase == "sync"] == [1]
    rollout.end()
    rollout.begin(2, {0: [0]}, [(0, 4, 11, None, 0)])
    assert engine.loads == 2  # no update since: nothing pushed


def test_the_engines_iterations_are_the_trace_rows_of_its_own_lane_in_the_step_they_served():
    """A prefill row for the requests' first pass, then one decode row per iteration with its batch and context; the
    trainer's lane holds no generation row (its waits are its gaps); an iteration collected after the next step
    began keeps the step it ended in."""
    engine = ScriptedEngine({0: [5, 6, 7, EOS], 1: [8, 8, 8, 8, 8, 8]}, ahead=1)
    rollout = rollout_on(engine)
    rollout.begin(0, {0: [0], 1: [1]}, [(0, 8, 11, None, 0), (1, 3, 12, None, 0)])
    while rollout.running:
        rollout.decode(0, 1)
    rollout.end()
    rows = [r for r in rollout.rec.rows if r.phase in ("prefill", "decode")]
    assert {r.device for r in rows} == {"cpu0/scripted"} and {r.step for r in rows} == {0}
    assert [(r.phase, r.batch_size, r.num_tokens, r.context_tokens) for r in rows[:3]] == [
        ("prefill", 2, 2, 0),  # both prompts, a token each
        ("decode", 2, 2, 2 + 2),  # each context grew by its first token
        ("decode", 2, 2, 3 + 3),
    ]
    assert [r.batch_size for r in rows[3:]] == [1]  # sequence 1 ended at its budget of 3; 0 decodes its EOS
    assert all(r.start_s <= r.end_s <= rollout.rec.now() for r in rows)
    late = Iteration(time.monotonic(), 1e-3, 0, 0, 1, 1, 9)  # ended in step 0, collected in step 1
    time.sleep(0.01)
    rollout.begin(1, {0: [0]}, [(0, 1, 11, None, 0)])
    mixed = Iteration(time.monotonic(), 1e-3, 2, 40, 3, 3, 50)  # two prompts beside three decoding requests
    engine.iterations[:0] = [late, mixed]
    rollout.decode(1, 1)
    assert [r.step for r in rollout.rec.rows if r.context_tokens == 9 and r.phase == "decode"] == [0]
    assert [(r.step, r.batch_size, r.num_tokens) for r in rollout.rec.rows if r.context_tokens == 50] == [(1, 5, 43)]


def test_a_traced_length_bans_eos_before_it_and_puts_eos_at_it():
    """--lengths on an engine: the request asks for exactly the tokens up to the traced length (min_tokens: no EOS
    before it), and the token at that length is EOS, with no engine log-prob (NaN); a resumed sequence asks for the
    rest only."""
    engine = ScriptedEngine({0: [5, 6, 7, 8, 9, 9, 9, 9], 1: [4, 4, 4, 4, 4, 4, 4, 4]}, ahead=8)
    rollout = rollout_on(engine)
    rollout.begin(0, {0: [0], 1: [1, 4]}, [(0, 8, 11, 3, 0), (1, 7, 12, 4, 1)])  # seq 1 resumes at position 1
    assert [a[2] for a in engine.added] == [3, 3]  # 3 tokens each: to length 3, and from 1 to length 4
    assert [a[4]["min_tokens"] for a in engine.added] == [3, 3]
    finished, new, logps = rollout.decode(0, 8)
    assert new == {0: [5, 6, EOS], 1: [4, 4, EOS]} and finished == {0: 3, 1: 3}
    assert logps[0][:2] == [-0.5, -0.5] and math.isnan(logps[0][2])
    rollout.end()
    rollout.begin(1, {0: [0]}, [(0, 2, 11, 5, 0)])  # a budget short of the traced length: no EOS put
    _, new, _ = rollout.decode(1, 8)
    assert new == {0: [5, 6]} and engine.added[-1][4]["min_tokens"] == 2


def test_a_pass_counts_the_kv_context_of_every_decoding_request_even_one_aborted_meanwhile():
    """The engine's outputs of a pass, as vLLM hands them over (core ids, new tokens): a request's first token
    comes from its prefill; from then on its KV holds the prompt and all but the token fed in. A request aborted
    after the pass ran still counts in it (the pass's batch holds it)."""
    from types import SimpleNamespace

    from oppo.exec.engines.vllm_engine import VllmEngine

    engine = VllmEngine.__new__(VllmEngine)  # the bookkeeping alone, no engine process
    engine.iterations, engine._retired = [], []
    engine._counts = {"a-1": [10, 0], "b-2": [20, 0]}
    engine._core_id = {"a": "a-1", "b": "b-2"}

    def outputs(tokens: dict[str, int], decoding: int, prefill: int = 0):
        outs = [SimpleNamespace(request_id=r, new_token_ids=[7] * n, finish_reason=None) for r, n in tokens.items()]
        details = SimpleNamespace(
            is_dummy=False, elapsed_ms=5.0, num_ctx_requests=prefill, num_ctx_tokens=30 * bool(prefill),
            num_generation_requests=decoding, num_generation_tokens=decoding,
        )  # fmt: skip
        return SimpleNamespace(outputs=outs, scheduler_stats=SimpleNamespace(iteration_details=details), timestamp=1.0)

    engine._saw(outputs({"a-1": 1, "b-2": 1}, decoding=0, prefill=2))  # both prompts: a first token each
    engine._saw(outputs({"a-1": 1, "b-2": 1}, decoding=2))
    engine.live, engine.engine = {"a", "b"}, SimpleNamespace(abort_request=lambda ids: None)
    engine._guarded = lambda call, *args: call(*args)
    engine.abort(["b"])  # after its next pass ran: that pass's outputs are still on their way
    engine._saw(outputs({"a-1": 1, "b-2": 1}, decoding=2))
    assert [it.decode_context for it in engine.iterations] == [0, 10 + 20, 11 + 21]
    assert [(it.prefill_requests, it.decode_requests) for it in engine.iterations] == [(2, 0), (0, 2), (0, 2)]
