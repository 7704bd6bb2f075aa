"""The examples in the package's docstrings (``>>>``) are run: a 3-token GAE or a KL estimator on two numbers is both
documentation and a test. Every module whose source holds an example is collected, so a new one needs no entry here."""

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "oppo"


def modules_with_examples() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>> " in path.read_text():
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name}: no example ran"
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"


def test_examples_are_collected():
    """The collector finds the modules that hold examples (it cannot pass by finding none)."""
    assert modules_with_examples(), "no module with a docstring example"
