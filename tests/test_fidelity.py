"""The simulator replays an executor run: its lengths by sequence id, its Δ and chunk decisions, step by step."""

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
