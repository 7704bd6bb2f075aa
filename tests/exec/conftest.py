import copy

import pytest
import torch
from transformers import LlamaForCausalLM, LlamaForSequenceClassification

from oppo.exec.tiny import llama_config


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
