"""Every notebook executes headless from a clean checkout (outputs are stripped in git), writing only under its
``OUT`` folder (``runs/``, ignored by git) and nothing into the checkout."""

import hashlib
from pathlib import Path

import pytest

# the notebooks extra; a machine without it (a GPU box running -m gpu) skips these instead of failing collection
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# The three that run the executor for ~40 s or more each run with -m slow; their library calls are tested in the
# default run (oppo.fidelity by tests/test_benchmarks.py::test_fidelity, the async learners by tests/exec/test_async.py,
# the task study by tests/test_benchmarks.py::test_real_task_learning).
SLOW = {"sim_vs_exec", "async_learning", "real_task"}


def test_notebooks_are_stripped():
    for path in NOTEBOOKS:
        book = nbformat.read(path, as_version=4)
        assert all(not c.get("outputs") and not c.get("execution_count") for c in book.cells if c.cell_type == "code")


@pytest.mark.parametrize(
    "path", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW else p for p in NOTEBOOKS], ids=lambda p: p.stem
)
def test_notebook_runs(path, tmp_path, monkeypatch):
    """Run from a temporary folder standing for the notebook's own (Jupyter's working directory)."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    before = _digests(path.parent)
    book = nbformat.read(path, as_version=4)
    NotebookClient(book, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert not any(o.get("output_type") == "error" for c in book.cells for o in c.get("outputs", []))
    assert [p.name for p in tmp_path.iterdir()] in ([], ["runs"])  # from notebooks/, its outputs are ignored by git
    assert _digests(path.parent) == before


def _digests(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the SHA-256 of its content."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }
