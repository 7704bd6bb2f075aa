"""What a calibration records, and what a prediction on a calibrated setup says about itself: its interval, and
each term of the setup outside the span of the calibration runs."""

import dataclasses
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from oppo.sim.cost.framework import Framework
from oppo.sim.cost.stage import StageCost
from oppo.sim.logs.interval import interval, trust_note
from oppo.sim.logs.trust import calibration, extrapolations, weighted_quantile
from oppo.sim.setup.toml_file import load_setup
from tests import invoke
from tests.sim.test_logfit import SHARED_RUNS

DATA = Path(__file__).with_name("data")


def calibrated_on(*names: str):
    """A calibration record of the named setups, with made-up errors: 10% on every step of each run."""
    setups = [load_setup(n) for n in names]
    errors = {"step": [np.full(10, 0.1) for _ in setups], "gen": [np.full(10, 0.2) for _ in setups]}
    return calibration(setups, errors, basis="leave_one_group_out")


def test_each_run_weighs_alike_in_the_interval_whatever_its_steps():
    """A run of 1,000 steps all within 1% and one of 10 steps all 50% off: the 80% quantile is the bad run's, since
    each run holds half the weight (a step-weighted quantile would say 1%)."""
    assert weighted_quantile([np.full(1000, 0.01), np.full(10, 0.5)], 0.8) == 0.5
    assert weighted_quantile([np.full(1000, 0.01), np.full(10, 0.5)], 0.4) == 0.01


def test_a_setup_inside_the_span_says_so_and_one_outside_names_each_term():
    record = calibrated_on("verl-qwen2.5-0.5b-gsm8k", "verl-gemma-2-2b-gsm8k")
    assert record.step_err == pytest.approx(0.1) and dict(zip(record.stages, record.stage_err))["gen"] == 0.2
    assert record.gpus == (1, 2) and record.params_b[0] < 0.6 < 2.0 < record.params_b[1]
    inside = load_setup("verl-gemma-2-2b-gsm8k")
    inside = dataclasses.replace(inside, framework=dataclasses.replace(inside.framework, calibration=record))
    assert extrapolations(inside) == []
    assert trust_note(inside).endswith("within the calibration span")
    assert "±10%" in trust_note(inside) and "2 calibration runs" in trust_note(inside)
    assert "each run predicted without its group" in trust_note(inside)
    outside = load_setup("verl-qwen2-7b-gpg-8gpu")  # 7.6B on 8 GPUs of another type, GRPO groups of 5, sleep mode
    outside = dataclasses.replace(outside, framework=dataclasses.replace(outside.framework, calibration=record))
    found = " | ".join(extrapolations(outside))
    for phrase in ("8 GPUs", "7.6B-parameter", "GPU 'unknown'", "algorithm 'grpo'", "'sleep'", "group sampling"):
        assert phrase in found, phrase


def test_an_offload_a_weight_push_and_a_micro_batch_far_from_the_runs_are_each_named():
    """Runs that offloaded nothing, pushed no weights and scored a 0.5B model in micro-batches of 4 x 1,536 tokens:
    a setup that offloads its reference and its actor's optimizer state, pushes weights to a rollout engine of its
    own and scores a 7B model's micro-batches of 16 rows (~30x the work: the host's time per micro-batch hidden
    where the runs showed it) is told that each is outside; the runs themselves are not."""
    run = load_setup("verl-qwen2.5-0.5b-gsm8k")
    run = dataclasses.replace(run, framework=dataclasses.replace(run.framework, offload=()))
    errors = {"step": [np.full(10, 0.1)]}
    record = calibration([run], errors, basis="within")
    assert record.offloads == ("none",) and record.weight_pushes == (False,)
    assert record.forward_gflop[0] == record.forward_gflop[1] > 0
    itself = dataclasses.replace(run, framework=dataclasses.replace(run.framework, calibration=record))
    assert extrapolations(itself) == []
    other = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")  # reference offloaded; micro-batches of 16
    placement = dataclasses.replace(other.placement, rollout_gpus=2)
    fw = dataclasses.replace(other.framework, calibration=record, forward_micro_batch=16, optimizer_offload=("actor",))
    found = " | ".join(extrapolations(dataclasses.replace(other, placement=placement, framework=fw)))
    phrases = (
        "reference (copied in at every micro-batch)",
        "actor's optimizer state",
        "offloaded to the host",
        "weights pushed to rollout",
        "micro-batches of",
    )
    for phrase in phrases:
        assert phrase in found, (phrase, found)


