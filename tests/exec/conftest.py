import pytest
import torch
from transformers import LlamaForCausalLM, LlamaForSequenceClassification

from oppo.exec.models import llama_config


@pytest.fixture(scope="session")
def tiny_models():
    """Random tiny actor (causal LM) and reward model (1-label classifier), float32 and float64 copies."""
    torch.manual_seed(0)
    actor = LlamaForCausalLM(llama_config("tiny-cpu")).eval()
    reward = LlamaForSequenceClassification(llama_config("tiny-cpu", num_labels=1)).eval()
    return {
        torch.float32: (actor, reward),
        torch.float64: (LlamaForCausalLM(actor.config).to(torch.float64).eval(), reward.to(torch.float64)),
    }
