"""The executor's config reads no framework: a fresh interpreter importing it (its package's ``__init__`` and the
variant registries it checks names against included) has loaded no torch, transformers or ray. The import contract
in pyproject.toml checks the modules' own imports; this checks what an import loads."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["oppo.exec.config", "oppo.exec.algos.registry"])
def test_the_config_loads_no_framework(module):
    code = (
        f"import sys, {module}\nprint(sorted(m for m in ('torch', 'transformers', 'ray', 'simpy') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
