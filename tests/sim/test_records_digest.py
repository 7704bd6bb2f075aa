"""The simulator's records are those of the code before it was sped up: ``records_digest.json`` holds the sha256
of four small runs' record files (PPO and GRPO, HF and vLLM engines, oppo, tailbatch and async) as written by that
code (``python benchmarks/sim_records_match.py --digest --tree DIR`` on its tree); this tree must write the same
bytes. A change that moves a record on purpose regenerates the file from the tree that should be trusted, and the
full comparison is ``benchmarks/sim_records_match.py --other DIR`` (34 cases). The digests were last written with
numpy 2.4.6 and scipy 1.17.1: a library upgrade that moves them (floating-point results of the cost fits) is
checked with the full comparison against the trusted tree on the new libraries, then the digests regenerated."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_small_runs_write_the_recorded_bytes(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "sim_records_match.py"), "--digest"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr
    expected = json.loads((Path(__file__).parent / "records_digest.json").read_text())
    got = json.loads(res.stdout)
    assert got.keys() == expected.keys()
    for case, files in expected.items():
        assert got[case] == files, f"{case}: records differ from the digest"
