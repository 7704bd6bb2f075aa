"""Data shipped inside the package: real response-length traces and GPU / CPU cost profiles.

Sources and licenses are in ``README.md`` beside this file. Paths are resolved through ``importlib.resources`` so
an installed wheel finds them as a source checkout does (the checkout's ``traces/`` is a link to this folder).
"""

from __future__ import annotations

import tomllib
from importlib.resources import files
from pathlib import Path

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
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: invalid TOML ({err})") from None
