"""Where a run came from: the project's version and commit, the libraries it ran with, the host's CPU and GPUs.

Stored in every run's ``config.json`` under ``provenance``. It is information, never a setting: ``--config`` reads
past it, and nothing in the records depends on it (two runs of one seed differ only here and in wall times)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

# The libraries whose versions decide a run's numbers (looked up in the installed metadata, never imported).
LIBRARIES = ("numpy", "scipy", "simpy", "torch", "transformers", "ray")
ROOT = Path(__file__).resolve().parents[1]  # the checkout, when oppo runs from one (editable install)


def provenance() -> dict[str, Any]:
    """Versions, commit and host of this process; every lookup is best-effort (None where unknown)."""
    return {
        "oppo": _version("oppo"),
        "commit": git_commit(ROOT),
        "python": platform.python_version(),
        "libraries": {name: _version(name) for name in LIBRARIES},
        "host": {"platform": platform.platform(), "cpu": cpu_model(), "cores": os.cpu_count(), "gpus": gpu_names()},
    }


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def git_commit(root: Path) -> str | None:
    """The checkout's commit, with ``+dirty`` when tracked files differ from it; None outside a git checkout."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    try:
        head = _run(["git", "-C", str(root), "rev-parse", "HEAD"])
        dirty = _run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    """Names of the visible GPUs: through torch when the run already imported it, else ``nvidia-smi`` if present."""
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.cuda.is_available():
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return []
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        return _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]).splitlines()
    except (OSError, subprocess.SubprocessError):
        return []


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=5, check=True)
    return done.stdout.strip()
