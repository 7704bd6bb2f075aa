"""A checkpoint's state as JSON and safetensors: every value a run's state holds reads back as it was (shared values
still shared), every policy's scheduler included, and a state file can name nothing but the fixed tables' entries."""

import collections
import json

import numpy as np
import pytest
import torch

from oppo.core.config import ScheduleConfig
from oppo.core.scheduler import Scheduler
from oppo.exec.step.state_codec import decode, encode, state_classes
from oppo.records.schema import TraceRow
from tests.exec.test_async import executor_for


def roundtrip(value):
    data, arrays = encode(value)
    return decode(json.loads(json.dumps(data)), arrays), data  # through the text, as a file holds it


def test_the_values_a_state_holds_read_back_exactly():
    shared = [1, 2]
    value = {
        "ints": {3: "a", (1, 2): frozenset({4})},  # keys that are not strings
        "floats": [0.1, float("-inf"), 1e-300, np.float64(2.5), np.int64(7)],
        "shared": (shared, shared),
        "deque": collections.deque([1, 2], maxlen=3),
        "counter": collections.Counter({"a": 2}),
        "default": collections.defaultdict(list, {1: [2]}),
        "array": np.arange(6, dtype=np.int64).reshape(2, 3),
        "tensor": torch.linspace(0, 1, 5, dtype=torch.float64),
        "row": TraceRow(1, "gpu0", "actor", "decode", 0.5, 0.75, 4, 8, 16),
        "config": ScheduleConfig(policy="inter", batch=8),
        "rng": np.random.default_rng(3),
    }
    value["cycle"] = value  # a value that holds itself
    back, _ = roundtrip(value)
    assert back["ints"] == value["ints"] and back["counter"] == value["counter"] and back["row"] == value["row"]
    assert [type(x) for x in back["floats"]] == [float, float, float, np.float64, np.int64]
    assert back["floats"][:3] == value["floats"][:3]
    assert back["shared"][0] is back["shared"][1] and back["cycle"] is back
    assert back["deque"].maxlen == 3 and list(back["deque"]) == [1, 2]
    assert back["default"][9] == [] and back["default"][1] == [2]
    assert back["array"].dtype == np.int64 and np.array_equal(back["array"], value["array"])
    assert back["tensor"].dtype == torch.float64 and torch.equal(back["tensor"], value["tensor"])
    assert back["config"] == value["config"] and back["config"].overcommit
    assert back["rng"].random() == np.random.default_rng(3).random()


@pytest.mark.parametrize("policy", ["sync", "oppo", "tppo", "tailbatch", "async"])
def test_every_policys_executor_state_reads_back_and_writes_the_same(policy):
    """After two steps the scheduler, the sequences' data and (async) the recent weights read back to a state that
    encodes to the same text and the same arrays: nothing lost or reordered."""
    executor = executor_for(policy, staleness=2)
    for _ in range(2):
        executor.step()
    held = {"scheduler": executor.scheduler, "data": executor.data, "rank_of": executor.rank_of}
    if executor.history is not None:
        held["versions"] = list(executor.history.versions)
    back, data = roundtrip(held)
    again, arrays = encode(back)
    assert again == data
    _, first = encode(held)
    assert first.keys() == arrays.keys() and all(torch.equal(first[k], arrays[k]) for k in first)
    assert isinstance(back["scheduler"], Scheduler) and back["scheduler"].config == executor.scheduler.config


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"$": "object", "n": 0, "class": "system", "fields": {}}, "unknown state class 'system'"),
        ({"$": "object", "n": 0, "class": "Popen", "fields": {}}, "unknown state class 'Popen'"),
        ({"$": "_keep", "n": 0}, "unknown tag '_keep'"),
        ({"$": "defaultdict", "n": 0, "factory": "eval", "items": []}, "unknown defaultdict factory 'eval'"),
        (
            {"$": "generator", "n": 0, "state": {"$": "dict", "n": 1, "items": [["bit_generator", "os"]]}},
            "unknown kind",
        ),
        ({"$": "ref", "n": 5}, "a reference to no value"),
        ({"$": "tensor", "n": 0, "key": "9"}, "array '9' is not in the arrays file"),
        ([1, 2], "a bare list"),
    ],
)
def test_a_state_names_nothing_outside_the_fixed_tables(data, message):
    with pytest.raises(ValueError, match=message):
        decode(data, {})


def test_the_state_classes_are_the_cores_the_records_and_the_steps_own():
    modules = {cls.__module__.rsplit(".", 1)[0] for cls in state_classes().values()}
    assert modules == {"oppo.core", "oppo.records", "oppo.exec.step"}
    with pytest.raises(TypeError, match="is not a class a state may hold"):
        encode(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"$": "deque", "n": 0, "maxlen": 2**70, "items": []}, "a deque bounded by"),
        ({"$": "np", "dtype": "i1", "value": 1000}, "cannot be one .OverflowError"),
        ({"$": "np", "dtype": "V", "value": 2147483647}, "numbers and booleans only"),
        ({"$": "np", "dtype": "O", "value": 1}, "numbers and booleans only"),
        ({"$": "generator", "n": 0}, "unknown kind"),
        ({"$": "tensor", "n": 0, "key": "0", "device": "meta"}, "a tensor on device 'meta'"),
    ],
)
def test_a_hostile_state_value_is_one_value_error(data, message):
    """Values a state file could hold that no encoding writes: refused as bad input, nothing allocated for them."""
    with pytest.raises(ValueError, match=message):
        decode(data, {"0": torch.zeros(1)})


def test_a_nesting_deeper_than_the_stack_is_one_value_error():
    data = {"$": "list", "n": 0, "items": []}
    for n in range(1, 100_000):
        data = {"$": "list", "n": n, "items": [data]}
    with pytest.raises(ValueError, match="RecursionError"):
        decode(data, {})
