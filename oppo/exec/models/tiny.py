"""The tiny presets (``tiny-cpu``, ``small-cpu``): Llama-architecture checkpoints built from a shape, prepared
for the default task and saved, so that they load through ``from_pretrained(path)`` like any checkpoint.

Shapes come from :data:`oppo.catalog.shapes.HF_SHAPES` (the simulator reads the same entries). Preparation: SFT warm-up
of the actor and a reward model trained on synthetic preferences (:mod:`.synthetic`); deterministic; cached
in ``$OPPO_CACHE`` (default ``~/.cache/oppo``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, PreTrainedTokenizerFast

from oppo.catalog.shapes import HF_SHAPES
from oppo.exec.tasks import synthetic
from oppo.exec.tasks.synthetic import BOS, EOS, PAD

CACHE_VERSION = "v1"
PREP_STEPS = {"tiny-cpu": (300, 400, 32), "small-cpu": (60, 80, 16)}  # SFT steps, RM steps, batch


def cache_dir() -> Path:
    return Path(os.environ.get("OPPO_CACHE", Path.home() / ".cache" / "oppo"))


def llama_config(preset: str, num_labels: int | None = None) -> LlamaConfig:
    extra = {"num_labels": num_labels} if num_labels else {}
    return LlamaConfig(
        **HF_SHAPES[preset],
        max_position_embeddings=4096,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
        attn_implementation="sdpa",
        **extra,
    )


def tiny_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``<pad> </s> <s> t3 t4 ...`` so the tiny checkpoints are complete folders."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": PAD, "</s>": EOS, "<s>": BOS} | {f"t{i}": i for i in range(3, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>")


def place_built(tmp: Path, folder: Path) -> None:
    """Rename the complete folder ``tmp`` to ``folder``. A complete ``folder`` (its ``config.json`` there) is never
    removed: another process (a parallel test run) may be reading it, and it holds the same bytes, built from the
    same seed; an incomplete one (an interrupted build of older code) is moved aside first, then deleted."""
    if folder.exists() and not (folder / "config.json").exists():
        aside = folder.with_name(f"{folder.name}.stale{os.getpid()}")
        os.replace(folder, aside)
        shutil.rmtree(aside, ignore_errors=True)
    try:
        os.replace(tmp, folder)
    except OSError:
        if not (folder / "config.json").exists():
            raise
        shutil.rmtree(tmp)  # another process placed its complete folder first: keep that one


def prepared_checkpoints(preset: str) -> dict[str, Path]:
    """Folders of the preset's actor and reward model, built and prepared at first use (deterministic)."""
    root = cache_dir() / f"{preset}-{CACHE_VERSION}"
    paths = {"actor": root / "actor", "reward": root / "reward"}
    if all((p / "config.json").exists() for p in paths.values()):
        return paths
    torch.manual_seed(0)
    actor = LlamaForCausalLM(llama_config(preset))
    reward = LlamaForSequenceClassification(llama_config(preset, num_labels=1))
    sft_steps, rm_steps, batch = PREP_STEPS[preset]
    synthetic.sft_warmup(actor, vocab_size=HF_SHAPES[preset]["vocab_size"], steps=sft_steps, batch=batch)
    synthetic.train_reward_model(reward, vocab_size=HF_SHAPES[preset]["vocab_size"], steps=rm_steps, batch=batch)
    tokenizer = tiny_tokenizer(HF_SHAPES[preset]["vocab_size"])
    for name, model in (("actor", actor), ("reward", reward)):
        tmp = paths[name].with_name(f"{paths[name].name}.tmp{os.getpid()}")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        place_built(tmp, paths[name])
    return paths
