"""Real training logs in: the parser on real excerpts (both metric name generations), bad logs, and a fit that
recovers known framework parameters from logs the simulator synthesised itself."""

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from oppo.sim.cost.stage import StageCost
from oppo.sim.logs.fit import predict_stages, replay
from oppo.sim.logs.read import LoggedStep, load_run_log
from oppo.sim.setup.toml_file import load_setup
from tests import invoke
from tests.sim.test_logfit import families, within_run

DATA = Path(__file__).with_name("data")


def test_parses_a_real_2024_console_log_excerpt():
    log = load_run_log(DATA / "verl_2024_gemma_excerpt.log")
    assert [s.step for s in log.steps][:3] == [0, 1, 2]  # the test-score-only line of step 0 merges in
    first = log.steps[0]
    assert first.stages == {
        "gen": 48.956,
        "ref": 12.07,
        "values": 9.785,
        "update_actor": 37.47,
        "update_critic": 32.657,
    }
    assert (first.response_mean, first.response_max, first.response_min, first.prompt_mean) == (
        136.469,
        476.0,
        31.0,
        84.502,
    )
    assert log.stages == ["gen", "ref", "values", "update_actor", "update_critic"]


def test_parses_current_names_and_drops_testing_steps(tmp_path):
    log = load_run_log(DATA / "verl_current_names.log")
    assert [s.step for s in log.steps] == [1, 2]  # step 3 also ran the validation: its time is not a step's
    assert log.steps[0].stages["old_log_prob"] == 6.118 and log.steps[0].stages["step"] == 91.12
    gz = tmp_path / "run.log.gz"
    gz.write_bytes(gzip.compress((DATA / "verl_current_names.log").read_bytes()))
    assert load_run_log(gz).steps == log.steps


def test_parses_openrlhf_console_lines_and_its_wandb_names(tmp_path):
    log = load_run_log(DATA / "openrlhf_global_step.log")
    assert [s.step for s in log.steps] == [1, 2]  # the last line was cut short: no step
    first = log.steps[0]
    assert first.stages == pytest.approx(
        {"gen": 41.206 + 1.904, "make_experience": 9.812, "ppo_train": 25.377, "step": 78.299}, abs=1e-9
    )  # generation and the weight broadcast into vLLM are one stage, as verl's gen includes resharding
    assert (first.response_mean, first.response_max, first.clipped) == (231.6, None, 0.012)
    assert log.stages == ["gen", "make_experience", "ppo_train", "step"]
    export = tmp_path / "wandb.csv"  # OpenRLHF logs train/<metric> to W&B
    export.write_text(
        "train/global_step,train/timing/generation,train/timing/broadcast,train/timing/ppo_train,"
        "train/rollout/response_length_mean\n4,40,2,25,230\n"
    )
    (step,) = load_run_log(export).steps
    assert (step.step, step.stages, step.response_mean) == (4, {"gen": 42.0, "ppo_train": 25.0}, 230.0)


def test_metric_dumps_csv_and_jsonl(tmp_path):
    rows = [
        {
            "step": i,
            "timing_s/gen": 10.0 + i,
            "timing_s/update_actor": 5.0,
            "response_length/mean": 100 + i,
            "response_length/max": 300,
        }
        for i in range(3)
    ]
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    csv_path = tmp_path / "m.csv"  # a W&B export spells the names with "_"
    csv_path.write_text(
        "step,timing_s_gen,timing_s_update_actor,response_length_mean,response_length_max\n"
        + "\n".join(f"{i},{10 + i},5,{100 + i},300" for i in range(3))
    )
    for path in (jsonl, csv_path):
        log = load_run_log(path)
        assert [s.stages["gen"] for s in log.steps] == [10.0, 11.0, 12.0] and log.stages == ["gen", "update_actor"]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"step,loss\n0,1.0\n", "no timing columns"),
        (b"nothing here\n", "no steps found"),
        (b"step,timing_s_gen,response_length_mean,response_length_max\n0,-3,10,20\n", "non-negative"),
        (b"step,timing_s_gen,response_length_mean,response_length_max\n0,fast,10,20\n", "non-numeric"),
        (bytes(range(256)) * 40, "not a text log"),
        (b"", "empty file"),  # not "binary": nothing was logged
    ],
)
def test_bad_logs_exit_2_with_one_line(tmp_path, content, message):
    path = tmp_path / ("bad.csv" if content.startswith(b"step,") else "bad.log")
    path.write_bytes(content)
    res = invoke.sim(
        "validate-log", "--log", str(path), "--setup", "verl-qwen2.5-0.5b-gsm8k", "--out", str(tmp_path / "out")
    )
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr
    assert not (tmp_path / "out").exists()


def fit_back(setup, path, known: dict) -> dict:
    """Calibrate ``setup`` on the log at ``path``; every ``known`` stage term is recovered. The fidelity report."""
    fitted, report = within_run(setup, load_run_log(path))
    for stage, cost in known.items():
        got = fitted.framework.stage(stage)
        for term, zero in (("efficiency", 1e-9), ("half_efficiency_tokens", 0.01), ("per_token_s", 1e-9)):
            # zero: what counts as none (a hundredth of a token per micro-batch is the solver's round-off)
            assert getattr(got, term) == pytest.approx(getattr(cost, term), rel=1e-3, abs=zero), (stage, term)
        # one per-step intercept, named after what the setup declares (its KV-cache reset, else unnamed)
        per_step = got.fixed_s + got.cache_reinit_s
        assert per_step == pytest.approx(cost.fixed_s + cost.cache_reinit_s, rel=1e-3, abs=1e-9), stage
    return report