def test_a_stage_no_calibration_run_timed_is_named_with_the_family_that_prices_it():
    """The forward passes share their terms, and the training passes theirs: a PPO setup calibrated on a GRPO run
    (no reference, no critic) takes its reference's and critic's terms from the actor's passes, and says so; the
    GRPO run itself does not."""
    grpo = load_setup("verl-qwen2-7b-gpg-8gpu")
    stages = ("gen", "old_log_prob", "update_actor", "reward")
    record = calibration([grpo], {s: [np.full(10, 0.1)] for s in ("step", *stages)}, basis="within")
    itself = dataclasses.replace(grpo, framework=dataclasses.replace(grpo.framework, calibration=record))
    assert not any("priced by" in phrase for phrase in extrapolations(itself))
    ppo = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    ppo = dataclasses.replace(ppo, framework=dataclasses.replace(ppo.framework, calibration=record))
    found = " | ".join(extrapolations(ppo))
    assert "ref, values priced by the terms fitted on old_log_prob" in found, found
    assert "update_critic priced by the terms fitted on update_actor" in found, found


def test_an_uncalibrated_setup_says_it_has_no_bound(tmp_path):
    """A setup whose framework layer is neither calibrated nor the shared layer's terms (a verl run's setup before
    calibrate-log: the roofline) predicts from priors: its note says so, no ± figure, on ``run`` too (it said nothing
    before); a paper preset borrows the shared layer's (the next tests)."""
    note = trust_note(load_setup("verl-gemma-2-2b-gsm8k"))
    assert (
        note.startswith("note: verl-gemma-2-2b-gsm8k predicts a sync step with no bound: uncalibrated")
        and "±" not in note
    )
    assert extrapolations(load_setup("verl-gemma-2-2b-gsm8k")) == []
    res = invoke.sim("run", "--setup", "verl-qwen2.5-0.5b-gsm8k", "--steps", "1", "--out", tmp_path / "r")
    assert res.returncode == 0, res.stderr
    assert "verl-qwen2.5-0.5b-gsm8k predicts a sync step with no bound: uncalibrated" in res.stderr
    # validate-log's fidelity.json: the interval's keys, no bound
    log = Path(__file__).with_name("data") / "verl_qwen2_7b_grpo_megatron_excerpt.log.gz"
    res = invoke.sim(
        "validate-log", "--log", log, "--setup", "verl-qwen2-7b-grpo-megatron-16gpu", "--out", tmp_path / "v"
    )
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "v" / "fidelity.json").read_text())
    assert report["interval"]["step"] is None and report["interval"]["extrapolates"] == ["uncalibrated"]


def test_a_run_that_declares_no_per_step_cost_is_not_charged_one():
    """The shared layer's KV re-initialisation (seconds per step, fitted on runs that declare it) is charged to a
    setup that declares ``reinit`` and not to one that declares nothing."""
    terms = StageCost(efficiency=0.5, cache_reinit_s=12.0, fixed_s=0.0)
    setup = load_setup("verl-qwen2.5-0.5b-gsm8k")
    for reset, charged in (("reinit", 12.0), ("none", 0.0)):
        framework = dataclasses.replace(setup.framework, gen=terms, kv_cache_reset=reset, weight_reshard=False)
        cost = dataclasses.replace(setup, framework=framework).costs()["actor"]
        assert cost.fixed_s(("gen",)) == pytest.approx(charged)
    with pytest.raises(ValueError, match="kv_cache_reset must be one of none, reinit, sleep"):
        Framework(kv_cache_reset="free")


def calibrate_log(*args: str) -> subprocess.CompletedProcess:
    return invoke.sim("calibrate-log", *args)


