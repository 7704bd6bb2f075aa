"""``pip install .`` (not editable) gives a working tool: the wheel carries its data, and both CLIs run from
another directory in a fresh virtual environment."""

import json
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(cmd, **kwargs):
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
    assert res.returncode == 0, f"{cmd}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    return res


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv holding the wheel of this checkout; the dependencies come from the test environment."""
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"  # build from a copy: the build writes build/ and *.egg-info next to the sources
    shutil.copytree(ROOT / "oppo", src / "oppo", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp / "dist"),
            str(src),
        ]
    )
    (wheel,) = (tmp / "dist").glob("oppo-*.whl")
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # dependencies (torch, transformers, simpy, ...) from this environment, after the venv's own site-packages
    (purelib / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)])
    return python


def test_wheel_carries_its_data(installed, tmp_path):
    code = "import oppo, oppo.data as d; print(oppo.__file__); print(sorted(p.name for p in d.profile_dir().iterdir()))"
    out = run([str(installed), "-c", code], cwd=tmp_path).stdout.splitlines()
    venv_dir = installed.parent.parent
    assert out[0].startswith(str(venv_dir)) and not out[0].startswith(str(ROOT))  # the wheel, not the checkout
    assert "vidur_layer_ms.csv" in out[1] and "tiny-cpu.json" in out[1]


def test_both_clis_run_from_another_directory(installed, tmp_path):
    run(
        [
            str(installed),
            "-m",
            "oppo.sim",
            "run",
            "--setup",
            "tiny-cpu",
            "--steps",
            "3",
            "--lengths",
            "alpaca_eval",
            "--out",
            "sim",
        ],
        cwd=tmp_path,
    )
    run(
        [
            str(installed),
            "-m",
            "oppo.sim",
            "compare",
            "--setup",
            "paper-7b-h200",
            "--steps",
            "2",
            "--batch",
            "16",
            "--policies",
            "sync,oppo",
        ],
        cwd=tmp_path,
    )
    run(
        [
            str(installed),
            "-m",
            "oppo.exec.train",
            "--policy",
            "oppo",
            "--steps",
            "2",
            "--batch",
            "2",
            "--lengths",
            "gsm8k",
            "--out",
            "exec",
        ],
        cwd=tmp_path,
    )
    for run_dir in ("sim", "exec"):
        summary = json.loads((tmp_path / run_dir / "summary.json").read_text())
        assert summary["steps"] in (2, 3)
