"""The rollout options that need no engine: their checks, the importance weights over the engine-trainer mismatch,
the engine's log-probs in place of the old log-probs' pass, and the one-line errors of a missing engine or a budget
too small."""

from __future__ import annotations

import csv
import json
import math
import re

import pytest
import torch

from oppo.exec.algos.ppo import rollout_is_weight
from oppo.exec.config import ExecConfig, PPOConfig, RolloutConfig, TaskConfig, default_schedule
from oppo.exec.engines import vllm_engine
from tests.invoke import train


def rows(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_token_weights_are_the_capped_ratio_and_sequence_weights_one_per_sample():
    trainer = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]])
    engine = torch.tensor([[-1.2, -1.0, -0.5], [-3.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the second sample's last position is padding
    token = rollout_is_weight(trainer, engine, mask, "token", cap=2.0)
    expected = torch.tensor([[math.exp(0.2), math.exp(-1.0), 1.0], [2.0, 1.0, 1.0]])  # exp(2) capped at 2
    assert torch.allclose(token, expected, atol=1e-6)
    sequence = rollout_is_weight(trainer, engine, mask, "sequence", cap=2.0)
    assert torch.allclose(sequence[0], torch.full((3,), math.exp(0.2 - 1.0)), atol=1e-6)
    assert torch.allclose(sequence[1], torch.full((3,), 2.0))  # exp(2 + 0), capped
    assert not sequence.requires_grad


VLLM = {"rollout_engine": "vllm"}


@pytest.mark.parametrize(
    "rollout, other, message",
    [
        ({"rollout_engine": "sglang"}, {}, "unknown rollout_engine 'sglang'"),
        ({"engine_memory": 0}, {}, "engine_memory must be > 0"),
        ({"rollout_is": "token", "rollout_log_probs": "engine"}, {}, "--rollout-log-probs recompute"),
        ({"rollout_is_cap": 0.5}, {}, "rollout_is_cap must be >= 1"),
        ({"rollout_is": "token"}, {"ppo": PPOConfig(offpolicy="decoupled")}, "the same correction"),
        ({"rollout_log_probs": "engine"}, {"ppo": PPOConfig(offpolicy="decoupled")}, "recomputes the proximal"),
        (VLLM, {"dp": 2}, "--dp 1"),
        (VLLM, {"schedule": default_schedule(policy="async")}, "--policy async"),
        (VLLM | {"rollout_log_probs": "engine"}, {"task": TaskConfig(lengths="gsm8k")}, "no engine log-prob"),
        (VLLM | {"rollout_is": "token"}, {"task": TaskConfig(lengths="gsm8k")}, "no engine log-prob"),
        (VLLM | {"rollout_log_probs": "engine"}, {"ppo": PPOConfig(top_p=0.9)}, "the cut distribution's log-probs"),
        (VLLM | {"rollout_is": "token"}, {"ppo": PPOConfig(top_k=5)}, "the cut distribution's log-probs"),
    ],
)
def test_rollout_options_that_cannot_go_together_are_refused(rollout, other, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ExecConfig(rollout=RolloutConfig(**rollout), **other)


def test_traced_lengths_on_vllm_with_recomputed_log_probs_are_accepted():
    ExecConfig(rollout=RolloutConfig(**VLLM), task=TaskConfig(lengths="gsm8k"))


def test_engine_log_probs_skip_the_old_log_probs_pass_and_train_alike_on_the_hf_loop(tmp_path):
    """The hf loop samples from the trainer's own forward passes: its log-probs are the recomputed ones to float32
    rounding, so a run that takes them as the old log-probs trains as one that recomputes them (losses to 1e-4 of
    their scale), without the actor's scoring pass. (sync: every token is sampled by the weights it trains; a carried
    token of an over-commit policy keeps its sampling weights' log-prob, unlike a recomputed one.)"""
    common, common_runs = ["--steps", "2", "--batch", "2", "--policy", "sync", "--seed", "4"], ("recompute", "engine")
    for name, mode in (("recompute", "recompute"), ("engine", "engine")):
        res = train(*common, "--rollout-log-probs", mode, "--out", tmp_path / name)
        assert res.returncode == 0, res.stderr
    scored = {run: {(r["role"], r["phase"]) for r in rows(tmp_path / run / "trace.csv")} for run in (common_runs)}
    assert ("actor", "score") in scored["recompute"] and ("actor", "score") not in scored["engine"]
    got, expected = rows(tmp_path / "engine" / "metrics.csv"), rows(tmp_path / "recompute" / "metrics.csv")
    for a, b in zip(got, expected):
        assert abs(float(a["policy_loss"]) - float(b["policy_loss"])) <= 1e-4 * max(1.0, abs(float(b["policy_loss"])))
        assert a["rollout_probs_diff_mean"] == "nan"  # nothing recomputed to compare with
        assert float(b["rollout_probs_diff_max"]) < 1e-5  # the hf loop's sampling distribution is the trainer's
        assert b["engine_preemptions"] == "nan"  # no engine
    assert json.loads((tmp_path / "engine" / "summary.json").read_text())["rollout_engine"] == "hf"


def test_a_missing_engine_is_one_line_and_exit_2(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_engine, "version", lambda: None)
    with pytest.raises(ValueError, match="needs vLLM: ./scripts/setup.sh installs it"):
        vllm_engine.VllmEngine(tmp_path, torch.float32, 1.0, 64, eos_id=2)


def test_a_model_the_cpu_engine_cannot_run_is_one_line_and_exit_2(tmp_path):
    res = train("--rollout-engine", "vllm", "--steps", "1", "--out", tmp_path / "run")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error: vLLM's CPU attention takes head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512; preset "
        "tiny-cpu has 16: --preset smollm2, or --rollout-engine hf"
    ]


def test_a_kv_budget_below_one_sequence_is_refused_before_the_engine_starts():
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    # SmolLM2-135M: 2 x 30 layers x 3 KV heads x 64 x 4 bytes = 46,080 bytes a token in float32
    assert vllm_engine.kv_bytes_per_token(config, torch.float32) == 46_080
    # 144 tokens take two 128-token blocks on a CPU: 256 tokens' memory, exactly, is taken; a token less is not
    vllm_engine.check_budget(46_080 * 256 / 2**30, config, torch.float32, 144)
    with pytest.raises(ValueError, match=r"cannot hold one sequence of 144 tokens \(0.011 GiB .* 128-token blocks\)"):
        vllm_engine.check_budget(46_080 * 255 / 2**30, config, torch.float32, 144)
    vllm_engine.check_budget(46_080 * 144 / 2**30, config, torch.float32, 144, device="cuda:0")  # 16-token blocks


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rollout_importance_sampling_trains_and_on_the_hf_loop_weighs_nothing(tmp_path, level):
    """On the hf loop p_engine = p_trainer to rounding, so every weight is 1 and the run trains as one without the
    correction (losses to 1e-5 of their scale)."""
    common = ["--steps", "2", "--batch", "2", "--policy", "sync", "--seed", "5"]
    for name, flags in (("plain", []), ("is", ["--rollout-is", level, "--rollout-is-cap", "1.5"])):
        res = train(*common, *flags, "--out", tmp_path / name)
        assert res.returncode == 0, res.stderr
    for a, b in zip(rows(tmp_path / "is" / "metrics.csv"), rows(tmp_path / "plain" / "metrics.csv")):
        assert abs(float(a["policy_loss"]) - float(b["policy_loss"])) <= 1e-5 * max(1.0, abs(float(b["policy_loss"])))


def test_a_resumed_run_marks_the_rollout_engines_weights_as_changed(tmp_path, monkeypatch):
    """The engine loaded the starting checkpoint; after --resume it must take the restored weights before it
    generates (here counted on the hf loop's hook: one call per update, and one for the restore)."""
    from oppo.exec.compute import rollout

    res = train("--steps", "2", "--batch", "2", "--save-every", "2", "--out", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    calls = []
    monkeypatch.setattr(rollout.Rollout, "updated", lambda self: calls.append(1))
    res = train("--steps", "3", "--resume", tmp_path / "run")
    assert res.returncode == 0, res.stderr
    epochs, minibatches = 2, 2  # the tiny preset's defaults: updates a step
    assert len(calls) == 1 + epochs * minibatches


def test_the_engine_trainer_gap_leaves_out_an_eos_without_engine_log_prob_but_shows_a_trainers_nan():
    from oppo.exec.step.runner import probs_diff

    trainer = [torch.tensor([math.log(0.5), math.log(0.25)], dtype=torch.float64)]
    engine = [torch.tensor([math.log(0.4), math.nan], dtype=torch.float64)]  # an EOS put at a traced length
    gap = probs_diff(trainer, engine)
    assert gap["rollout_probs_diff_mean"] == pytest.approx(0.1) and gap["rollout_probs_diff_max"] == pytest.approx(0.1)
    diverged = probs_diff([torch.tensor([math.nan, math.log(0.5)])], [torch.tensor([math.log(0.5), math.log(0.5)])])
    assert math.isnan(diverged["rollout_probs_diff_mean"])
