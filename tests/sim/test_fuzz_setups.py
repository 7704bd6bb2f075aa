"""Fuzzing the setup TOMLs (:func:`oppo.sim.setup.toml_file.load_setup`) and the stored setups of a run's config.json
(:func:`~oppo.sim.setup.toml_file.setup_from_dict`): keys of every table with values of the right type and of wrong
ones (NaN, infinities, huge integers, strings, arrays, dates, tables), unknown keys, contradictions, a model's
config.json of random fields, and real setup files cut short or with junk bytes. Each either loads as a setup whose
every field has its declared type (floats finite) and whose schedule and cost models build, or is refused with one
line (tests/fuzzing.py); a handful more go through ``python -m oppo.sim run`` for exit code 2 and one stderr line."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import types
import typing
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oppo.data import data_dir
from oppo.sim.cost.engine import ENGINES, MODELS
from oppo.sim.cost.framework import FRAMEWORKS, KV_CACHE_RESETS, ROLE_STAGES, TRAIN_BACKENDS
from oppo.sim.cost.gpu import GPUS
from oppo.sim.setup.presets import PLACEMENTS, PRESETS, Setup
from oppo.sim.setup.toml_file import load_setup, setup_from_dict
from tests import invoke
from tests.fuzzing import fuzz_settings, outcome

BUNDLED = sorted(p.stem for p in (data_dir() / "setups").glob("*.toml"))
EXAMPLES = sorted((data_dir() / "setups").glob("*.toml"))

# plausible values of the string fields, by field name (any field also gets arbitrary text)
NAMES = {
    "gpu": [*GPUS, "unknown", "h900"],
    "actor": [*MODELS, "model.json", "missing.json", "nowhere"],
    "reward": [*MODELS, "rule", "model.json"],
    "engine": [*ENGINES, "sglang"],
    "cost": ["fitted", "analytic", "tiny-cpu.json", "profile.json", "missing.json", "roofline"],
    "algo": ["ppo", "grpo", "reinforce"],
    "kind": [*PLACEMENTS, "mixed"],
    "train_backend": [*TRAIN_BACKENDS, "deepspeed"],
    "kv_cache_reset": [*KV_CACHE_RESETS, "never"],
    "offload": [*ROLE_STAGES, "optimizer"],
    "offload_each_micro_batch": [*ROLE_STAGES],
    "optimizer_offload": ["actor", "critic", "reference"],
    "efficiency_of": [*GPUS, "", "h900"],
    "basis": ["within", "leave_one_group_out", ""],
}
BASES = [*PRESETS, *BUNDLED, "other.toml", "setup.toml", "missing.toml", "nope"]


def _hints(cls: type) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls)


def junk(dates: bool = True) -> st.SearchStrategy:
    """Any TOML value, of any type (``dates=False``: any JSON value)."""
    scalars = st.one_of(
        st.integers(),
        st.sampled_from([0, -1, 2**63 - 1, -(2**63), 10**18]),
        st.floats(),
        st.booleans(),
        st.text(st.characters(codec="utf-8"), max_size=12),
        st.dates() if dates else st.none(),
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=6,
    )


def plausible(name: str, hint: typing.Any) -> st.SearchStrategy:
    """Values of a field's declared type, near the ones that matter (zero, negatives, edges), NaN and infinities."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [h for h in typing.get_args(hint) if h is not type(None)]
        return st.one_of([plausible(name, h) for h in inner])
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.one_of(st.integers(-2, 16), st.sampled_from([64, 112, 256, 1024, 2**40, 2**64]))
    if hint is float:
        return st.one_of(
            st.floats(-1.0, 10.0), st.sampled_from([0.0, 0.5, 1.0, 1e12, 1e308, math.nan, math.inf, -math.inf])
        )
    if hint is str:
        return st.sampled_from(NAMES[name]) | st.text(max_size=8) if name in NAMES else st.text(max_size=8)
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        return st.lists(plausible(name, item), max_size=4)
    if dataclasses.is_dataclass(hint):
        return table(hint)
    return junk()


