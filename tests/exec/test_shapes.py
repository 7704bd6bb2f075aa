"""One source of truth for model shapes: the simulator's shape of an executor preset is the shape the executor
builds, read from the checkpoint's own config.json."""

import dataclasses
import json

import pytest
import torch
from transformers import (
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

from oppo.catalog.shapes import HF_SHAPES, load_hf_config
from oppo.exec.config import ExecConfig, ModelConfig
from oppo.exec.models.tiny import llama_config
from oppo.exec.train import stage_costs
from oppo.sim.cost.engine import ENGINES, MODELS, RooflineCost, model_shape
from oppo.sim.cost.gpu import GPUS
from oppo.sim.setup.toml_file import load_setup
from oppo.sim.study.experiments import flops_and_peaks

QWEN_05B_PUBLISHED = 494_032_768  # Qwen2.5-0.5B's model card: "Number of Parameters: 0.49B"
SMALL_TIED = dict(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=256,
    tie_word_embeddings=True,
)


def norms_and_biases(shape) -> int:
    """What the analytic count leaves aside in a Qwen2 model: RMSNorm weights (two per layer and a final one)
    and the q, k, v biases."""
    return (2 * shape.layers + 1) * shape.hidden + shape.layers * (shape.hidden + 2 * shape.kv_heads * shape.head_dim)


@pytest.mark.parametrize("preset", ["tiny-cpu", "small-cpu"])
def test_simulator_shape_is_the_executor_model(preset, tmp_path):
    config = llama_config(preset)
    config.save_pretrained(tmp_path)  # the config.json a prepared checkpoint carries
    from_checkpoint = model_shape(str(tmp_path / "config.json"))
    named = MODELS[preset]
    fields = ("layers", "hidden", "heads", "kv_heads", "head_dim", "mlp", "vocab", "bytes_per_param", "tied")
    assert [getattr(from_checkpoint, f) for f in fields] == [getattr(named, f) for f in fields]
    if preset == "tiny-cpu":  # the analytic parameter count matches the real model (RMSNorm weights aside)
        torch_params = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
        norms = (2 * named.layers + 1) * named.hidden
        assert named.params == torch_params - norms


def test_hf_config_errors_name_the_problem(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ValueError, match="missing num_hidden_layers"):
        load_hf_config(path)
    path.write_text(json.dumps(HF_SHAPES["tiny-cpu"] | {"hidden_size": -1}))
    with pytest.raises(ValueError, match="hidden_size must be a positive integer"):
        load_hf_config(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON config"):
        load_hf_config(path)
    with pytest.raises(ValueError, match="unknown model"):
        model_shape("no-such-model")


def test_tied_qwen_counts_its_head_once_as_its_model_card():
    """Qwen2.5-0.5B shares its LM head with the token embedding (136M of its 494M weights)."""
    shape = MODELS["qwen2.5-0.5b"]
    assert shape.params + norms_and_biases(shape) == QWEN_05B_PUBLISHED
    assert shape.weight_bytes == 2 * shape.params  # bf16


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"])
def test_parameter_count_is_the_built_model(name):
    """Tied (0.5B, 1.5B, 3B) and untied (7B) shapes against the model transformers builds (on the meta device)."""
    fields = {k: v for k, v in HF_SHAPES[name].items() if k != "dtype"}
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**fields))
    assert sum(p.numel() for p in model.parameters()) == MODELS[name].params + norms_and_biases(MODELS[name])


ARCHITECTURES = {  # the public shapes, built by the config class of their model type
    "qwen3-0.6b": "Qwen3",
    "qwen3-1.7b": "Qwen3",
    "qwen3-4b": "Qwen3",
    "qwen3-8b": "Qwen3",
    "gemma-2-2b": "Gemma2",
    "llama-3.1-8b": "Llama",
    "llama-2-7b": "Llama",
    "deepseek-llm-7b": "Llama",  # its config.json: LlamaForCausalLM
}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_public_shapes_count_the_matrices_of_the_built_model(name):
    """Every weight matrix (2-D parameter: embedding, projections, head) of the model transformers builds from the
    shape, on the meta device: head_dim (Qwen3's 128, Gemma 2's 256) and ties included; 1-D norms and biases are
    what the count leaves aside."""
    import transformers

    arch = ARCHITECTURES[name]
    config = getattr(transformers, f"{arch}Config")(**{k: v for k, v in HF_SHAPES[name].items() if k != "dtype"})
    with torch.device("meta"):
        model = getattr(transformers, f"{arch}ForCausalLM")(config)
    assert sum(p.numel() for p in model.parameters() if p.dim() == 2) == MODELS[name].params


@pytest.mark.parametrize(
    "name, published",  # model cards' totals: every parameter, norms included
    [("gemma-2-2b", 2_614_341_888), ("llama-3.1-8b", 8_030_261_248)],
)
def test_public_shapes_match_their_model_cards(name, published):
    shape = MODELS[name]
    norms = {"gemma-2-2b": (4 * shape.layers + 1) * shape.hidden, "llama-3.1-8b": (2 * shape.layers + 1) * shape.hidden}
    assert shape.params + norms[name] == published


