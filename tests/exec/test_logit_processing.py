"""The scorers' log-probs are the model's own: whatever a family applies after its LM head (Gemma-2 soft-caps its
logits, Cohere multiplies them by a scale, Granite divides them), old and reference log-probs see it as the sampler
and the trainer do, so the PPO ratio is 1 at identical weights and the KL to an identical reference is 0."""

import pytest
import torch
from transformers import (
    CohereConfig,
    CohereForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

from oppo.exec.algos.ppo import sampled_logprobs
from oppo.exec.compute.scoring import StreamingScorer, score_once
from tests.exec.test_scoring import PAD, plain_forward, sequences, stream

SHAPE = dict(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, pad_token_id=PAD, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
)  # fmt: skip
FAMILIES = {
    # soft-capping bites only on logits near the cap: the head is scaled below so that they reach ~100
    "gemma2": (Gemma2ForCausalLM, Gemma2Config(**SHAPE, final_logit_softcapping=30.0, sliding_window=64)),
    "cohere": (CohereForCausalLM, CohereConfig(**SHAPE, logit_scale=0.0625)),
    "granite": (GraniteForCausalLM, GraniteConfig(**SHAPE, logits_scaling=8.0)),
    "llama": (LlamaForCausalLM, LlamaConfig(**{k: v for k, v in SHAPE.items() if k != "head_dim"})),  # no change
}
TEMPERATURE = 0.7
# Gemma-2 has no sdpa attention. Hugging Face's eager attention takes its softmax in float32 whatever the model's
# dtype, so chunked and one-shot float64 forwards agree to float32's precision there (measured ~1e-7 relative).
ATTENTION = {name: "eager" if name == "gemma2" else "sdpa" for name in FAMILIES}
TOLERANCE = {"eager": 1e-6, "sdpa": 1e-10}  # relative to the larger of 1 and the largest log-prob magnitude


def build(name: str) -> torch.nn.Module:
    cls, config = FAMILIES[name]
    config._attn_implementation = ATTENTION[name]
    torch.manual_seed(0)
    model = cls(config).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(300.0)  # logits of realistic size (~100), where post-processing matters
    return model


def own_logprobs(model, seqs) -> list[torch.Tensor]:
    """Per sequence, log-probs of its response tokens under ``model(...).logits``, as the sampler and trainer see it."""
    logits, _ = plain_forward(model, seqs)
    logp = sampled_logprobs(logits, TEMPERATURE)
    return [
        logp[row, p - 1 : len(t) - 1].gather(1, torch.tensor(t[p:])[:, None]).squeeze(1)
        for row, (_, t, p) in enumerate(seqs)
    ]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_scored_logprobs_are_the_models_own(name):
    model = build(name)
    seqs = sequences(1)
    expected = torch.cat(own_logprobs(model, seqs))
    assert float(expected.abs().max()) > 1.0  # not a degenerate case where every distribution is flat
    streamed = torch.cat(stream(StreamingScorer(model, "logprob", True, PAD, TEMPERATURE), seqs, 5))
    once = torch.cat(score_once(model, "logprob", seqs, PAD, TEMPERATURE))
    # float64; chunked and one-shot forwards reduce in different orders
    tolerance = TOLERANCE[ATTENTION[name]] * max(1.0, float(expected.abs().max()))
    assert float((streamed - expected).abs().max()) <= tolerance
    assert float((once - expected).abs().max()) <= tolerance
    ratio = torch.exp(streamed - expected)  # the PPO ratio at identical weights
    assert float((ratio - 1).abs().max()) <= 10 * tolerance


@pytest.mark.parametrize("name", ["gemma2", "cohere"])
def test_the_trainers_response_logits_are_the_models_own_at_every_prompt_length(name):
    """The update projects onto the vocabulary only from the first response's position on: rows whose prompts are
    longer than the shortest (2 to 6 tokens here) must still get their own positions' logits, post-processed."""
    from oppo.exec.compute.update import response_logits

    model = build(name)
    seqs = sequences(1)
    full, mask = plain_forward(model, seqs)  # (B, L, V) over every position
    longest = max(len(t) - p for _, t, p in seqs)
    pos = torch.zeros(len(seqs), longest, dtype=torch.long)
    for row, (_, t, p) in enumerate(seqs):
        pos[row, : len(t) - p] = torch.arange(p - 1, len(t) - 1)
    ids = torch.where(mask.bool(), full.new_zeros(mask.shape, dtype=torch.long), PAD)
    for row, (_, t, _) in enumerate(seqs):
        ids[row, : len(t)] = torch.tensor(t)
    with torch.no_grad():
        got = response_logits(model, {"ids": ids, "attn": mask, "pos": pos})
    expected = full.gather(1, pos[:, :, None].expand(-1, -1, full.shape[-1]))
    assert got.shape == expected.shape
    valid = torch.zeros(pos.shape, dtype=torch.bool)  # response tokens; the padding after them is masked out
    for row, (_, t, p) in enumerate(seqs):
        valid[row, : len(t) - p] = True
    # float64, the same padded forward; the projection on fewer positions
    torch.testing.assert_close(got[valid], expected[valid], rtol=1e-12, atol=1e-9)