def test_a_calibrated_setup_prints_its_interval_where_it_predicts(tmp_path):
    """calibrate-log writes the record into the calibrated setup; run on that setup says its interval (on stderr,
    beside the records) and that it extrapolates where it does."""
    log = str(DATA / "verl_qwen2.5_0.5b_resp512.log.gz")
    res = calibrate_log("--log", log, "--setup", "verl-qwen2.5-0.5b-gsm8k", "--out", str(tmp_path / "cal"))
    assert res.returncode == 0, res.stderr
    assert "note: verl-qwen2.5-0.5b-gsm8k-calibrated predicts a sync step to ±" in res.stdout
    bigger = tmp_path / "bigger.toml"
    bigger.write_text(f'base = "{tmp_path / "cal" / "setup.toml"}"\nname = "bigger"\n[placement]\nactor_gpus = 4\n')
    res = invoke.sim("run", "--setup", bigger, "--steps", "2", "--out", tmp_path / "r")
    assert res.returncode == 0, res.stderr
    # one run cannot say how far a prediction on more GPUs is off: no ± figure, the axis named
    assert "note: bigger predicts a sync step with no bound: extrapolates on GPU count" in res.stderr
    assert "extrapolates: 4 GPUs (calibrated on 1-1)" in res.stderr
    # plan ranks by the predicted means and gives each gain the range the calibration's interval allows
    plan = ["plan", "--setup", tmp_path / "cal" / "setup.toml", "--policies", "sync,inter", "--budget", "8"]
    plan += ["--rung-steps", "3,5", "--rung-seeds", "1,1", "--fresh-seeds", "0", "--out", tmp_path / "p"]
    res = invoke.sim(*plan)
    assert res.returncode == 0, res.stderr
    assert "with the calibration's ±" in res.stdout and "at worst (both ends off" in res.stdout
    # on 4 GPUs the one-run calibration bounds nothing: the plan's gain gets no range from it
    plan[2], plan[-1] = bigger, tmp_path / "p4"
    res = invoke.sim(*plan)
    assert res.returncode == 0, res.stderr
    assert "no range from the calibration: the predictions extrapolate on GPU count" in res.stdout
    assert "with the calibration's ±" not in res.stdout


def test_a_stage_no_fitted_step_times_is_refused(tmp_path):
    """A logged stage at 0 s on every fitted step leaves its terms nothing to fit on: exit 2, one line."""
    log = tmp_path / "zero.jsonl"
    rows = [
        f'{{"step": {i}, "timing_s/gen": 10.0, "timing_s/ref": 0.0, "response_length/mean": 200.0, '
        f'"response_length/max": 512.0, "response_length/min": 20.0, "prompt_length/mean": 100.0}}'
        for i in range(10)
    ]
    log.write_text("\n".join(rows) + "\n")
    res = calibrate_log("--log", str(log), "--setup", "verl-qwen2.5-0.5b-gsm8k", "--out", str(tmp_path / "out"))
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "ref is timed 0 s on each of the 6 fitted steps" in res.stderr


def test_a_stage_timed_alone_and_inside_a_composite_is_refused(tmp_path):
    """update_actor timed alone and inside OpenRLHF's ppo_train would be fitted twice, one fit overwriting the other:
    exit 2, one line naming both."""
    log = tmp_path / "both.jsonl"
    rows = [
        f'{{"step": {i}, "timing_s/gen": 10.0, "timing_s/update_actor": 4.0, "timing_s/ppo_train": 7.0, '
        f'"response_length/mean": 200.0, "response_length/max": 512.0, "response_length/min": 20.0, '
        f'"prompt_length/mean": 100.0}}'
        for i in range(10)
    ]
    log.write_text("\n".join(rows) + "\n")
    res = calibrate_log("--log", str(log), "--setup", "verl-qwen2.5-0.5b-gsm8k", "--out", str(tmp_path / "out"))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "times update_actor in both update_actor and ppo_train" in res.stderr
    assert not (tmp_path / "out").exists()


def test_the_interval_quantile_is_the_inverse_of_the_weighted_cdf():
    """Ten equal-weight steps at q = 0.8: the 8th value, not the 9th (a cumulative sum of floats that should equal
    0.8 must not push it one late); q = 1 is the largest."""
    steps = [np.arange(1, 11) / 100]
    assert weighted_quantile(steps, 0.8) == 0.08
    assert weighted_quantile(steps, 1.0) == 0.10


