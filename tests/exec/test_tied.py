"""Tied input embedding and output head (Qwen2.5 0.5B-3B, Llama 3.2, Gemma): two ranks, whole or sharded, take
the steps one rank takes, and the head is still the embedding after training. Sharded, the default run checks it in
tests/exec/test_data_parallel.py (its sharded GRPO case trains the tied model)."""

import pytest

pytest.importorskip("ray")

from tests.exec.test_data_parallel import assert_same_steps, head_is_embedding, run, run_in_child  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module")
def one_rank(tied_model):
    return run("oppo", 1, model=tied_model, steps=STEPS)


def test_tied_checkpoint_loads_tied(tied_model):
    from oppo.exec.config import ModelConfig
    from oppo.exec.models.roles import load_role

    actor = load_role(ModelConfig(**tied_model, dtype="float64"), "actor")
    assert actor.lm_head.weight is actor.get_input_embeddings().weight


# unsharded, both ranks hold the one tied parameter whole; sharded, the tie must survive FSDP (the default run has
# it in test_data_parallel.py's sharded GRPO case)
@pytest.mark.parametrize("shard", [False, True])
@pytest.mark.slow
def test_tied_two_ranks_take_the_steps_of_one_in_float64(tmp_path, tied_model, one_rank, shard, shared_ray):
    """Sharded, the embedding and the head must stay one parameter (one FSDP unit): as two units they would be
    two copies, each updated with part of the gradient, and the run would differ from the first update on."""
    two = run_in_child(tmp_path, shared_ray, policy="oppo", dp=2, shard=shard, model=tied_model, steps=STEPS)
    assert_same_steps(one_rank, two)
    assert head_is_embedding(one_rank.weights["actor"]) and head_is_embedding(two.weights["actor"])