def table(cls: type) -> st.SearchStrategy:
    """A table of ``cls``'s keys (a few), their values plausible or junk, sometimes an unknown key or a ``base``."""
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]

    @st.composite
    def build(draw):
        keys = draw(st.lists(st.sampled_from(names), unique=True, max_size=4))
        out = {}
        for key in keys:  # half of them any value, not only one of the field's type
            out[key] = draw(plausible(key, hints[key]) | junk() if draw(st.booleans()) else plausible(key, hints[key]))
        if draw(st.integers(0, 9)) == 0:
            out[draw(st.text(min_size=1, max_size=6))] = draw(junk())
        if cls.__name__ == "Framework" and draw(st.integers(0, 3)) == 0:
            out["base"] = draw(st.sampled_from([*FRAMEWORKS, "verl-shared.toml", "missing.toml"]) | junk())
        return out

    return build()


@st.composite
def setup_tables(draw) -> dict:
    """A setup file's tables: a base, a few top-level keys and tables."""
    data = draw(table(Setup))
    if draw(st.integers(0, 2)):
        data["base"] = draw(st.sampled_from(BASES) | junk())
    return data


@st.composite
def model_configs(draw) -> dict:
    """A Hugging Face config.json: a real shape's, some keys dropped, some values of other types or out of range."""
    config = dict(MODELS[draw(st.sampled_from(sorted(MODELS)))].hf_fields)
    config["dtype"] = "bfloat16"
    if draw(st.booleans()):
        del config["head_dim"]  # then hidden_size / num_attention_heads
    odd = st.integers(-1, 64) | st.sampled_from([0, True, None, "64", 1.5, [8], 2**70, "bfloat16", "int4"])
    for key in draw(st.lists(st.sampled_from(sorted(config)), unique=True, max_size=3)):
        if draw(st.booleans()):
            del config[key]
        else:
            config[key] = draw(odd | junk(dates=False))
    if draw(st.integers(0, 4)) == 0:
        config = {"text_config": config if draw(st.booleans()) else draw(junk(dates=False))}
    return config


def toml_text(value: typing.Any) -> str:
    """``value`` as a TOML value (tables inline)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # nan, inf, -inf, 1e+308 are TOML floats
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_text(v)}" for k, v in value.items()) + "}"


def toml_file(data: dict) -> str:
    return "".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_text(v)}\n" for k, v in data.items())


def check_setup(setup: Setup) -> None:
    """A loaded setup: every field of its declared type, floats finite; its schedule and costs build or are refused
    with one line."""
    assert isinstance(setup, Setup)
    typed(setup, "setup")
    outcome(setup.schedule)
    for policy in ("sync", "async"):
        outcome(setup.costs, policy)


def typed(obj: typing.Any, where: str) -> None:
    for f in dataclasses.fields(obj):
        check_type(getattr(obj, f.name), _hints(type(obj))[f.name], f"{where}.{f.name}")


def check_type(value: typing.Any, hint: typing.Any, where: str) -> None:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return
        (hint,) = [h for h in typing.get_args(hint) if h is not type(None)]
    if dataclasses.is_dataclass(hint):
        assert isinstance(value, hint), where
        typed(value, where)
    elif typing.get_origin(hint) is tuple:
        assert isinstance(value, tuple), (where, value)
        for item in value:
            check_type(item, typing.get_args(hint)[0], where)
    elif hint is float:
        assert isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value), (where, value)
    elif hint is int:
        assert isinstance(value, int) and not isinstance(value, bool), (where, value)
    elif hint in (str, bool):
        assert isinstance(value, hint), (where, value)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Where the fuzzed files are written: beside them a model config, a cost profile, another setup to start
    from and the shared framework layer, for the keys that name a file."""
    path = tmp_path_factory.mktemp("setups")
    (path / "model.json").write_text(json.dumps(MODELS["qwen2.5-0.5b"].hf_fields))
    (path / "profile.json").write_text('{"not": "a profile"}')
    (path / "other.toml").write_text('base = "verl-qwen2.5-0.5b-gsm8k"\nbatch = 64\n')
    (path / "verl-shared.toml").write_bytes((data_dir() / "framework" / "verl-shared.toml").read_bytes())
    return path


