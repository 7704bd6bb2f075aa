"""Fuzzing the readers of dataset rows (``--data``: :func:`oppo.exec.tasks.datasets.load_items`, and
:class:`oppo.exec.tasks.verifiable.DatasetPrompts`, which encodes each prompt): verl's and the plain schema's rows with
fields missing, of other types (numbers, lists, objects, null, NaN), huge prompts and empty answers, written as JSON
lines, a JSON array or Parquet; files of raw bytes and JSON with bytes that are no UTF-8. Each either reads as items
of string fields whose prompts encode to tokens, or is refused with one line naming the file (tests/fuzzing.py); a
handful go through ``python -m oppo.exec.train`` for exit code 2 and one stderr line."""

from __future__ import annotations

import contextlib
import json
import logging
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from oppo.exec.tasks.datasets import PromptItem, load_items
from oppo.exec.tasks.verifiable import DatasetPrompts
from tests.fuzzing import fuzz_settings, one_grpo_step, outcome
from tests.invoke import train

WORDS = ["[UNK]", "<s>", "</s>", "<|user|>", "<|assistant|>", "\n", "what", "is", "2", "+", "?", "a", "b"]
TEMPLATE = "{% for m in messages %}<|{{ m.role }}|> {{ m.content }}\n{% endfor %}<|assistant|>"


@pytest.fixture(scope="module")
def tokenizer():
    """A word-level tokenizer with a chat template (tests/exec/test_datasets.py's, smaller)."""
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(" ", "removed"), pre_tokenizers.Split("\n", "isolated")]
    )
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
    fast.chat_template = TEMPLATE
    return fast


odd = st.one_of(
    st.none(),
    st.integers(),
    st.sampled_from([math.nan, math.inf, 0.5, True, "", " ", "what is 2 + 2 ?"]),
    st.text(max_size=10),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.binary(max_size=3),
    st.dates(),
)


