"""The CPU-side parts of benchmarks/gpu_validate.py: arguments, the no-CUDA exit, model building at small size."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from oppo.catalog.shapes import HF_SHAPES
from oppo.exec.models.random_checkpoints import random_checkpoints
from tests.invoke import train

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_validate.py"
SMALL = dict(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=256,
)


def script(*args, cwd=None):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd)


def test_help_names_every_option():
    res = script("--help")
    options = ("--out", "--models", "--steps", "--dp", "--real-engines")
    assert res.returncode == 0 and all(o in res.stdout for o in options)


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--models", "gpt-9"), "unknown model shape"),
        (("--steps", "0"), "must be >= 1"),
        (("--dp", "-1"), "--dp must be >= 0"),
        (("--real-engines", "sglang"), "unknown rollout engine"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, extra, message):
    res = script("--out", str(tmp_path / "o"), *extra)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and message in res.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_exits_2_and_writes_nothing(tmp_path):
    res = script("--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "needs CUDA" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_random_checkpoints_of_a_real_architecture_load_and_train(tmp_path):
    paths = random_checkpoints(SMALL, tmp_path / "ckpt")
    actor = AutoModelForCausalLM.from_pretrained(paths["actor"])
    reward = AutoModelForSequenceClassification.from_pretrained(paths["reward"])
    assert type(actor).__name__ == "Qwen2ForCausalLM" and reward.config.num_labels == 1
    assert actor.config.num_hidden_layers == 2 and json.loads((paths["actor"] / "config.json").read_text())
    assert set(HF_SHAPES["qwen2.5-1.5b"]) >= set(SMALL)  # the real shapes have the fields a small one does
    res = train(
        "--preset", "hf", "--actor", paths["actor"], "--reward", paths["reward"], "--dtype", "float32",
        "--device", "cpu", "--policy", "oppo", "--steps", "2", "--batch", "2", "--max-new-tokens", "8",
        "--out", tmp_path / "run",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 2


def test_the_real_model_part_runs_grpo_on_the_arithmetic_task(tmp_path):
    """Part 5 at a smoke's size: the tiny model in float32 on a CPU stands for SmolLM2 in bfloat16 on CUDA; a row
    per policy, with its step time and held-out score before and after."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_validate", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = argparse.Namespace(real_steps=2, real_scale=1)
    rows = module.run_real_model(args, tmp_path, preset="tiny-cpu", device="cpu", dtype="float32")
    assert [r["policy"] for r in rows] == ["sync", "oppo"]
    for row in rows:
        assert row["median_step_s"] > 0 and 0 <= row["held_out_before"] <= 1 and 0 <= row["held_out_after"] <= 1
    assert (tmp_path / "data" / "train.jsonl").is_file() and (tmp_path / "tiny-cpu" / "oppo" / "steps.csv").is_file()
