"""The registries of the core's variants: scheduling policies (their switches) and Δ controllers."""

import dataclasses

import pytest

from oppo import POLICIES, ScheduleConfig
from oppo.core.config import DELTA_CONTROLLERS
from oppo.core.overcommit import DELTA_CONTROLLER_CLASSES, Alg1Delta, SlopeDelta, TailDelta, delta_controller
from oppo.core.policies import POLICY_SPECS, PolicySpec, policy_spec
from oppo.core.registry import Registry


def test_policies_in_their_listed_order():
    assert POLICIES == ("sync", "intra", "inter", "oppo", "tppo", "april", "tailbatch", "async")
    assert POLICIES == POLICY_SPECS.names
    assert all(policy_spec(p).name == p and policy_spec(p).description for p in POLICIES)


def test_switches_are_the_ones_each_policy_had_by_name():
    on = {
        switch: [p for p in POLICIES if getattr(policy_spec(p), switch)]
        for switch in ("streaming", "overcommit", "adaptive_delta", "aborts", "truncated", "asynchronous")
    }
    assert on == {
        "streaming": ["intra", "oppo"],
        "overcommit": ["inter", "oppo", "april", "tailbatch"],
        "adaptive_delta": ["inter", "oppo"],
        "aborts": ["tailbatch"],
        "truncated": ["tppo"],
        "asynchronous": ["async"],
    }


def test_config_reads_its_policy_spec():
    config = ScheduleConfig(policy="tppo")
    assert config.spec is policy_spec("tppo")
    assert (config.streaming, config.overcommit, config.truncated, config.asynchronous) == (False, False, True, False)
    assert ScheduleConfig(policy="async").asynchronous


def test_a_spec_is_frozen_and_its_switches_consistent():
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy_spec("oppo").streaming = False
    with pytest.raises(ValueError, match="over-commit's switches"):
        PolicySpec("bad", "aborts without over-commit", aborts=True)


def test_delta_controllers_registered_beside_their_classes():
    assert DELTA_CONTROLLERS == ("slope", "alg1", "tail") == DELTA_CONTROLLER_CLASSES.names
    assert [DELTA_CONTROLLER_CLASSES[n] for n in DELTA_CONTROLLERS] == [SlopeDelta, Alg1Delta, TailDelta]


def test_help_and_errors_list_the_registered_names():
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(ScheduleConfig)}
    assert helps["policy"] == "scheduling policy: sync, intra, inter, oppo, tppo, april, tailbatch, async"
    assert helps["delta_controller"] == (
        "Δ controller when --delta auto: slope (paper Eq. 4), alg1 (Alg. 1) or "
        "tail (from the observed length distribution)"
    )
    with pytest.raises(ValueError, match="unknown delta_controller 'pid'; choose from slope, alg1, tail"):
        ScheduleConfig(delta_controller="pid")
    with pytest.raises(ValueError, match="unknown policy 'fast'; choose from sync, intra, .*, async$"):
        ScheduleConfig(policy="fast")


def test_a_controller_needs_from_config_and_a_new_name():
    with pytest.raises(TypeError, match="from_config"):
        delta_controller("plain", "no factory")(type("Plain", (), {}))
    with pytest.raises(ValueError, match="registered already"):
        delta_controller("slope", "again")(SlopeDelta)
    assert DELTA_CONTROLLERS == DELTA_CONTROLLER_CLASSES.names  # neither was added


def test_registry_basics():
    registry: Registry[int] = Registry("thing")
    assert registry.described() == "" and len(registry) == 0
    registry.add("one", 1, "the first")
    assert registry.described() == "one (the first)"
    registry.add("two", 2, "the second")
    registry.add("three", 3, "the third")
    assert registry.described() == "one (the first), two (the second) or three (the third)"
    assert list(registry) == ["one", "two", "three"] and "two" in registry and "four" not in registry