def test_an_explicit_head_dim_sizes_the_kv_cache(tmp_path):
    gemma = MODELS["gemma-2-2b"]
    assert gemma.head_dim == 256 != gemma.hidden // gemma.heads
    assert gemma.kv_bytes_per_token == 2 * 26 * 4 * 256 * 2
    (tmp_path / "config.json").write_text(json.dumps(HF_SHAPES["qwen3-8b"] | {"model_type": "qwen3"}))
    assert model_shape(str(tmp_path / "config.json")).head_dim == 128  # 4096 / 32 would say 128 too
    (tmp_path / "config.json").write_text(json.dumps(HF_SHAPES["qwen3-0.6b"] | {"model_type": "qwen3"}))
    assert model_shape(str(tmp_path / "config.json")).head_dim == 128  # not 1024 / 16 = 64


def test_a_tie_saves_weights_and_bytes_not_flops():
    tied = MODELS["qwen2.5-0.5b"]
    untied = dataclasses.replace(tied, tied=False)
    head = tied.vocab * tied.hidden
    assert untied.params - tied.params == head and untied.weight_bytes - tied.weight_bytes == 2 * head
    assert tied.forward_flops(512, 1e5) == untied.forward_flops(512, 1e5)  # the head's matmul still runs
    cost = {m: RooflineCost(m, GPUS["h200"], 1, ENGINES["vllm"]) for m in (tied, untied)}
    assert cost[tied].decode_s(8, 4000) < cost[untied].decode_s(8, 4000)  # bandwidth-bound: fewer bytes read
    assert cost[tied].prefill_s(1e5, 1e7) == cost[untied].prefill_s(1e5, 1e7)  # compute-bound: same FLOPs


def test_hf_config_carries_the_tie(tmp_path):
    Qwen2Config(**SMALL_TIED).save_pretrained(tmp_path)
    assert load_hf_config(tmp_path)["tie_word_embeddings"] is True
    assert model_shape(str(tmp_path)).tied
    raw = json.loads((tmp_path / "config.json").read_text())
    for model_type, tied in (("gemma2", True), ("qwen2", False)):  # a config.json may omit its class's default
        raw.pop("tie_word_embeddings", None)
        (tmp_path / "config.json").write_text(json.dumps(raw | {"model_type": model_type}))
        assert load_hf_config(tmp_path)["tie_word_embeddings"] is tied


def test_both_backends_count_the_same_flops_per_role(tmp_path):
    """One FLOPs-per-role function: the executor's (from its checkpoints) and the simulator's (from the same
    config.json files) agree, on a tied actor with a one-label critic and reward model."""
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**SMALL_TIED)).save_pretrained(tmp_path / "actor")
    Qwen2ForSequenceClassification(Qwen2Config(**SMALL_TIED, num_labels=1)).save_pretrained(tmp_path / "reward")
    model = ModelConfig(preset="hf", actor=str(tmp_path / "actor"), reward=str(tmp_path / "reward"), device="cpu")
    executor = stage_costs(ExecConfig(model=model))[0]
    setup = dataclasses.replace(load_setup("tiny-cpu"), actor=str(tmp_path / "actor"), reward=str(tmp_path / "reward"))
    assert flops_and_peaks(setup)[0] == pytest.approx(executor, rel=1e-12)
    shape = model_shape(str(tmp_path / "actor"))
    assert executor["actor"] == executor["reference"] == shape.flops_per_token  # the LM head as if untied
    critic = dataclasses.replace(shape, score_head=True)
    assert executor["critic"] == executor["reward"] == critic.flops_per_token
    assert critic.flops_per_token == shape.flops_per_token - 2 * shape.vocab * shape.hidden + 2 * shape.hidden


def test_the_roofline_prices_the_matmuls_a_gpu_runs():
    """MFU counts the token embedding as 2 FLOPs a weight (verl's convention, both backends'); the simulator's
    roofline does not (a lookup is a gather of one row), and a critic's or reward model's head is its H x 1 score
    head, not the V x H LM head: every such role of a setup is costed with it."""
    shape = MODELS["qwen2.5-0.5b"]
    embedding = 2 * shape.vocab * shape.hidden
    assert shape.forward_flops(1, 0) == pytest.approx(shape.flops_per_token - embedding, rel=1e-12)
    critic = dataclasses.replace(shape, score_head=True)
    assert critic.forward_flops(1, 0) == pytest.approx(shape.forward_flops(1, 0) - embedding + 2 * shape.hidden)
    costs = load_setup("verl-qwen2.5-0.5b-gsm8k").costs()
    assert costs["critic"].base.model.score_head and not costs["actor"].base.model.score_head
    assert costs["critic"].base.model.params == shape.params + shape.hidden  # the actor's head is its embedding (tied)
