"""The README's headline table is recomputed: a number there that the simulator no longer gives fails here."""

import re
from pathlib import Path

from oppo.catalog.lengths import load_lengths
from oppo.sim import load_setup
from oppo.sim.study.experiments import run

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_row(label: str) -> str:
    """The oppo.sim cell of the headline table's row starting with ``label``."""
    row = next(line for line in README.read_text().splitlines() if line.startswith(f"| {label}"))
    return row.strip("|").split("|")[2].strip()


def test_headline_table_matches_the_simulator():
    setup, trace = load_setup("paper-7b-h200"), load_lengths("alpaca_eval")
    s = {p: run(setup, p, 700, 0, trace).summary for p in ("sync", "intra", "inter", "oppo")}
    ratio = lambda p: f"{s['sync']['mean_step_s'] / s[p]['mean_step_s']:.2f}x"  # noqa: E731
    assert readme_row("sync / oppo").startswith(ratio("oppo"))
    assert readme_row("sync / inter").startswith(ratio("inter"))
    assert readme_row("sync / intra").startswith(ratio("intra"))
    busy = f"{s['sync']['mean_utilization']:.1%} -> {s['oppo']['mean_utilization']:.1%}"
    assert readme_row("GPU busy").startswith(busy)
    hist = s["oppo"]["deferral_hist"]
    shown = " / ".join(f"{100 * hist.get(str(k), 0.0):.1f}" for k in range(3))
    assert re.sub(r" / 0%$", "", readme_row("deferrals")).startswith(shown)
