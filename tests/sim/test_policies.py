"""The long-tail schedulers and group sampling in simulation, on the same setup and costs."""

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from oppo.catalog.lengths import load_lengths
from oppo.core.config import DELTA_CONTROLLERS
from oppo.records.metrics import hidden_fraction, stage_throughput, summarize, work_done
from oppo.records.schema import StepRecord, TraceRow, TrainedSeq
from oppo.sim import SimConfig, load_setup, simulate
from oppo.sim.study.experiments import compare, compare_rows, flops_and_peaks
from oppo.sim.workload import LengthModel

LONG_COT = LengthModel(median_tokens=700, sigma=1.66)  # p50 ~700, p99 ~33k tokens: long chain-of-thought


def run(policy, setup="paper-7b-h200", steps=30, lengths=None, **schedule):
    s = load_setup(setup)
    s = dataclasses.replace(s, lengths=lengths) if lengths else s
    result = simulate(SimConfig(s.schedule(policy=policy, **schedule), s, steps=steps, seed=1))
    return result, summarize(policy, result.steps, result.trace, result.trained, {}, 0.0)


def test_tail_controller_cuts_a_capped_long_tail_where_slope_cannot():
    """1,024-token cap, long-CoT lengths: ~40% of sequences hit the cap, more than Δ <= B/4 can skip."""
    knobs = dict(steps=60, lengths=LONG_COT, delta_max=112, delta_init=7)
    sync = run("sync", **knobs)[1]["mean_step_s"]
    slope = run("inter", delta_controller="slope", **knobs)[1]["mean_step_s"]
    _, tail = run("inter", delta_controller="tail", **knobs)
    assert sync / slope < 1.1
    assert sync / tail["mean_step_s"] > 1.4
    assert tail["p99_policy_lag"] <= 3  # what it costs: samples up to max_deferrals versions old


def test_async_overlaps_generation_and_training_with_lag_bounded_by_staleness():
    result, summary = run("async", staleness=2, steps=20)
    assert 0 < summary["mean_policy_lag"] and summary["p99_policy_lag"] <= 2
    gen = {r.device for r in result.trace if r.phase == "decode"}
    train = {r.device for r in result.trace if r.phase == "train_actor"}
    assert gen == {"gpu0", "gpu1", "gpu2", "gpu3"} and train == {"gpu4", "gpu5", "gpu6"}  # on their own devices
    assert hidden_fraction(result.trace, ("actor", "train_actor"), ("actor", "decode")) > 0.5


def test_async_with_staleness_0_is_synchronous():
    """K = 0: a step's generation starts only once the previous update is done; no lag, no overlap."""
    result, summary = run("async", staleness=0, steps=8)
    assert summary["mean_policy_lag"] == 0 and summary["p99_policy_lag"] == 0
    assert hidden_fraction(result.trace, ("actor", "train_actor"), ("actor", "decode")) == 0
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        run("async", staleness=-1, steps=1)


def test_grpo_trains_whole_groups_without_a_critic():
    result, summary = run("oppo", steps=12, algo="grpo", group_size=4, batch=16)
    assert not any(r.role == "critic" for r in result.trace)
    for step in range(12):
        trained = [t for t in result.trained if t.step == step]
        groups = {t.group_id for t in trained}
        assert len(trained) == 64 and len(groups) == 16
        assert all(sum(t.group_id == g for t in trained) == 4 for g in groups)


def test_group_lengths_are_prompt_correlated():
    """Samples of one prompt are alike in length (a trace's prompt_id, or the length model's prompt level)."""
    result, _ = run("sync", steps=4, algo="grpo", group_size=8, batch=16)
    lengths = np.array([[t.response_tokens for t in result.trained if t.group_id == g] for g in range(64)])
    within = np.log(lengths).std(axis=1).mean()
    overall = np.log(lengths).std()
    assert within < 0.7 * overall


def test_mfu_per_stage_is_a_fraction_of_the_datasheet_peak():
    result, _ = run("sync", steps=3)
    stages = stage_throughput(result.trace, *flops_and_peaks(load_setup("paper-7b-h200")))
    assert 0 < stages["actor/decode"]["mfu"] < 0.01  # decode is bandwidth-bound (and HF generate under ZeRO-3)
    # TRL's micro-batches of 8, recomputation and per-pass gathers keep the update below the roofline's training
    # fraction of the datasheet (0.45): 21.5% here, 14.7% before the MI300X was priced at its matmul ceiling (the
    # shared layer the preset takes was refitted); real verl runs log 6.7% (a 7B PPO update) to 23-37% (GPG, A100)
    assert 0.02 < stages["actor/train_actor"]["mfu"] < 0.3


def test_design_doc_describes_every_delta_controller():
    """docs/design.md's list of Δ controllers names each one --delta-controller accepts (and `fixed`)."""
    design = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    listed = design.split("Δ controllers (", 1)[1].split("\n\n", 1)[0]
    described = re.findall(r"^- `(\w+)`", listed, flags=re.MULTILINE)
    assert described == [*DELTA_CONTROLLERS, "fixed"]


def test_work_done_counts_finished_samples_only():
    """A policy whose fast steps train many partial segments (T-PPO-like) does not win on work done: only finished
    responses count, each response's tokens once."""
    whole = [TrainedSeq(i // 4, i, i, i // 4, 0, 400, 400, True, 0) for i in range(8)]  # 2 steps of 4 in 20 s
    parts = [TrainedSeq(i, 100 + i, 100 + i, 0, 0, 256 * (i + 1), 256, i == 9, i) for i in range(10)]  # 10 x 2 s
    assert work_done(whole, 20.0) == {"trained_samples": 8, "samples_per_s": 0.4, "tokens_per_s": 160.0}
    assert work_done(parts, 20.0) == {"trained_samples": 1, "samples_per_s": 0.05, "tokens_per_s": 128.0}

    def summary(policy, step_s, trained):
        n = int(20.0 / step_s)
        steps = [StepRecord(i, i * step_s, (i + 1) * step_s, step_s, 1.0, 4, 4, 0, 0) for i in range(n)]
        trace = [TraceRow(0, "gpu0", "actor", "decode", 0.0, step_s, 4, 4, 0)]
        return summarize(policy, steps, trace, trained, {}, 0.0) | {"time_to_reward_s": None}

    rows = compare_rows([summary("sync", 10.0, whole), summary("segments", 2.0, parts)])
    assert [r["policy"] for r in rows] == ["sync", "segments"]
    assert rows[1]["per_step_speedup"] == 5.0 and rows[1]["samples_speedup"] == 0.125


def test_tppo_does_not_rank_first_on_work_done_on_the_7b_preset():
    """T-PPO's 256-token steps are ~3.4x shorter than sync's, but it finishes fewer responses per second than
    APRIL's over-commit (and about as many as oppo: 1.91x vs 1.89x): the compare table ranks on finished samples per
    second, not on step time."""
    trace = load_lengths("alpaca_eval")
    rows = compare(load_setup("paper-7b-h200"), ["sync", "oppo", "april", "tppo"], 200, 0, trace)  # as the docs
    by_policy = {r["policy"]: r for r in rows}
    assert by_policy["tppo"]["per_step_speedup"] > 2.5  # the per-step ratio that used to head the table
    assert rows[0]["policy"] == "april" and rows[-1]["policy"] == "sync"
    assert by_policy["tppo"]["samples_speedup"] < 0.6 * by_policy["tppo"]["per_step_speedup"]
