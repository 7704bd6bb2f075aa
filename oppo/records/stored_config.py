"""Stored configs: a run's ``config.json`` read back (``--config RUN_DIR/config.json``), with the digests of the
input files it read, so that a re-run either gives the same records or says why it cannot."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

from oppo.data import file_sha256, read_config_json, trace_path


def load_stored_config(path: str | Path) -> dict[str, Any]:
    """The settings of a run's ``config.json`` (a run directory is accepted too); its ``provenance`` (versions,
    commit, host: :mod:`oppo.records.provenance`) is information, not a setting, and is left out."""
    raw = read_config_json(path, "config")
    raw.pop("provenance", None)
    return raw


def with_provenance(config: dict[str, Any], resumed_from: str | Path | None = None) -> dict[str, Any]:
    """A config as a run stores it in ``config.json``: its settings plus where the run came from. A resumed run
    (``resumed_from``: its ``config.json``) keeps where it started and appends this process to ``resumed``."""
    from oppo.records.provenance import provenance

    here = provenance()
    if resumed_from is None:
        return config | {"provenance": here}
    first = read_config_json(resumed_from, "config").get("provenance", {})
    return config | {"provenance": first | {"resumed": [*first.get("resumed", []), here]}}


def config_from_dict(cls: type, values: dict[str, Any], where: str, **given: Any) -> Any:
    """``cls`` from a stored dict (JSON lists back to tuples) plus ``given`` fields; an unknown key is an error
    (a config written by another version must not be half-applied silently)."""
    if not isinstance(values, dict):
        raise ValueError(f"{where}: expected a table of settings")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {', '.join(unknown)}")
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    hints = typing.get_type_hints(cls)
    wrong = [f"{k} = {v!r} (expected {_hint_name(hints[k])})" for k, v in kwargs.items() if not _fits(v, hints[k])]
    if wrong:
        raise ValueError(f"{where}: wrong type of {', '.join(wrong)}")
    try:
        return cls(**(kwargs | given))
    except TypeError as err:
        raise ValueError(f"{where}: {err}") from None


def _fits(value: Any, hint: Any) -> bool:
    """Whether a stored JSON value can be a field of type ``hint`` (a bool is no number here; an int is a float;
    hints other than plain types, optionals, literals and tuples are not checked)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin is tuple:
        return isinstance(value, tuple)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is str:  # a schedule's chunk or Δ may be given as a number ("256" or 256), as its own check accepts
        return isinstance(value, (str, int)) and not isinstance(value, bool)
    if hint is bool:
        return isinstance(value, bool)
    return True


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def check_sources(stored: dict[str, Any], files: dict[str, str], where: str) -> None:
    """Fail if an input file of a stored run changed since: re-running it would not give the same records."""
    for name, path in files.items():
        digest = stored.get(name, {}).get("sha256") if isinstance(stored.get(name), dict) else None
        if digest is None:
            continue
        resolved = trace_path(path)
        if not resolved.is_file():
            raise FileNotFoundError(f"{where}: {name} file not found: {path}")
        if file_sha256(resolved) != digest:
            raise ValueError(f"{where}: {name} file {path} changed since the run (sha256 differs)")
