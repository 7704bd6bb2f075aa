"""Setups as TOML files: read (``load_setup``: a preset, a bundled setup or a file of overrides on a base) and
written (``setup_toml``, ``framework_toml``: what ``calibrate-log`` saves). The file format is the module docstring
of :mod:`oppo.sim.setup.presets`; every TOML key is a field of its dataclasses."""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
import warnings
from pathlib import Path
from typing import Any

from oppo.data import data_dir, read_toml
from oppo.sim.cost.fit import SHARED_TERMS
from oppo.sim.cost.framework import FRAMEWORKS, STAGE_TERMS, Framework, read_layer
from oppo.sim.cost.gpu import lookup
from oppo.sim.cost.span import Calibration
from oppo.sim.cost.stage import StageCost
from oppo.sim.setup.presets import PRESETS, GpuSpec, Setup, paper_7b_h200


def load_setup(name_or_file: str) -> Setup:
    """A preset by name, or a TOML file (``base`` preset + overrides)."""
    if name_or_file in PRESETS:
        return PRESETS[name_or_file]()
    bundled = data_dir() / "setups" / f"{name_or_file}.toml"  # setups of real runs shipped with the package
    path = bundled if bundled.is_file() else Path(name_or_file)
    if path.suffix != ".toml":
        known = [*PRESETS, *sorted(p.stem for p in (data_dir() / "setups").glob("*.toml"))]
        raise ValueError(f"unknown setup {name_or_file!r}; choose from {', '.join(known)} or a .toml file")
    data = read_toml(path, "setup file")
    for role in MODEL_KEYS:  # a model's config.json (or checkpoint folder) is relative to the TOML naming it
        if isinstance(data.get(role), str):
            data[role] = _model_path(data[role], path.parent)
    framework, stale = data.get("framework"), ""
    if isinstance(framework, dict) and str(framework.get("base", "")).endswith(".toml"):
        layer_path = path.parent / framework.pop("base")
        layer = read_layer(layer_path)
        data["framework"] = layer | framework  # a stage table here replaces the layer's whole
        stale = _stale_collectives(layer, framework, layer_path, path)
    base = data.pop("base", "paper-7b-h200")
    if not isinstance(base, str):
        raise ValueError(f"{path}: base must be a preset's name or a .toml file, got {base!r}")
    if base in PRESETS or (data_dir() / "setups" / f"{base}.toml").is_file():
        setup = _override(load_setup(base), data, str(path))
    else:
        base_path = path.parent / base  # a setup file, relative to this one (or absolute)
        if base_path.suffix != ".toml" or base_path.resolve() == path.resolve():
            raise ValueError(f"{path}: unknown base setup {base!r} (a preset, a bundled setup or another .toml)")
        setup = _override(load_setup(str(base_path)), data, str(path))
    if setup.framework.train_backend == "megatron" and stale:
        warnings.warn(
            f"{stale}: Megatron's collectives are priced at their nominal link (collective_frac 1.0)", stacklevel=2
        )
    return setup


def _stale_collectives(layer: dict, own: dict, layer_path: Path, path: Path) -> str:
    """Why a setup's scoring or training stage tables lack ``collective_frac``, or "": a stage table of its own
    replaced the layer's whole table (its fitted terms too) and gives none, or its framework layer was written
    before Megatron's collectives had a share of their own."""
    merged = layer | own
    stages = [stage for family in SHARED_TERMS for stage in family if isinstance(merged.get(stage), dict)]
    lacking = [stage for stage in stages if "collective_frac" not in merged[stage]]
    if not lacking:
        return ""
    if lacking[0] in own:
        whole = f"replaces {layer_path.name}'s whole table, its fitted terms too,"
        return f"{path}: [framework.{lacking[0]}] {whole} and gives no collective_frac"
    return f"{layer_path} was fitted before Megatron's collectives had a share of their own (refit: calibrate-log)"


MODEL_KEYS = ("actor", "reward")  # setup keys naming a model: a shape name, "rule" (reward), or a config.json


def _model_path(value: str, folder: Path) -> str:
    """A ``config.json`` file or a checkpoint folder, absolute (relative ones from ``folder``); a shape name or
    "rule" as it is."""
    if value.endswith(".json") or (folder / value).is_dir():
        return str((folder / value).resolve())
    return value


def framework_toml(layer: dict[str, StageCost], comment: str, calibration: Calibration | None = None) -> str:
    """A fitted framework layer as ``framework.toml``: one table per stage, every term written out (what a setup's
    ``[framework] base = "framework.toml"`` takes over its own structural settings), and what it was fitted on
    (``[calibration]``)."""
    lines = [f"# {line}" for line in comment.splitlines()]
    for stage, cost in layer.items():
        lines += ["", f"[{stage}]"] + [f"{t} = {toml_value(float(getattr(cost, t)))}" for t in STAGE_TERMS]
    if calibration is not None:
        fields = dataclasses.asdict(calibration)
        lines += ["", "[calibration]"] + [f"{key} = {toml_value(value)}" for key, value in fields.items()]
    return "\n".join(lines) + "\n"


def setup_toml(setup: Setup, base: str) -> str:
    """A setup as TOML over ``base`` (a preset or a setup file): the fields that differ from it, so the file reads
    as what was changed (e.g. a calibrated framework layer)."""
    reference = load_setup(base)
    lines = [f"base = {toml_value(base)}", f"name = {toml_value(setup.name)}"]
    tables = []
    for f in dataclasses.fields(setup):
        value, old = getattr(setup, f.name), getattr(reference, f.name)
        if f.name == "name" or value == old:
            continue
        if f.name == "reward" and value is None:  # no reward model: a rule scores
            value = "rule"
        if dataclasses.is_dataclass(value):
            tables += _toml_tables(f.name, value, old)
        else:
            lines.append(f"{f.name} = {toml_value(value)}")
    return "\n".join(lines + tables) + "\n"