def test_fit_recovers_known_parameters_from_a_synthesised_log(tmp_path):
    """Stage times predicted by a setup with known framework terms, written as a log, fitted back."""
    real = load_run_log(DATA / "verl_2024_gemma_excerpt.log")
    setup = load_setup("verl-gemma-2-2b-gsm8k")
    known = families(
        StageCost(efficiency=0.4, per_token_s=2e-4, fixed_s=6.0),
        StageCost(efficiency=0.5, half_efficiency_tokens=4000.0),
        StageCost(efficiency=0.3, half_efficiency_tokens=2500.0),
    )
    truth = dataclasses.replace(setup, framework=dataclasses.replace(setup.framework, **known))
    steps = list(real.steps) * 3  # 30 steps of real lengths
    stages = predict_stages(truth, replay(truth, steps), list(known))
    path = tmp_path / "synthetic.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(
                {
                    "step": i,
                    **{f"timing_s/{k}": float(v[i]) for k, v in stages.items()},
                    "response_length/mean": s.response_mean,
                    "response_length/max": s.response_max,
                    "response_length/min": s.response_min,
                    "prompt_length/mean": s.prompt_mean,
                }
            )
            for i, s in enumerate(steps)
        )
    )
    report = fit_back(setup, path, known)
    assert report["step"]["median_abs_err"] < 1e-6


def test_fit_of_composite_stages_recovers_shared_terms(tmp_path):
    """OpenRLHF times the four forward passes as one stage and both updates as one: a log synthesised with one set
    of terms per composite, in OpenRLHF's console format without the max length, is fitted back to those terms."""
    setup = load_setup("verl-qwen2.5-0.5b-gsm8k")
    forward, update = StageCost(efficiency=0.4, half_efficiency_tokens=3000.0), StageCost(efficiency=0.25)
    known = {"gen": StageCost(efficiency=0.5, per_token_s=1e-4, fixed_s=4.0)}
    # every part of a composite takes its terms: the rule reward's too (a CPU stage: 0 s under forward terms)
    known |= dict.fromkeys(("old_log_prob", "ref", "values", "reward"), forward) | dict.fromkeys(
        ("update_actor", "update_critic"), update
    )
    truth = dataclasses.replace(setup, framework=dataclasses.replace(setup.framework, **known))
    rng = np.random.default_rng(0)
    # no max or prompt length logged: a step whose responses were clipped decodes to the cap, the others to a
    # lognormal max; prompts take the setup's length
    steps = [
        LoggedStep(i, {}, float(m), None, None, None, clipped=0.02 * (i % 3 == 0))
        for i, m in enumerate(rng.uniform(150, 300, 20))
    ]
    stages = predict_stages(truth, replay(truth, steps), ["gen", "make_experience", "ppo_train"])
    lines = [
        f"INFO 08-13 19:02:47 ppo_trainer.py:545] ✨ Global step {s.step}: "
        + repr(
            {
                "timing/generation": float(stages["gen"][i]),
                "timing/make_experience": float(stages["make_experience"][i]),
                "timing/ppo_train": float(stages["ppo_train"][i]),
                "rollout/response_length_mean": s.response_mean,
                "rollout/truncated_rate": s.clipped,
            }
        )
        for i, s in enumerate(steps)
    ]
    path = tmp_path / "openrlhf.log"
    path.write_text("\n".join(lines))
    report = fit_back(setup, path, known)
    assert set(report["stages"]) == {"gen", "make_experience", "ppo_train"}
    assert report["step"]["median_abs_err"] < 1e-6


def test_calibrate_log_writes_a_setup_usable_anywhere(tmp_path):
    log = DATA / "verl_2024_gemma_excerpt.log"
    out = tmp_path / "cal"
    res = invoke.sim("calibrate-log", "--log", str(log), "--setup", "verl-gemma-2-2b-gsm8k", "--out", str(out))
    assert res.returncode == 0, res.stderr
    report = json.loads((out / "fidelity.json").read_text())
    assert set(report["stages"]) == {"gen", "ref", "values", "update_actor", "update_critic"}
    assert report["fit_steps"] + report["validate_steps"] == len(load_run_log(log).steps)
    assert report["step"]["median_abs_err"] < 0.2
    assert (out / "fidelity.png").stat().st_size > 1000
    calibrated = load_setup(str(out / "setup.toml"))
    assert calibrated.actor == "gemma-2-2b"
    assert calibrated.framework.gen != load_setup("verl-gemma-2-2b-gsm8k").framework.gen  # its own fitted terms
    res = invoke.sim("compare", "--setup", str(out / "setup.toml"), "--steps", "3", "--policies", "sync,oppo")
    assert res.returncode == 0, res.stderr
    assert np.isfinite([float(line.split()[1]) for line in res.stdout.splitlines()[1:]]).all()
