"""The simulator replays an executor run: its lengths by sequence id, its Δ and chunk decisions, step by step."""

import dataclasses

import numpy as np

from oppo.catalog.lengths import load_lengths
from oppo.exec.config import ExecConfig, ModelConfig, TaskConfig, default_schedule
from oppo.exec.step.runner import forced_length
from oppo.exec.train import train
from oppo.fidelity import generated_lengths, padded_prompt_tokens, predict
from oppo.records.io import read_rows
from oppo.records.schema import StepRecord, TraceRow, TrainedSeq
from oppo.sim.cost.profile import fit_trace, save_profile

DECIDED = ("delta", "chunk", "finished", "deferred")  # what a faithful replay repeats exactly, whatever its clock
TRACE = (2, 3, 5, 8, 13, 21, 24, 4, 9, 16)


def test_an_adaptive_run_is_replayed_with_the_lengths_and_decisions_it_recorded(tmp_path):
    """GRPO ``oppo``, groups of 2, with the slope controller (window 1: Δ moves every step with the reward) and chunk
    exploration, lengths forced from a small trace: the simulator, given no lengths, replays the ones the run
    generated (by sequence id; the cap for those still running at the end) and the Δ and chunk it chose, so each
    step trains and carries what the run's did. Its own controllers would not: its rewards are a model's."""
    trace = tmp_path / "lengths.csv"
    trace.write_text("response_tokens\n" + "\n".join(map(str, TRACE)) + "\n")
    schedule = default_schedule(
        policy="oppo",
        algo="grpo",
        group_size=2,
        batch=2,
        max_new_tokens=24,
        check_tokens=2,
        chunk_candidates=(2, 4),
        delta_init=1,
        delta_max=2,
        delta_window=1,
    )
    config = ExecConfig(
        schedule=schedule, model=ModelConfig(threads=1), steps=5, seed=3, task=TaskConfig(lengths=str(trace))
    )
    run = tmp_path / "run"
    train(config, run)
    rows = read_rows(run / "trace.csv", TraceRow)
    save_profile(fit_trace(rows), tmp_path / "profile.json", str(run))
    measured = read_rows(run / "steps.csv", StepRecord)
    assert len({r.delta for r in measured}) > 1 and len({r.chunk for r in measured}) > 1  # both controllers moved
    assert measured[-1].deferred > 0  # the run ends with sequences still running: ids no record has

    predicted = predict(run, tmp_path / "profile.json", prompt_tokens=padded_prompt_tokens(rows))
    assert [tuple(getattr(r, f) for f in DECIDED) for r in predicted] == [
        tuple(getattr(r, f) for f in DECIDED) for r in measured
    ]
    trained = {s.seq_id for s in read_rows(run / "sequences.csv", TrainedSeq)}
    forced = load_lengths(trace)
    replayed = generated_lengths(run, config).response_tokens
    expected = [forced_length(forced, config.seed, i, 24) if i in trained else 24 for i in range(len(replayed))]
    np.testing.assert_array_equal(replayed, expected)
    assert len(replayed) > max(trained) + 1 and set(range(max(trained))) - trained  # gaps and spare ids at the cap


def test_a_run_on_the_vllm_engine_is_simulated_with_the_engine_on_a_core_of_its_own(tmp_path):
    """The executor's vLLM engine generates in its own process: the simulator mirrors it with generation on a
    device of its own (weights pushed after each update), a decode batch that loses its finished requests, and a
    prefill of every request's prompt (one request per sample: no prefill shared within a group)."""
    from oppo.catalog.lengths import LengthTrace
    from oppo.exec.config import RolloutConfig
    from oppo.fidelity import sim_setup_for
    from oppo.sim import SimConfig, simulate

    rows = []
    for step in range(6):
        for batch in (2, 5, 8):
            rows.append(TraceRow(step, "cpu0/vllm", "actor", "decode", 0.0, 0.02 + 0.002 * batch, batch, batch, 0))
        rows.append(
            TraceRow(step, "cpu0/vllm", "actor", "prefill", 0.0, 0.02 + 1e-3 * 80 * (step + 1), 8, 80 * (step + 1), 0)
        )
        for role in ("actor", "reference"):
            rows.append(TraceRow(step, "cpu0", role, "score", 0.0, 1e-3 * 400 * (step + 1), 8, 400 * (step + 1), 0))
        rows.append(
            TraceRow(step, "cpu0", "actor", "train_actor", 0.0, 4e-3 * 400 * (step + 1), 8, 400 * (step + 1), 0)
        )
        rows.append(TraceRow(step, "cpu0", "actor", "sync", 0.0, 0.9, 1, 10**8, 0))
    save_profile(fit_trace(rows), tmp_path / "profile.json", "synthetic")
    schedule = default_schedule(algo="grpo", policy="sync", batch=2, group_size=4, max_new_tokens=16)
    config = ExecConfig(schedule=schedule, rollout=RolloutConfig(rollout_engine="vllm"), steps=3)
    setup = sim_setup_for(config, tmp_path / "profile.json", prompt_tokens=10)
    assert setup.engine == "vllm-cpu" and setup.placement.rollout_gpus == 1
    lengths = LengthTrace("short-and-long", np.array([2, 16, 2, 2, 2, 2, 2, 2] * 8), None, ordered=True)
    trace = simulate(SimConfig(schedule, setup, config.steps, config.seed), lengths).trace
    generation = {r.device for r in trace if r.phase in ("decode", "prefill") and r.role == "actor"}
    training = {r.device for r in trace if r.phase == "train_actor"}
    assert len(generation) == 1 and not generation & training
    prefill = [r for r in trace if r.step == 0 and r.phase == "prefill" and r.role == "actor"]
    assert sum(r.num_tokens for r in prefill) == 8 * 10  # 2 prompts x 4 samples, each its own request
    padded = simulate(SimConfig(schedule, dataclasses.replace(setup, engine="torch-cpu"), 3, config.seed), lengths)

    def decode_s(rows):
        return sum(r.end_s - r.start_s for r in rows if r.step == 0 and r.phase == "decode")

    # one 16-token response among 2-token ones: 2 iterations of 8 requests, then 14 of 1, against 16 of 8
    assert decode_s(trace) < 0.75 * decode_s(padded.trace)
    assert len([r for r in trace if r.phase == "sync"]) == 3  # the weights pushed after each update
