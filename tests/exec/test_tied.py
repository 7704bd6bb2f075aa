"""Tied input embedding and output head (Qwen2.5 0.5B-3B, Llama 3.2, Gemma): two ranks, whole or sharded, take
the steps one rank takes, and the head is still the embedding after training."""

import pytest
import torch

pytest.importorskip("ray")

from oppo.exec.checkpoints import random_checkpoints  # noqa: E402
from tests.exec.test_check_ranks import TINY_QWEN2  # noqa: E402
from tests.exec.test_data_parallel import assert_same_steps, run, run_in_child  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module")
def tied_model(tmp_path_factory) -> dict:
    """``--preset hf`` settings of a tied Qwen2 actor (random weights, float64) and its reward model."""
    paths = random_checkpoints(TINY_QWEN2, tmp_path_factory.mktemp("tied"), tied=True, dtype=torch.float64)
    return {"preset": "hf", "actor": str(paths["actor"]), "reward": str(paths["reward"])}


@pytest.fixture(scope="module")
def one_rank(tied_model):
    return run("oppo", 1, model=tied_model, steps=STEPS)


def head_is_embedding(state: dict[str, torch.Tensor]) -> bool:
    return torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])


def test_tied_checkpoint_loads_tied(tied_model):
    from oppo.exec.config import ModelConfig
    from oppo.exec.models import load_role

    actor = load_role(ModelConfig(**tied_model, dtype="float64"), "actor")
    assert actor.lm_head.weight is actor.get_input_embeddings().weight


# unsharded, both ranks hold the one tied parameter whole (-m slow); sharded, the tie must survive FSDP
@pytest.mark.parametrize("shard", [pytest.param(False, marks=pytest.mark.slow), True])
def test_tied_two_ranks_take_the_steps_of_one_in_float64(tmp_path, tied_model, one_rank, shard, shared_ray):
    """Sharded, the embedding and the head must stay one parameter (one FSDP unit): as two units they would be
    two copies, each updated with part of the gradient, and the run would differ from the first update on."""
    two = run_in_child(tmp_path, shared_ray, policy="oppo", dp=2, shard=shard, model=tied_model, steps=STEPS)
    assert_same_steps(one_rank, two)
    assert head_is_embedding(one_rank.weights["actor"]) and head_is_embedding(two.weights["actor"])
