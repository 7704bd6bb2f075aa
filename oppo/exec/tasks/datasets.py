"""RL prompt datasets as users already keep them, and their prompts as token ids.

:func:`load_items` reads JSON lines (``.jsonl``), JSON (``.json``: an array of objects, or the JSON lines that
``datasets.Dataset.to_json`` writes) and Parquet (``.parquet``) through the ``datasets`` library, in either of two
row schemas:

- verl's: ``prompt`` (a list of ``{"role", "content"}`` chat messages, or a plain string), ``data_source``,
  ``reward_model`` (an object with ``ground_truth``, usually with ``style: "rule"``) and an optional ``extra_info``
  object. It is the layout verl's example preprocessors (``examples/data_preprocess/gsm8k.py`` and its siblings)
  save as Parquet, so their output is read as it is.
- plain: ``question`` and ``answer``; the answer is the ground truth, kept whole (a GSM8K answer keeps its
  reasoning and its ``#### N`` line: the reward function extracts the number). ``data_source`` defaults to the
  file's stem.

:func:`encode_prompt` turns an item into the prompt's token ids: through the tokenizer's chat template (with the
generation prompt) where it has one, or the messages' contents joined by newlines, and refuses or left-truncates a
prompt over a token budget.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}  # file suffix -> datasets' builder
CHAT_TEMPLATES = ("auto", "none")
TRUNCATIONS = ("error", "left")


@dataclass(frozen=True)
class PromptItem:
    """One prompt: its chat messages as (role, content) pairs (a plain-string prompt is one user message), where it
    comes from (the reward function is chosen by it) and the ground truth the rule reward compares against."""

    messages: tuple[tuple[str, str], ...]
    data_source: str
    ground_truth: str
    extra_info: dict[str, Any] = field(default_factory=dict, hash=False)


def load_items(path: str | Path) -> list[PromptItem]:
    """Every row of a ``.jsonl``, ``.json`` or ``.parquet`` file, in order. ValueError (one line naming the file,
    and the row where one is at fault) for an unknown suffix, a missing, unreadable or empty file, or a row in
    neither schema."""
    path = Path(path)
    rows = _read_rows(path)
    return [_item(row, path, i) for i, row in enumerate(rows)]


def encode_prompt(
    item: PromptItem,
    tokenizer: Any,
    chat_template: str = "auto",
    max_tokens: int | None = None,
    truncation: str = "error",
    index: int | None = None,
) -> list[int]:
    """The prompt's token ids.

    ``chat_template``: ``"auto"`` applies the tokenizer's chat template with the generation prompt where it has one
    (the template writes its own special tokens), else encodes as ``"none"`` does: the messages' contents joined by
    newlines, with the tokenizer's special tokens. ``max_tokens``: a longer prompt is refused (``truncation="error"``,
    ValueError naming ``index`` where given) or keeps its last ``max_tokens`` tokens (``"left"``).
    """
    if chat_template not in CHAT_TEMPLATES:
        raise ValueError(f"unknown chat_template {chat_template!r}; choose from {', '.join(CHAT_TEMPLATES)}")
    if truncation not in TRUNCATIONS:
        raise ValueError(f"unknown truncation {truncation!r}; choose from {', '.join(TRUNCATIONS)}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if chat_template == "auto" and getattr(tokenizer, "chat_template", None):
        ids = _templated_ids(item, tokenizer)
    else:
        ids = list(tokenizer.encode("\n".join(content for _, content in item.messages), add_special_tokens=True))
    return _fit(ids, max_tokens, truncation, index)


# -- reading ------------------------------------------------------------------------------------------------------


def _read_rows(path: Path) -> list[dict[str, Any]]:
    builder = READERS.get(path.suffix.lower())
    if builder is None:
        raise ValueError(f"{path}: unknown suffix {path.suffix!r}; expected one of {', '.join(READERS)}")
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: empty file")
    import datasets  # not a dependency of the core: only reading prompt files needs it

    datasets.disable_progress_bars()  # a file read in a second: no bar for it
    verbosity = datasets.logging.get_verbosity()
    # its json reader logs the parser's error before raising it: the one line of the ValueError below says it
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)

    # A throwaway cache: the rows are kept in memory and nothing is left under the user's home.
    with tempfile.TemporaryDirectory(prefix="oppo-datasets-") as cache_dir:
        try:
            dataset = datasets.load_dataset(
                builder, data_files=str(path), split="train", keep_in_memory=True, cache_dir=cache_dir
            )
            rows = dataset.to_list()  # a string column's bytes are decoded here (UnicodeDecodeError)
        except Exception as exc:  # the readers raise many kinds (ArrowInvalid, DatasetGenerationError, ...)
            raise ValueError(f"{path}: cannot read as {builder}: {_reason(exc)}") from exc
        finally:
            datasets.logging.set_verbosity(verbosity)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def _reason(exc: BaseException) -> str:
    """The innermost cause's type and first line: the readers wrap the parser's error in their own."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _item(row: dict[str, Any], path: Path, index: int) -> PromptItem:
    try:
        if row.get("prompt") is not None:
            messages, ground_truth = _messages(row["prompt"]), _verl_ground_truth(row.get("reward_model"))
        elif row.get("question") is not None and row.get("answer") is not None:
            if not isinstance(row["question"], str):
                raise ValueError(f"question must be a string, got {type(row['question']).__name__}")
            messages, ground_truth = (("user", row["question"]),), _text(row["answer"], "answer")
        else:
            raise ValueError("neither verl's prompt/reward_model nor question/answer")
        return PromptItem(messages, _data_source(row, path), ground_truth, _extra_info(row.get("extra_info")))
    except ValueError as exc:
        raise ValueError(f"{path}: row {index}: {exc}") from None


