import json
import subprocess
import sys

import pytest

ALPACA = "traces/alpaca_eval_lengths.csv.gz"


def sim(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "oppo.sim", *args], capture_output=True, text=True, cwd=cwd)


def test_run_writes_contract_files(tmp_path):
    out = tmp_path / "run"
    res = sim("run", "--setup", "paper-7b-h200", "--policy", "oppo", "--steps", "8", "--batch", "32", "--seed", "1",
              "--out", str(out), "--lengths", ALPACA, "--chunk", "auto", "--delta", "auto")  # fmt: skip
    assert res.returncode == 0, res.stderr
    summary = json.loads((out / "summary.json").read_text())
    for key in ("policy", "steps", "batch", "mean_step_s", "p50_step_s", "p99_step_s", "total_s", "utilization",
                "mean_utilization", "deferral_hist", "mean_deferrals", "final_reward", "wall_s", "config"):  # fmt: skip
        assert key in summary
    assert summary["steps"] == 8 and summary["batch"] == 32
    assert (out / "steps.csv").read_text().splitlines()[0] == (
        "step,start_s,end_s,step_s,mean_reward,delta,chunk,finished,deferred"
    )
    assert (out / "trace.csv").read_text().splitlines()[0] == (
        "step,device,role,phase,start_s,end_s,batch_size,num_tokens,context_tokens"
    )
    assert (out / "timeline.png").stat().st_size > 1000


def test_compare_and_sweep(tmp_path):
    res = sim("compare", "--setup", "tiny-cpu", "--policies", "sync,oppo", "--steps", "5", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "speedup" in res.stdout and "oppo" in res.stdout
    assert (tmp_path / "utilization.png").exists() and (tmp_path / "compare.csv").exists()
    res = sim("sweep", "--setup", "tiny-cpu", "--chunks", "2,8", "--steps", "4", "--out", str(tmp_path / "s"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "s" / "sweep.png").exists()


@pytest.mark.parametrize(
    "content, extra, message",
    [
        ("tokens\n5\n", (), "response_tokens"),
        ("response_tokens\n-1\n", (), "non-negative"),
        ("response_tokens\nten\n", (), "non-numeric"),
        ("response_tokens,x\n,1\n", (), "empty"),
        (None, ("--setup", "nope"), "unknown setup"),
        (None, ("--policy", "fast"), "unknown policy"),
        (None, ("--batch", "0"), "batch must be > 0"),
        (None, ("--delta-min", "5", "--delta-max", "2"), "delta bounds reversed"),
        (None, ("--chunk", "-3"), "chunk must be > 0"),
        (None, ("--lengths", "missing.csv"), "not found"),
    ],
)
def test_bad_input_exit_2_one_line(tmp_path, content, extra, message):
    args = ["run", "--setup", "tiny-cpu", "--steps", "2", "--out", str(tmp_path / "o")]
    if content is not None:
        (tmp_path / "bad.csv").write_text(content)
        args += ["--lengths", str(tmp_path / "bad.csv")]
    res = sim(*args, *extra)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in res.stderr
    assert not (tmp_path / "o").exists()  # nothing written


def test_help():
    for cmd in ("run", "compare", "sweep"):
        res = sim(cmd, "--help")
        assert res.returncode == 0 and "--setup" in res.stdout