def test_an_interval_of_siblings_alone_says_it_is_leave_one_out(tmp_path):
    """Two runs of one group (one model, GPU, framework version): no run is predicted without its group, so the
    interval is made of leave-one-out errors and says so."""
    runs = [
        ("verl_qwen2.5_0.5b_resp512.log.gz", "verl-qwen2.5-0.5b-gsm8k"),
        ("verl_qwen2.5_0.5b_resp256.log.gz", "verl-qwen2.5-0.5b-gsm8k-cap256"),
    ]
    args = [arg for log, setup in runs for arg in ("--log", str(DATA / log), "--setup", setup)]
    res = calibrate_log(*args, "--out", str(tmp_path / "cal"))
    assert res.returncode == 0, res.stderr
    assert "of the steps predicted leave-one-out" in res.stdout
    assert 'basis = "leave_one_out"' in (tmp_path / "cal" / "framework.toml").read_text()


def test_a_rollout_engine_on_its_own_gpus_pays_no_reshard_nor_cache_reset():
    """The hybrid engine's per-step costs are the colocated engine's: an engine on GPUs of its own is pushed the
    weights (its transfer) and keeps its cache."""
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    framework = dataclasses.replace(setup.framework, gen=StageCost(cache_reinit_s=12.0))
    setup = dataclasses.replace(setup, framework=framework)
    assert setup.costs("sync")["actor"].fixed_s(("gen",)) > 12.0  # colocated: re-initialisation and reshard
    costs = setup.costs("async")
    assert "rollout" in costs and costs["rollout"].fixed_s(("gen",)) == 0.0


def test_a_group_prefills_its_prompt_once_on_an_engine_that_shares_it():
    """vLLM samples a prompt's n responses as one request: a GRPO step of 16 prompts x 8 prefills 16 prompts; HF
    generate prefills all 128 rows (padded to the longest)."""
    from oppo.sim import SimConfig, simulate

    base = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    prompt = base.lengths.prompt_tokens
    for engine, rows in (("vllm", 16), ("hf", 128)):
        setup = dataclasses.replace(base, engine=engine, algo="grpo", group_size=8, batch=16, critic=False)
        result = simulate(SimConfig(setup.schedule(policy="sync"), setup, steps=1, seed=0))
        # one prefill operation, recorded once per member GPU of the group with the same fields
        (tokens,) = {r.num_tokens for r in result.trace if r.role == "actor" and r.phase == "prefill"}
        assert tokens == rows * prompt, engine


def test_the_reshards_software_per_layer_is_named_where_a_setup_pays_it(tmp_path):
    """The shared layer's reshard software per layer comes from the one run that timed it; a setup that reshards is
    told so, one whose rollout has GPUs of its own (a weight push, no reshard) is not."""
    shared = Path(__file__).resolve().parents[2] / "oppo" / "data" / "framework" / "verl-shared.toml"
    path = tmp_path / "s.toml"
    path.write_text(f'base = "verl-qwen2.5-0.5b-gsm8k"\n[framework]\nbase = "{shared}"\n')
    setup = load_setup(str(path))
    assert any("the reshard's software" in phrase for phrase in extrapolations(setup))
    split = dataclasses.replace(setup, placement=dataclasses.replace(setup.placement, rollout_gpus=1, actor_gpus=2))
    assert not any("the reshard's software" in phrase for phrase in extrapolations(split))


SHARED_LAYER = Path(__file__).resolve().parents[2] / "oppo" / "data" / "framework" / "verl-shared.toml"