def _messages(prompt: Any) -> tuple[tuple[str, str], ...]:
    if isinstance(prompt, str):
        return (("user", prompt),)
    if not isinstance(prompt, list) or not prompt:
        raise ValueError("prompt must be a string or a non-empty list of chat messages")
    messages = []
    for message in prompt:
        role = message.get("role") if isinstance(message, Mapping) else None
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(role, str) or not isinstance(content, str):
            raise ValueError(f"prompt has a message without a string role and content: {message!r}")
        messages.append((role, content))
    return tuple(messages)


def _verl_ground_truth(reward_model: Any) -> str:
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        raise ValueError("verl's row has no reward_model.ground_truth")
    return _text(reward_model["ground_truth"], "reward_model.ground_truth")


def _text(value: Any, what: str) -> str:
    """A ground truth as a string: strings as they are, numbers and lists as JSON (42 -> "42"); ValueError naming
    ``what`` for a value JSON does not hold (bytes, a date: Parquet has them) or a NaN or infinite number."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        raise ValueError(f"{what} holds a NaN or infinite number: {value!r:.60}") from None
    except TypeError:
        raise ValueError(f"{what} must be a string, a number or a list, got {type(value).__name__}") from None


def _data_source(row: dict[str, Any], path: Path) -> str:
    source = row.get("data_source")
    return source if isinstance(source, str) and source else path.stem


def _extra_info(extra_info: Any) -> dict[str, Any]:
    if extra_info is None:
        return {}
    if not isinstance(extra_info, Mapping):
        raise ValueError(f"extra_info must be an object, got {type(extra_info).__name__}")
    return dict(extra_info)


# -- encoding -----------------------------------------------------------------------------------------------------


def _templated_ids(item: PromptItem, tokenizer: Any) -> list[int]:
    """transformers 5 returns a BatchEncoding from ``apply_chat_template(tokenize=True)`` (``return_dict`` defaults
    to True), transformers 4 a list of ids: either becomes a plain list of ints."""
    conversation = [{"role": role, "content": content} for role, content in item.messages]
    out = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if hasattr(out, "tolist"):  # a tensor or an array
        out = out.tolist()
    if out and isinstance(out[0], list):  # one conversation, batched
        if len(out) != 1:
            raise ValueError(f"apply_chat_template returned {len(out)} sequences for one conversation")
        out = out[0]
    return [int(token) for token in out]


def _fit(ids: list[int], max_tokens: int | None, truncation: str, index: int | None) -> list[int]:
    if max_tokens is None or len(ids) <= max_tokens:
        return ids
    if truncation == "left":
        return ids[-max_tokens:]
    which = "prompt" if index is None else f"prompt {index}"
    raise ValueError(f"{which} has {len(ids)} tokens, more than max_tokens={max_tokens}")
