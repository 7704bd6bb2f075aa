"""The simulator replays an executor run: its lengths, its Δ and chunk decisions, step by step."""

from oppo.exec.config import ExecConfig, ModelConfig, TaskConfig, default_schedule
from oppo.exec.train import train
from oppo.fidelity import generated_lengths, mean_prompt_tokens, predict
from oppo.records.io import read_rows
from oppo.records.schema import StepRecord, TraceRow
from oppo.sim.cost.fit import fit_trace, save_profile

DECIDED = ("delta", "chunk", "finished", "deferred")  # what a faithful replay repeats exactly, whatever its clock


def test_an_adaptive_run_is_replayed_with_the_lengths_and_decisions_it_recorded(tmp_path):
    """``oppo`` with the slope controller (window 1: Δ moves every step with the reward) and chunk exploration,
    lengths forced from a small trace: the simulator, given no lengths, replays the ones the run generated and the
    Δ and chunk it chose, so each step trains and carries what the run's did. Its own controllers would not: its
    rewards are a model's, not the run's."""
    trace = tmp_path / "lengths.csv"
    trace.write_text("response_tokens\n" + "\n".join(map(str, (2, 3, 5, 8, 13, 21, 24, 4, 9, 16))) + "\n")
    schedule = default_schedule(
        policy="oppo",
        batch=4,
        max_new_tokens=24,
        check_tokens=2,
        chunk_candidates=(2, 4),
        delta_init=1,
        delta_max=3,
        delta_window=1,
    )
    config = ExecConfig(
        schedule=schedule, model=ModelConfig(threads=1), steps=6, seed=3, task=TaskConfig(lengths=str(trace))
    )
    run = tmp_path / "run"
    train(config, run)
    rows = read_rows(run / "trace.csv", TraceRow)
    save_profile(fit_trace(rows), tmp_path / "profile.json", str(run))
    measured = read_rows(run / "steps.csv", StepRecord)
    assert len({r.delta for r in measured}) > 1 and len({r.chunk for r in measured}) > 1  # both controllers moved

    predicted = predict(run, tmp_path / "profile.json", prompt_tokens=mean_prompt_tokens(rows))
    assert [tuple(getattr(r, f) for f in DECIDED) for r in predicted] == [
        tuple(getattr(r, f) for f in DECIDED) for r in measured
    ]
    replayed = generated_lengths(run)
    assert replayed.ordered and set(replayed.response_tokens) <= {2, 3, 5, 8, 13, 21, 24, 4, 9, 16}