def load_fuzzed(folder: Path, text: str | bytes) -> None:
    path = folder / "setup.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    setup, err = outcome(load_setup, str(path))
    assert err is None or ".toml" in str(err) or ".json" in str(err), f"the message names no file: {err}"
    if setup is not None:
        check_setup(setup)


def _setup_tables(folder: Path, data: dict) -> None:
    load_fuzzed(folder, toml_file(data))


def _stored_setups(data: dict) -> None:
    setup, _ = outcome(setup_from_dict, data, "config.json: [setup]")
    if setup is not None:
        check_setup(setup)


def _model_configs(folder: Path, config: dict, role: str) -> None:
    (folder / "fuzzed.json").write_text(json.dumps(config))
    load_fuzzed(folder, f'base = "paper-7b-gh200-gsm8k"\n{role} = "fuzzed.json"\n')


def _cut_or_spoiled(folder: Path, example: Path, cut: float, junk_bytes: bytes, where: float) -> None:
    raw = example.read_bytes()
    raw = raw[: int(len(raw) * cut)]
    at = int(len(raw) * where)
    load_fuzzed(folder, raw[:at] + junk_bytes + raw[at:])


examples_st = st.sampled_from(EXAMPLES)
fractions = st.floats(0, 1)


@fuzz_settings(150)
@given(data=setup_tables())
def test_fuzzed_setup_tables_load_or_are_refused_in_one_line(folder, data):
    _setup_tables(folder, data)


@fuzz_settings(80)
@given(data=setup_tables())
def test_fuzzed_stored_setups_load_or_are_refused_in_one_line(data):
    _stored_setups(data)


@fuzz_settings(60)
@given(config=model_configs(), role=st.sampled_from(["actor", "reward"]))
def test_fuzzed_model_configs_load_or_are_refused_in_one_line(folder, config, role):
    _model_configs(folder, config, role)


@fuzz_settings(60)
@given(example=examples_st, cut=fractions, junk_bytes=st.binary(max_size=6), where=fractions)
def test_real_setups_cut_short_or_spoiled_load_or_are_refused_in_one_line(folder, example, cut, junk_bytes, where):
    _cut_or_spoiled(folder, example, cut, junk_bytes, where)


@pytest.mark.slow
@fuzz_settings(3000)
@given(data=setup_tables())
def test_many_fuzzed_setup_tables(folder, data):
    _setup_tables(folder, data)


@pytest.mark.slow
@fuzz_settings(1500)
@given(data=setup_tables())
def test_many_fuzzed_stored_setups(data):
    _stored_setups(data)


@pytest.mark.slow
@fuzz_settings(1000)
@given(config=model_configs(), role=st.sampled_from(["actor", "reward"]))
def test_many_fuzzed_model_configs(folder, config, role):
    _model_configs(folder, config, role)


@pytest.mark.slow
@fuzz_settings(1500)
@given(example=examples_st, cut=fractions, junk_bytes=st.binary(max_size=6), where=fractions)
def test_many_real_setups_cut_short_or_spoiled(folder, example, cut, junk_bytes, where):
    _cut_or_spoiled(folder, example, cut, junk_bytes, where)


# -- what the fuzzing found, one concrete case each ----------------------------------------------------------------

