"""The schedule config's checks, and the core's imports: stdlib, numpy, scipy and the record schema only."""

import ast
import subprocess
import sys

import pytest

from oppo import ScheduleConfig

CORE_MODULES = (
    "async_queue",
    "buffer",
    "chunking",
    "config",
    "overcommit",
    "policies",
    "registry",
    "scheduler",
    "staleness",
)


def test_core_imports_stdlib_numpy_scipy_and_the_record_schema_only():
    # `oppo` itself is the core's face: importing it (and every core module) must load nothing else
    modules = ", ".join(f"oppo.core.{m}" for m in CORE_MODULES)
    code = (
        f"import sys; before = set(sys.modules); import oppo, {modules};"
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in sys.stdlib_module_names))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = ast.literal_eval(out.stdout)
    third_party = {m.split(".")[0] for m in loaded} - {"oppo"}
    assert third_party <= {"numpy", "scipy"}, sorted(third_party)
    ours = {m for m in loaded if m.split(".")[0] == "oppo"}
    assert ours == {"oppo", "oppo.core", "oppo.records", "oppo.records.schema"} | {
        f"oppo.core.{m}" for m in CORE_MODULES
    }


def test_lower_layers_pull_no_backend():
    code = (
        "import sys, oppo.records.io, oppo.records.metrics, oppo.catalog.lengths, oppo.catalog.shapes, oppo.cli;"
        "bad = {'torch', 'simpy', 'transformers', 'ray', 'oppo.sim', 'oppo.exec'} & set(sys.modules);"
        "print(sorted(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch": 0}, "batch must be > 0"),
        ({"policy": "fast"}, "unknown policy"),
        ({"delta_min": 5, "delta_max": 2, "delta_init": 2}, "delta bounds reversed"),
        ({"chunk": "0"}, "chunk must be > 0"),
        ({"chunk": "big"}, "chunk must be an integer"),
        ({"delta": "-1"}, "delta must be >= 0"),
        ({"policy": "inter", "batch": 4, "delta": "5"}, "Δ must be <= B"),
        ({"max_deferrals": 0}, "max_deferrals must be >= 1"),
        ({"streamed_scorers": ("judge",)}, "unknown streamed_scorers"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ScheduleConfig(**kwargs)
