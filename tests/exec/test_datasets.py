"""Prompt datasets (:mod:`oppo.exec.tasks.datasets`): verl's and the plain question/answer schema read from JSON lines,
JSON and Parquet; prompts encoded through a hand-built tokenizer's chat template, without it, and cut to a budget."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from oppo.exec.tasks.datasets import PromptItem, encode_prompt, load_items

WORDS = ["[UNK]", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "\n"]
WORDS += ["be", "brief", "what", "is", "2", "+", "?", "a", "b", "c", "d", "e", "f", "g", "h"]
VOCAB = {word: i for i, word in enumerate(WORDS)}
UNK, BOS = VOCAB["[UNK]"], VOCAB["<s>"]
# Each message as "<|role|> content" on its own line, then the assistant's turn opened.
TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|> {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

VERL_ROWS = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 2 + 2 ?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"split": "train", "index": 0},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "what is 2 ?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2"},
        "extra_info": {"split": "train", "index": 1},
    },
]
VERL_ITEMS = [
    PromptItem(
        (("system", "be brief"), ("user", "what is 2 + 2 ?")), "openai/gsm8k", "4", {"split": "train", "index": 0}
    ),
    PromptItem((("user", "what is 2 ?"),), "openai/gsm8k", "2", {"split": "train", "index": 1}),
]
GSM8K_ANSWER = "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 72"
PLAIN_ROWS = [{"question": "How many clips?", "answer": GSM8K_ANSWER}, {"question": "what is 2 ?", "answer": "2"}]


def plain_items(source: str) -> list[PromptItem]:
    return [
        PromptItem((("user", "How many clips?"),), source, GSM8K_ANSWER, {}),
        PromptItem((("user", "what is 2 ?"),), source, "2", {}),
    ]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def tokenizer():
    """A word-level tokenizer: words split on spaces, newlines kept as a token, BOS added as a special token."""
    backend = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(" ", "removed"), pre_tokenizers.Split("\n", "isolated")]
    )
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
    fast.chat_template = TEMPLATE
    return fast


@pytest.fixture(scope="module")
def plain_tokenizer(tokenizer):
    """The same vocabulary without a chat template."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer, unk_token="[UNK]", bos_token="<s>", eos_token="</s>"
    )
    assert not fast.chat_template
    return fast


def ids(text: str) -> list[int]:
    """The ids of space-separated words (and newlines), looked up by hand."""
    return [VOCAB[word] for word in text.replace("\n", " \n ").split(" ") if word]


# -- reading --------------------------------------------------------------------------------------------------------


def test_verl_jsonl(tmp_path):
    items = load_items(write_jsonl(tmp_path / "train.jsonl", VERL_ROWS))
    assert items == VERL_ITEMS


def test_verl_parquet_as_its_preprocessors_write_it(tmp_path):
    items = load_items(write_parquet(tmp_path / "train.parquet", VERL_ROWS))
    assert items == VERL_ITEMS


def test_verl_string_prompt_is_one_user_message_and_extra_info_is_optional(tmp_path):
    row = {"prompt": "what is 2 ?", "data_source": "mine", "reward_model": {"style": "rule", "ground_truth": 2}}
    (item,) = load_items(write_jsonl(tmp_path / "one.jsonl", [row]))
    assert item == PromptItem((("user", "what is 2 ?"),), "mine", "2", {})
    assert hash(item) == hash(PromptItem((("user", "what is 2 ?"),), "mine", "2", {"other": 1}))


def test_plain_json_array_keeps_the_whole_answer_and_takes_the_stem(tmp_path):
    path = tmp_path / "gsm8k_test.json"
    path.write_text(json.dumps(PLAIN_ROWS))
    assert load_items(path) == plain_items("gsm8k_test")


def test_plain_json_as_datasets_writes_it(tmp_path):
    from datasets import Dataset

    path = tmp_path / "written.json"
    Dataset.from_list(PLAIN_ROWS).to_json(str(path))  # JSON lines under a .json name
    assert load_items(path) == plain_items("written")


def test_plain_parquet_with_its_own_data_source(tmp_path):
    rows = [dict(row, data_source="gsm8k") for row in PLAIN_ROWS]
    assert load_items(write_parquet(tmp_path / "x.parquet", rows)) == plain_items("gsm8k")


def test_plain_numeric_answer_becomes_a_string(tmp_path):
    (item,) = load_items(write_jsonl(tmp_path / "n.jsonl", [{"question": "what is 2 ?", "answer": 2}]))
    assert item.ground_truth == "2"