def mostly(good: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` seven times in eight, else a value of any type."""
    return st.integers(0, 7).flatmap(lambda k: good if k else odd)


messages = st.lists(
    st.fixed_dictionaries(
        {"role": mostly(st.sampled_from(["user", "system", "assistant"])), "content": mostly(st.text(max_size=20))}
    ),
    min_size=1,
    max_size=3,
)
HUGE = "what is 2 + 2 ? " * 2000  # 10,000 words: over any --max-prompt-tokens here


@st.composite
def rows(draw) -> dict:
    """A row of verl's or the plain schema, a field or two dropped or of another type, sometimes a huge prompt."""
    if draw(st.booleans()):
        row = {
            "data_source": draw(mostly(st.sampled_from(["openai/gsm8k", ""]))),
            "prompt": draw(mostly(messages | st.text(max_size=20) | st.just(HUGE))),
            "reward_model": draw(
                mostly(
                    st.fixed_dictionaries(
                        {"ground_truth": mostly(st.sampled_from(["4", "", "#### 72", 4])), "style": st.just("rule")}
                    )
                )
            ),
        }
        if draw(st.booleans()):
            row["extra_info"] = draw(mostly(st.fixed_dictionaries({"index": st.integers(), "split": st.just("train")})))
    else:
        row = {
            "question": draw(mostly(st.text(max_size=20) | st.just(HUGE))),
            "answer": draw(mostly(st.text(max_size=8))),
        }
    if draw(st.integers(0, 3)) == 0:
        del row[draw(st.sampled_from(sorted(row)))]
    return row


def write(path: Path, items: list[dict], form: str) -> Path:
    """The rows as a file of ``form`` (bytes and dates in Parquet only)."""
    if form != "parquet":
        try:
            json.dumps(items)
        except TypeError:
            assume(False)
    if form == "jsonl":
        path = path.with_suffix(".jsonl")
        path.write_text("".join(json.dumps(r) + "\n" for r in items))
    elif form == "json":
        path = path.with_suffix(".json")
        path.write_text(json.dumps(items))
    else:
        path = path.with_suffix(".parquet")
        try:
            pq.write_table(pa.Table.from_pylist(items), path)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):  # columns of mixed types: no such file
            assume(False)
    return path


@contextlib.contextmanager
def logged(name: str):
    """The messages logger ``name`` passes on at WARNING or above inside the block (a process prints them)."""
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger(name).addHandler(handler)
    try:
        yield said
    finally:
        logging.getLogger(name).removeHandler(handler)


def check_items(items: list[PromptItem]) -> None:
    assert items and all(isinstance(item, PromptItem) for item in items)
    for item in items:
        assert item.messages and all(isinstance(r, str) and isinstance(c, str) for r, c in item.messages)
        assert isinstance(item.data_source, str) and item.data_source
        assert isinstance(item.ground_truth, str) and isinstance(item.extra_info, dict)


def read(path: Path, tokenizer) -> None:
    """The file read, its prompts encoded (at most 64 tokens), or one line naming it and nothing else said."""
    with logged("datasets") as said:
        items, err = outcome(load_items, path)
    assert not said, said
    assert err is None or str(path) in str(err), err
    if items is None:
        event(f"refused: {type(err).__name__}")
        return
    check_items(items)
    data, err = outcome(DatasetPrompts, path, tokenizer, "auto", 64, "error")
    event("read" if data is not None else "prompts refused")
    assert err is None or str(path) in str(err), err
    if data is not None:
        assert all(p and all(isinstance(t, int) for t in p) and len(p) <= 64 for p in data.prompts)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("datasets")


forms = st.sampled_from(["jsonl", "json", "parquet"])


def _rows(folder, tokenizer, items, form):
    read(write(folder / "data", items, form), tokenizer)


def _bytes(folder, tokenizer, raw, suffix):
    path = folder / f"raw{suffix}"
    path.write_bytes(raw)
    read(path, tokenizer)


# a valid line with bytes that are no UTF-8 put in, or random bytes alone
raw_files = st.one_of(
    st.binary(min_size=1, max_size=100),
    st.tuples(st.binary(min_size=1, max_size=4), st.integers(0, 40)).map(
        lambda b: (lambda line: line[: b[1]] + b[0] + line[b[1] :])(b'{"question": "what is 2 ?", "answer": "2"}\n')
    ),
)


@fuzz_settings(40)
@given(items=st.lists(rows(), min_size=1, max_size=3), form=forms)
def test_fuzzed_rows_read_or_are_refused_in_one_line(folder, tokenizer, items, form):
    _rows(folder, tokenizer, items, form)


@fuzz_settings(20)
@given(raw=raw_files, suffix=st.sampled_from([".jsonl", ".json", ".parquet"]))
def test_files_of_junk_bytes_are_refused_in_one_line(folder, tokenizer, raw, suffix):
    _bytes(folder, tokenizer, raw, suffix)


@pytest.mark.slow
@fuzz_settings(1000)
@given(items=st.lists(rows(), min_size=1, max_size=4), form=forms)
def test_many_fuzzed_rows(folder, tokenizer, items, form):
    _rows(folder, tokenizer, items, form)


@pytest.mark.slow
@fuzz_settings(400)
@given(raw=raw_files, suffix=st.sampled_from([".jsonl", ".json", ".parquet"]))
def test_many_files_of_junk_bytes(folder, tokenizer, raw, suffix):
    _bytes(folder, tokenizer, raw, suffix)


# -- what the fuzzing found, one concrete case each ----------------------------------------------------------------


def test_a_parquet_answer_of_bytes_is_refused_naming_the_row(tmp_path):
    path = write(
        tmp_path / "data", [{"question": "what is 2 ?", "answer": "2"}, {"question": "a", "answer": None}], "parquet"
    )
    pq.write_table(pa.table({"question": ["what is 2 ?"], "answer": [b"2"]}), path)  # was TypeError (json.dumps)
    with pytest.raises(
        ValueError, match=r"data.parquet: row 0: answer must be a string, a number or a list, got bytes"
    ):
        load_items(path)


def test_a_nan_or_infinite_ground_truth_is_refused_naming_the_row(tmp_path):
    path = tmp_path / "data.jsonl"  # was read as the ground truth "NaN"
    path.write_text('{"question": "b", "answer": NaN}\n')
    with pytest.raises(ValueError, match=r"data.jsonl: row 0: answer holds a NaN or infinite number: nan"):
        load_items(path)
    verl = {"prompt": "what is 2 ?", "reward_model": {"ground_truth": [1.0, math.inf]}}
    pq.write_table(pa.Table.from_pylist([verl]), tmp_path / "verl.parquet")
    with pytest.raises(ValueError, match=r"row 0: reward_model.ground_truth holds a NaN or infinite number"):
        load_items(tmp_path / "verl.parquet")


def test_bytes_that_are_no_utf8_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "data.jsonl"  # was UnicodeDecodeError's message alone, from Arrow's strings
    path.write_bytes(b'{"question": "\xff", "answer": "1"}\n')
    with pytest.raises(ValueError, match=rf"{path}: cannot read as json: UnicodeDecodeError: 'utf-8' codec"):
        load_items(path)


def test_the_json_readers_own_error_line_is_not_printed_beside_the_error(tmp_path):
    path = tmp_path / "data.jsonl"  # datasets logged "Failed to load JSON from file ..." to stderr first
    path.write_text('{"question": "a", "answer": 1e999}\n')
    with logged("datasets") as said, pytest.raises(ValueError, match="Number too big to be stored in double"):
        load_items(path)
    assert said == []


@pytest.mark.parametrize(
    "content",
    [b'{"question": "t5", "answer": NaN}\n', b'{"question": "t5", "answer": 1e999}\n', b'{"question": "\xfe"}\n'],
)
def test_bad_rows_end_the_run_with_exit_2_and_one_line(tmp_path, content):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    res = train(*one_grpo_step(path, "gsm8k", tmp_path / "run"))
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith(f"error: {path}: "), res.stderr
    assert not [p for p in (tmp_path / "run").rglob("*") if not p.name.startswith(".")]  # nothing written