def _toml_tables(name: str, value: Any, old: Any) -> list[str]:
    """The table of ``value``: its fields that differ from ``old``'s (every field where ``old`` is None)."""
    own, nested = [f"\n[{name}]"], []
    for f in dataclasses.fields(value):
        v, o = getattr(value, f.name), getattr(old, f.name, _UNSET)
        if v == o:
            continue
        if dataclasses.is_dataclass(v):
            nested += _toml_tables(f"{name}.{f.name}", v, o)
        else:
            own.append(f"{f.name} = {toml_value(v)}")
    return (own if len(own) > 1 else []) + nested


_UNSET = object()  # the field of a table the base setup does not have (e.g. its gpu_spec is None)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    if value is None:
        raise ValueError("TOML has no null: a setup field set to None cannot be written")
    return str(value)


def _reward_terms_follow_the_scorer(setup: Setup, data: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A TOML that switches the scorer (a reward model <-> a rule) or starts ``[framework]`` from a named layer, and
    sets no ``[framework.reward]``, gets the reward terms of its own scorer (:meth:`Framework.with_reward`), not the
    base's (a reward model's seconds per micro-batch would be charged per sequence scored by the rule)."""
    table = data.get("framework") if isinstance(data.get("framework"), dict) else {}
    rule = changes.get("reward", setup.reward) is None
    switched = "reward" in changes and rule != (setup.reward is None)
    if "reward" in table or not (switched or "base" in table):
        return changes
    return changes | {"framework": changes.get("framework", setup.framework).with_reward(rule)}


def setup_from_dict(data: dict[str, Any], where: str) -> Setup:
    """A setup stored in a run's ``config.json`` (every field written out, so no preset is needed)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: [setup] must be a table")
    return _override(paper_7b_h200(), data, where)


NAMED_TABLES = {Framework: FRAMEWORKS}  # table types a TOML table may start from by name (``base = NAME``)
OPTIONAL_TABLES = {"gpu_spec": GpuSpec}  # setup fields that are None unless a table gives every required key


def _new_table(cls: type, value: Any, where: str) -> Any:
    """A table of ``cls`` built from its keys alone (no base value to override)."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: must be a table")
    fields = dataclasses.fields(cls)
    unknown = set(value) - {f.name for f in fields}
    missing = [f.name for f in fields if f.name not in value and f.default is dataclasses.MISSING]
    if unknown or missing:
        shown = (k if k.isprintable() else repr(k) for k in sorted(unknown))  # a line break in a key: one line
        problem = f"unknown key(s) {', '.join(shown)}" if unknown else f"missing {', '.join(missing)}"
        raise ValueError(f"{where}: {problem}; keys: {', '.join(f.name for f in fields)}")
    hints = _hints(cls)
    values = {key: _typed(v, hints[key], f"{where} {key}") for key, v in value.items()}
    try:
        return cls(**values)
    except ValueError as err:  # its own checks name no file
        raise ValueError(f"{where}: {err}") from None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _typed(value: Any, hint: Any, where: str) -> Any:
    """``value`` as a field declared ``hint`` takes it (an array as a tuple), or ValueError naming ``where``: an
    integer (not a boolean), a finite number, a string, a boolean, an array of these, or null where the field may
    be None (a stored config's JSON)."""
    if isinstance(hint, types.UnionType):  # e.g. str | None
        if value is None and type(None) in typing.get_args(hint):
            return value
        hint = next(h for h in typing.get_args(hint) if h is not type(None))
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where} must be an array, got {value!r}")
        item = typing.get_args(hint)[0]
        return tuple(_typed(v, item, f"{where} item") for v in value)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int and not (number and isinstance(value, int)):
        raise ValueError(f"{where} must be an integer, got {value!r}")
    if hint is float and not (number and math.isfinite(value)):
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    if hint in (str, bool) and not isinstance(value, hint):
        raise ValueError(f"{where} must be {'a string' if hint is str else 'true or false'}, got {value!r}")
    return value


def _override(obj: Any, data: dict[str, Any], where: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(obj)}
    changes = {}
    for key, value in data.items():
        if key not in fields:
            raise ValueError(f"{where}: unknown key {key!r}; known: {', '.join(fields)}")
        if isinstance(obj, Setup) and key == "reward" and value == "rule":
            value = None  # no reward model: a rule scores the responses
        current = getattr(obj, key)
        if current is None and key in OPTIONAL_TABLES and value is not None:  # e.g. [gpu_spec] over none
            changes[key] = _new_table(OPTIONAL_TABLES[key], value, f"{where} [{key}]")
            continue
        named = NAMED_TABLES.get(type(current))
        if named and isinstance(value, dict) and "base" in value:  # e.g. [framework] base = "roofline" | "trl"
            value = dict(value)  # start from that named table, not the base setup's
            name = value.pop("base")
            if not isinstance(name, str):
                raise ValueError(f"{where} [{key}]: base must be a name ({', '.join(named)}), got {name!r}")
            current = lookup(named, name, f"{where} [{key}] base")
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ValueError(f"{where}: [{key}] must be a table")
            value = _override(current, value, f"{where} [{key}]")
        else:
            value = _typed(value, _hints(type(obj))[key], f"{where}: {key}")
        changes[key] = value
    if isinstance(obj, Setup):
        changes = _reward_terms_follow_the_scorer(obj, data, changes)
    try:
        return dataclasses.replace(obj, **changes)
    except (TypeError, ValueError) as err:  # a table's own checks (its __post_init__) name no file
        raise ValueError(f"{where}: {err}") from None
