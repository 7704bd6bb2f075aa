import copy

import pytest
import torch
from transformers import LlamaForCausalLM, LlamaForSequenceClassification

from oppo.exec.models.tiny import llama_config


@pytest.fixture(scope="session")
def tiny_models():
    """Random tiny actor (causal LM) and reward model (1-label classifier), keyed by dtype: the float64 pair is a
    cast *copy* of the float32 pair (same weights), so each key holds models of exactly that dtype."""
    torch.manual_seed(0)
    actor = LlamaForCausalLM(llama_config("tiny-cpu")).eval()
    reward = LlamaForSequenceClassification(llama_config("tiny-cpu", num_labels=1)).eval()
    return {
        torch.float32: (actor, reward),
        torch.float64: (copy.deepcopy(actor).to(torch.float64), copy.deepcopy(reward).to(torch.float64)),
    }


@pytest.fixture(scope="session")
def tied_model(tmp_path_factory) -> dict:
    """``--preset hf`` settings of a tied Qwen2 actor (input embedding = output head; random weights, float64) and
    its reward model."""
    from oppo.exec.models.random_checkpoints import random_checkpoints
    from tests.exec.test_check_ranks import TINY_QWEN2

    paths = random_checkpoints(TINY_QWEN2, tmp_path_factory.mktemp("tied"), tied=True, dtype=torch.float64)
    return {"preset": "hf", "actor": str(paths["actor"]), "reward": str(paths["reward"])}