@pytest.mark.parametrize("command", ["run", "compare", "sweep", "plan"])
def test_the_trust_note_reads_the_flags_a_prediction_runs_with(tmp_path, command):
    """The note of run / compare / sweep / plan names what the prediction runs, not what the setup says: a cap of
    8,192 and groups of 8 given as flags on a setup calibrated on runs capped at 1,024 with groups of up to 5 are
    extrapolations (the setup alone lies inside the span)."""
    path = tmp_path / "s.toml"
    path.write_text(f'base = "verl-qwen2.5-0.5b-gsm8k"\n[framework]\nbase = "{SHARED_LAYER}"\n')
    flags = ["--max-new-tokens", "8192", "--algo", "grpo", "--group-size", "8", "--steps", "1"]
    per_command = {
        "run": ["--policy", "sync", "--out", str(tmp_path / "r")],
        "compare": ["--policies", "sync"],
        "sweep": ["--chunks", "256", "--out", str(tmp_path / "s")],
        "plan": [
            "--policies",
            "sync",
            "--budget",
            "2",
            "--rung-steps",
            "1",
            "--rung-seeds",
            "1",
            "--out",
            str(tmp_path / "p"),
        ],
    }[command]
    if command == "plan":
        flags = flags[:-2]
    res = invoke.sim(command, "--setup", str(path), *flags, *per_command, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (note,) = [line for line in res.stderr.splitlines() if line.startswith("note:")]
    assert "responses capped at 8192 tokens (calibrated up to " in note
    assert "groups of 8 (calibrated up to 5)" in note
    plain = invoke.sim("run", "--setup", str(path), "--policy", "sync", "--steps", "1", "--out", str(tmp_path / "q"))
    assert "capped at" not in plain.stderr and "groups of" not in plain.stderr


def test_the_trust_note_checks_the_gpus_the_policy_sets_aside_for_generation(tmp_path):
    """async splits the actor's GPUs when the setup sets none aside: its prediction pushes weights to rollout GPUs
    (no calibration run did) and pays no reshard, and the phrases say so; sync on the same setup reshards."""
    path = tmp_path / "s.toml"
    path.write_text(
        f'base = "verl-gemma-2-2b-gsm8k"\n[framework]\nbase = "{SHARED_LAYER}"\nrollout_tensor_parallel = 1\n'
    )
    setup = load_setup(str(path))
    split = " | ".join(extrapolations(setup, setup.schedule(policy="async")))
    together = " | ".join(extrapolations(setup, setup.schedule(policy="sync")))
    assert "weights pushed to rollout GPUs of their own" in split and "the reshard's software" not in split
    assert "weights pushed" not in together and "the reshard's software" in together
    both = trust_note(setup, setup.schedule(policy="sync"), setup.schedule(policy="async"))  # compare's note
    assert "(calibrated on at most" not in both and "weights pushed to rollout GPUs of their own" in both
    assert both.count("(async)") == 1 and both.endswith("the push's link at its prior) (async)")


def test_an_interval_widens_by_the_runs_outside_the_others_and_gives_no_bound_where_none_was():
    """The five shared runs, the MI300X run predicted 40% off (its median), the others 5-8%: the interval holds 80%
    of the steps (8%: four runs of five inside it, measured). A prediction on a GPU no run used is widened by the runs
    that used a GPU no other run did (the MI300X run: 40%); one on 64 GPUs (no run lay outside the others in nodes)
    has no bound."""
    names = [name for _, name in SHARED_RUNS]
    setups = [load_setup(n) for n in names]
    err = {"verl-deepseek-llm-7b-ppo-8xmi300x": 0.40, "verl-qwen2-7b-gpg-8gpu": 0.08}
    steps = [np.full(10, err.get(n, 0.05 + 0.01 * k)) for k, n in enumerate(names)]
    record = calibration(setups, {"step": steps, "gen": steps}, basis="leave_one_group_out")
    assert record.step_err == 0.08 and dict(zip(record.axes, record.axis_err))["GPU"] == 0.40
    base = setups[0]
    calibrated = dataclasses.replace(base, framework=dataclasses.replace(base.framework, calibration=record))
    own = interval(calibrated)
    assert own.step == 0.08 and own.extrapolates == () and own.coverage == 4 / 5
    other_gpu = dataclasses.replace(calibrated, gpu="b200")
    wide = interval(other_gpu)
    assert wide.extrapolates == ("GPU",) and wide.step == 0.40 and wide.coverage == 1.0  # in sample, by construction
    assert wide.stages["gen"] == pytest.approx(record.stage_err[0] + 0.40 - 0.08)
    note = trust_note(other_gpu)
    assert "to ±40% (widened from ±8.0% of the 5 calibration runs' steps by the median errors" in note
    assert "lay outside the others on GPU" in note and "4 of 5" not in note and "80% of steps" not in note
    many = dataclasses.replace(calibrated, placement=dataclasses.replace(calibrated.placement, actor_gpus=64))
    unbounded = interval(many)
    assert unbounded.step is None and "node count" in unbounded.unbounded
    assert unbounded.as_dict()["step"] is None and "node count" in unbounded.as_dict()["extrapolates"]
    assert "predicts a sync step with no bound: extrapolates on" in trust_note(many) and "±" not in trust_note(many)


def test_a_record_from_before_intervals_bounds_nothing_it_cannot_and_says_why():
    """A calibration written before the runs' errors were kept: inside its span as before, outside it no ± figure,
    and the note says the record is too old to bound it (not that no run lay outside)."""
    names = [name for _, name in SHARED_RUNS]
    setups = [load_setup(n) for n in names]
    steps = [np.full(10, 0.1) for _ in names]
    old = dataclasses.replace(
        calibration(setups, {"step": steps}, basis="leave_one_group_out"), run_step_err=(), axes=(), axis_err=()
    )
    setup = dataclasses.replace(setups[0], framework=dataclasses.replace(setups[0].framework, calibration=old))
    assert interval(setup).step == old.step_err and interval(setup).coverage is None
    elsewhere = dataclasses.replace(setup, gpu="b200")
    assert interval(elsewhere).step is None
    assert "no bound: extrapolates on GPU, the calibration record predates intervals" in trust_note(elsewhere)


def test_the_coverage_beside_the_interval_is_measured_out_of_sample():
    """Each run against the interval the runs outside its group give (as it would have been predicted had it been
    left out), not against the quantile its own errors helped draw. The two Qwen2.5-0.5B runs (one group) predicted
    40% and 38% off, the other three 5-8%: in sample ±38% holds 4 of 5 runs; out of sample each Qwen run meets the
    other groups' ±8% and lies outside it, so 3 of 5. The note prints that share beside the ±."""
    from oppo.sim.logs.shared import run_group

    names = [name for _, name in SHARED_RUNS]
    setups = [load_setup(n) for n in names]
    steps = [np.full(10, e) for e in (0.40, 0.38, 0.07, 0.05, 0.08)]
    groups = [run_group(s) for s in setups]
    assert groups[0] == groups[1] and len(set(groups)) == 4
    record = calibration(setups, {"step": steps, "gen": steps}, basis="leave_one_group_out", groups=groups)
    assert record.step_err == 0.38
    assert record.held_out_step_err == pytest.approx((0.08, 0.08, 0.40, 0.40, 0.40))
    base = setups[2]
    calibrated = dataclasses.replace(base, framework=dataclasses.replace(base.framework, calibration=record))
    own = interval(calibrated)
    assert own.coverage == 3 / 5 and own.held_out and own.as_dict()["coverage_measured"] == "out_of_sample"
    note = trust_note(calibrated)
    assert "to ±38%, measured coverage 60% out of sample (3 of 5 runs' median step error inside" in note
    assert "stages gen ±38%" in note
    unmeasured = dataclasses.replace(record, held_out_step_err=())  # a record from before: in sample, said so
    older = dataclasses.replace(base, framework=dataclasses.replace(base.framework, calibration=unmeasured))
    assert interval(older).coverage == 4 / 5 and "measured coverage 80% in sample (4 of 5 runs)" in trust_note(older)


def test_the_paper_presets_say_they_extrapolate_from_the_shared_layer(tmp_path):
    """A paper preset prices its scoring and updates with the shared layer's terms under TRL's structure: its
    prediction names that, and the axes it leaves the shared runs on (HF generate, no run's engine) with no ± figure;
    an overriding flag is what is checked (a cap of 8192 named, not the preset's own)."""
    res = invoke.sim(
        "run", "--setup", "paper-7b-h200", "--steps", "1", "--max-new-tokens", "8192", "--out", tmp_path / "r"
    )
    assert res.returncode == 0, res.stderr
    unbounded = res.stderr.split("predicts a sync step with no bound: extrapolates on ", 1)[1].split(", where")[0]
    assert "note: paper-7b-h200" in res.stderr and "engine" in unbounded.split(", "), res.stderr
    assert "the shared layer's 7 calibration runs" in res.stderr
    assert "priced with the terms the shared layer fitted on verl runs" in res.stderr
    assert "responses capped at 8192 tokens" in res.stderr
