"""GPU path: the same checks on CUDA. Run with ``pytest -m gpu`` on a machine with a GPU; skipped without one."""

import copy

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_streamed_reward_equals_full_on_cuda(tiny_models):
    from oppo.exec.scoring import StreamingScorer, score_once
    from tests.exec.test_scoring import sequences, stream

    _, reward = tiny_models[torch.float32]
    reward = copy.deepcopy(reward).to("cuda")  # the session fixture stays on the CPU
    seqs = sequences(0)
    streamed = torch.stack(stream(StreamingScorer(reward, "reward", True, 0), seqs, 7))
    once = torch.stack(score_once(reward, "reward", seqs, 0))
    assert (streamed - once).abs().max() <= 1e-4


def test_short_run_on_cuda_bf16(tmp_path):
    from oppo.exec.config import ExecConfig, ModelConfig, default_schedule
    from oppo.exec.train import train

    config = ExecConfig(schedule=default_schedule(policy="oppo", batch=4), model=ModelConfig(device="cuda"), steps=3)
    assert train(config, tmp_path / "run") == 0
    import json

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    mfu = summary["stages"]["actor/train_actor"]["mfu"]  # a known datacenter GPU reports its MFU
    assert mfu is None or 0 < mfu < 1
