"""Data shipped inside the package (real response-length traces, GPU / CPU cost profiles) and the readers of the
files oppo takes: TOML setups, JSON configs, content digests of the inputs a run read.

Sources and licenses are in ``README.md`` beside this file. Paths are resolved through ``importlib.resources`` so
an installed wheel finds them as a source checkout does (the checkout's ``traces/`` is a link to this folder).
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from importlib.resources import files
from pathlib import Path
from typing import Any

# Bundled length traces by short name: ``--lengths alpaca_eval`` works from any directory.
TRACES = {
    "alpaca_eval": "alpaca_eval_lengths.csv.gz",
    "gsm8k": "gsm8k_lengths.csv.gz",
    "hh_rlhf_harmless": "hh_rlhf_harmless_lengths.csv.gz",
}


def data_dir() -> Path:
    """This package's folder (installed as a directory, not a zip: the files are read with ``open``)."""
    return Path(str(files(__name__)))


def profile_dir() -> Path:
    """Cost profiles: ``vidur_layer_ms.csv`` (GPU operator timings) and calibrated ``NAME.json`` profiles."""
    return data_dir() / "profiles"


def trace_path(name_or_path: str | Path) -> Path:
    """An existing file as given, else a bundled trace by short name (``alpaca_eval``) or file name."""
    path = Path(name_or_path)
    if path.exists():
        return path
    bundled = data_dir() / TRACES.get(str(name_or_path), path.name)
    return bundled if str(name_or_path) in TRACES or (path.parent == Path(".") and bundled.is_file()) else path


def read_toml(path: Path, what: str) -> dict:
    """A TOML file's tables; a missing file (``"<what> not found"``) or invalid TOML is a user error naming it."""
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a UTF-8 text file ({err.reason} at byte {err.start})") from None
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: invalid TOML ({err})") from None
    except RecursionError:  # arrays or tables nested thousands deep
        raise ValueError(f"{path}: invalid TOML (nested too deep)") from None


def read_config_json(path: str | Path, what: str) -> dict[str, Any]:
    """The JSON object of a ``config.json`` file, or of the one in a folder (a run, a checkpoint); errors name
    the file: not found (``what``), not JSON, not an object."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a JSON config ({err})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a JSON object")
    return raw


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's content, read a block at a time (a checkpoint's weights may be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sources_of(files: dict[str, str]) -> dict[str, dict[str, str]]:
    """Content digests of the input files a run read, stored beside its config (``sources``)."""
    return {name: {"path": str(path), "sha256": file_sha256(trace_path(path))} for name, path in files.items()}
