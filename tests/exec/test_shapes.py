"""One source of truth for model shapes: the simulator's shape of an executor preset is the shape the executor
builds, read from the checkpoint's own config.json."""

import json

import pytest
from transformers import LlamaForCausalLM

from oppo.exec.tiny import llama_config
from oppo.shapes import HF_SHAPES, load_hf_config
from oppo.sim.hardware import MODELS, model_shape


@pytest.mark.parametrize("preset", ["tiny-cpu", "small-cpu"])
def test_simulator_shape_is_the_executor_model(preset, tmp_path):
    config = llama_config(preset)
    config.save_pretrained(tmp_path)  # the config.json a prepared checkpoint carries
    from_checkpoint = model_shape(str(tmp_path / "config.json"))
    named = MODELS[preset]
    fields = ("layers", "hidden", "heads", "kv_heads", "mlp", "vocab", "bytes_per_param")
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