HF = json.dumps({k: v for k, v in MODELS["qwen2.5-0.5b"].hf_fields.items() if k != "head_dim"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("base = 5", "base must be a preset's name or a .toml file, got 5"),  # was TypeError (Path / int)
        ("base = []", "base must be a preset's name or a .toml file, got []"),  # was TypeError (unhashable)
        ("[framework]\nbase = []", "[framework]: base must be a name (roofline, trl), got []"),  # TypeError
        ("actor = 5", "actor must be a string, got 5"),  # was AttributeError ('int' has no endswith)
        ("cost = 5", "cost must be a string, got 5"),  # AttributeError
        ('chunk_candidates = ["a"]', "chunk_candidates item must be an integer, got 'a'"),  # TypeError later
        ("chunk_candidates = 0", "chunk_candidates must be an array, got 0"),  # TypeError later
        ("window_tokens = 'x'", "window_tokens must be an integer, got 'x'"),  # TypeError later
        ("reward_threshold = []", "reward_threshold must be a finite number, got []"),  # accepted
        ("reward_threshold = nan", "reward_threshold must be a finite number, got nan"),  # accepted
        ("name = 0", "name must be a string, got 0"),  # accepted
        ("batch = 1.5", "batch must be an integer, got 1.5"),  # accepted
        ("batch = true", "batch must be an integer, got True"),  # accepted
        ('reference = "yes"', "reference must be true or false, got 'yes'"),  # accepted
        ("[lengths]\nmedian_tokens = nan", "[lengths]: median_tokens must be a finite number, got nan"),  # accepted
        ("[contention]\nchunk_handoff_s = nan", "chunk_handoff_s must be a finite number, got nan"),  # accepted
        ("[framework.gen]\nefficiency = inf", "[gen]: efficiency must be a finite number, got inf"),  # accepted
        ('[framework]\noffload = "reference"', "offload must be an array, got 'reference'"),  # split in letters
        (
            'gpu = "x"\n[gpu_spec]\nname = "x"\nhbm_bytes_per_s = 1e12\npeak_flops = 1e15\nmemory_bytes = nan\n'
            "link_bytes_per_s = 1e11",
            "[gpu_spec] memory_bytes must be a finite number, got nan",  # accepted
        ),
        (b'name = "\xff"', "setup.toml: not a UTF-8 text file (invalid start byte at byte 8)"),  # UnicodeDecodeError
        ("x = " + "[" * 3000 + "]" * 3000, "setup.toml: invalid TOML (nested too deep)"),  # RecursionError
        ("[placement]\nreward_gpus = 0", "setup.toml: a disaggregated reward model needs reward_gpus >= 1"),  # no file
        (
            'gpu = "x"\n[gpu_spec]\nname = "x"\nhbm_bytes_per_s = 1e12\npeak_flops = 1e15\nmemory_bytes = -1\n'
            "link_bytes_per_s = 1e11",
            "setup.toml [gpu_spec]: gpu_spec memory_bytes must be a number > 0, got -1",  # named no file
        ),
        ("[placement]\nactor_gpus = 1099511627776", "placement needs actor_gpus + reward_gpus <= 131072"),  # hung
        ('[gpu_spec]\n"a\\nb" = 1', "[gpu_spec]: unknown key(s) 'a\\nb'; keys: name,"),  # two lines
        ('actor = "m.json"', "m.json: num_attention_heads must be a positive integer, got 0"),  # ZeroDivisionError
        ('reward = "t.json"', "t.json: num_hidden_layers must be a positive integer, got True"),  # accepted
        ('actor = "d.json"', "d.json: unknown dtype ['bfloat16']"),  # TypeError (unhashable)
    ],
)
def test_values_of_another_type_or_not_finite_are_refused_naming_the_key(tmp_path, text, message):
    (tmp_path / "m.json").write_text(HF.replace('"num_attention_heads": 14', '"num_attention_heads": 0'))
    (tmp_path / "t.json").write_text(HF.replace('"num_hidden_layers": 24', '"num_hidden_layers": true'))
    (tmp_path / "d.json").write_text(HF[:-1] + ', "dtype": ["bfloat16"]}')
    path = tmp_path / "setup.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError) as err:
        load_setup(str(path))
    assert message in str(err.value) and len(str(err.value).splitlines()) == 1, str(err.value)


def test_a_stored_setup_of_another_type_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"config.json: \[setup\]: max_new_tokens must be an integer, got '512'"):
        setup_from_dict({"max_new_tokens": "512"}, "config.json: [setup]")
    assert setup_from_dict({"reward": None}, "here").reward is None  # JSON's null: no reward model


@pytest.mark.parametrize(
    "text",
    [
        "base = 5",
        'actor = 5\nbatch = "x"',
        "[lengths]\nmedian_tokens = nan",
        b"gpu = '\xfe'",
        '[framework]\nbase = ["trl"]',
    ],
)
def test_a_bad_setup_file_ends_the_command_with_exit_2_and_one_line(tmp_path, text):
    path = tmp_path / "bad.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    res = invoke.sim("run", "--setup", path, "--steps", "1", "--out", tmp_path / "out")
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("error: "), res.stderr
    assert not [p for p in (tmp_path / "out").rglob("*") if not p.name.startswith(".")]  # no record written
