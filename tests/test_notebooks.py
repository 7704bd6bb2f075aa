"""Every notebook executes headless from a clean checkout (outputs are stripped in git)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_notebooks_are_stripped():
    for path in NOTEBOOKS:
        book = nbformat.read(path, as_version=4)
        assert all(not c.get("outputs") and not c.get("execution_count") for c in book.cells if c.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    book = nbformat.read(path, as_version=4)
    NotebookClient(book, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert not any(o.get("output_type") == "error" for c in book.cells for o in c.get("outputs", []))
