"""GPU path: the same checks on CUDA. Run with ``pytest -m gpu`` on a machine with a GPU; skipped without one."""

import copy

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_streamed_reward_equals_full_on_cuda(tiny_models):
    from oppo.exec.compute.scoring import StreamingScorer, score_once
    from tests.exec.test_scoring import sequences, stream

    _, reward = tiny_models[torch.float32]
    reward = copy.deepcopy(reward).to("cuda")  # the session fixture stays on the CPU
    seqs = sequences(0)
    streamed = torch.stack(stream(StreamingScorer(reward, "reward", True, 0), seqs, 7))
    once = torch.stack(score_once(reward, "reward", seqs, 0))
    assert (streamed - once).abs().max() <= 1e-4


def test_short_run_on_cuda_bf16(tmp_path):
    """A known datacenter GPU reports MFU for every stage that processed tokens, each a fraction of its peak."""
    import json

    from oppo.catalog.gpus import gpu_by_device_name
    from oppo.exec.config import ExecConfig, ModelConfig, default_schedule
    from oppo.exec.train import train

    name = torch.cuda.get_device_name()
    if gpu_by_device_name(name) is None:
        pytest.skip(f"{name}: no datasheet peak in oppo.catalog.gpus, so no MFU to check")
    config = ExecConfig(schedule=default_schedule(policy="oppo", batch=4), model=ModelConfig(device="cuda"), steps=3)
    assert train(config, tmp_path / "run") == 0
    stages = json.loads((tmp_path / "run" / "summary.json").read_text())["stages"]
    computed = {stage: s["mfu"] for stage, s in stages.items() if s["tokens_per_s"] > 0}
    assert "actor/train_actor" in computed and "actor/decode" in computed
    assert all(mfu is not None and 0 < mfu < 1 for mfu in computed.values()), computed


def test_reward_worker_on_cuda_equals_colocated_in_float32(tmp_path):
    """The reward model in a Ray worker (``num_gpus=1``, sharing the one GPU with the driver) against all roles in
    one process: same rewards (float32 on the GPU, tolerance 1e-4)."""
    pytest.importorskip("ray")
    import csv

    from oppo.exec.config import ExecConfig, ModelConfig, default_schedule
    from oppo.exec.train import train

    rewards = {}
    for placement in ("colocated", "disaggregated"):
        config = ExecConfig(
            schedule=default_schedule(policy="oppo", batch=4),
            steps=3,
            seed=3,
            placement=placement,
            model=ModelConfig(device="cuda", dtype="float32"),
        )
        assert train(config, tmp_path / placement) == 0
        rewards[placement] = [float(r["mean_reward"]) for r in csv.DictReader(open(tmp_path / placement / "steps.csv"))]
    assert rewards["disaggregated"] == pytest.approx(rewards["colocated"], abs=1e-4)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("shard", [False, True])
def test_two_ranks_over_nccl_stay_identical(tmp_path, shard):
    """--dp 2 on two GPUs: NCCL all-reduce (or FSDP2's reduce-scatter); the ranks' whole weights are compared bit
    for bit after every step."""
    pytest.importorskip("ray")
    from oppo.exec.config import ExecConfig, ModelConfig, default_schedule
    from oppo.exec.train import train

    config = ExecConfig(
        schedule=default_schedule(policy="oppo", batch=4),
        steps=3,
        dp=2,
        check_ranks=True,
        shard=shard,
        model=ModelConfig(device="cuda"),
    )
    assert train(config, tmp_path / "dp2") == 0