def test_reading_leaves_the_datasets_cache_alone(tmp_path, monkeypatch):
    import datasets

    home_cache = tmp_path / "home_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", home_cache)
    load_items(write_jsonl(tmp_path / "train.jsonl", VERL_ROWS))
    assert not home_cache.exists()


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("data.csv", "question,answer\n", "unknown suffix '.csv'"),
        ("empty.jsonl", "", "empty file"),
        ("empty.json", "[]", "cannot read as json"),
        ("broken.jsonl", "{not json\n", "cannot read as json"),
    ],
)
def test_bad_files(tmp_path, name, content, problem):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=f"^{path}: {problem}") as info:
        load_items(path)
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="missing.jsonl: no such file"):
        load_items(tmp_path / "missing.jsonl")


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"question": "what is 2 ?"}, "neither verl's prompt/reward_model nor question/answer"),
        ({"prompt": "what is 2 ?", "reward_model": {"style": "rule"}}, "no reward_model.ground_truth"),
        ({"prompt": "what is 2 ?"}, "no reward_model.ground_truth"),
        ({"prompt": [], "reward_model": {"ground_truth": "2"}}, "prompt must be a string or a non-empty list"),
        ({"prompt": [{"role": "user"}], "reward_model": {"ground_truth": "2"}}, "without a string role and content"),
        ({"prompt": "a", "reward_model": {"ground_truth": "2"}, "extra_info": 3}, "extra_info must be an object"),
    ],
)
def test_bad_row_names_file_row_and_problem(tmp_path, row, problem):
    good = {"prompt": "what is 2 ?", "data_source": "d", "reward_model": {"ground_truth": "2"}}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")  # a row alone would set the columns' types
    with pytest.raises(ValueError, match="rows.jsonl: row 1: ") as info:
        load_items(path)
    assert problem in str(info.value)


# -- encoding -------------------------------------------------------------------------------------------------------


def test_auto_applies_the_chat_template_with_the_generation_prompt(tokenizer):
    rendered = "<|system|> be brief\n<|user|> what is 2 + 2 ?\n<|assistant|>"
    encoded = encode_prompt(VERL_ITEMS[0], tokenizer)
    assert encoded == tokenizer.encode(rendered, add_special_tokens=False)
    assert encoded == ids(rendered)  # the template writes its own special tokens: no BOS added, no unknown words
    assert type(encoded) is list and all(type(token) is int for token in encoded)


def test_none_skips_the_template(tokenizer):
    encoded = encode_prompt(VERL_ITEMS[0], tokenizer, chat_template="none")
    assert encoded == [BOS] + ids("be brief\nwhat is 2 + 2 ?")


def test_auto_without_a_template_joins_the_contents(plain_tokenizer):
    assert encode_prompt(VERL_ITEMS[0], plain_tokenizer) == [BOS] + ids("be brief\nwhat is 2 + 2 ?")


class ListTokenizer:
    """A tokenizer whose apply_chat_template answers as transformers 4 did (a list, here a batch of one)."""

    chat_template = "anything"

    def __init__(self, out):
        self.out = out

    def apply_chat_template(self, conversation, add_generation_prompt, tokenize):
        assert conversation == [{"role": "user", "content": "what is 2 ?"}] and add_generation_prompt and tokenize
        return self.out


@pytest.mark.parametrize("out", [[5, 6, 7], [[5, 6, 7]], {"input_ids": [5, 6, 7]}])
def test_chat_template_answers_of_either_shape(out):
    assert encode_prompt(VERL_ITEMS[1], ListTokenizer(out)) == [5, 6, 7]


LONG = PromptItem((("user", "a b c d e f g h"),), "d", "x")  # 8 words; with BOS, 9 tokens


def test_too_long_prompt_is_refused(tokenizer):
    with pytest.raises(ValueError, match=r"^prompt 7 has 9 tokens, more than max_tokens=4$"):
        encode_prompt(LONG, tokenizer, chat_template="none", max_tokens=4, index=7)
    with pytest.raises(ValueError, match=r"^prompt has 9 tokens, more than max_tokens=8$"):
        encode_prompt(LONG, tokenizer, chat_template="none", max_tokens=8)


def test_left_truncation_keeps_the_last_tokens(tokenizer):
    assert encode_prompt(LONG, tokenizer, chat_template="none", max_tokens=3, truncation="left") == ids("f g h")
    full = [BOS] + ids("a b c d e f g h")
    assert encode_prompt(LONG, tokenizer, chat_template="none", max_tokens=9) == full


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"chat_template": "chatml"}, "unknown chat_template 'chatml'"),
        ({"truncation": "right"}, "unknown truncation 'right'"),
        ({"max_tokens": 0}, "max_tokens must be positive"),
    ],
)
def test_bad_encoding_options(tokenizer, kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        encode_prompt(VERL_ITEMS[0], tokenizer, **kwargs)
