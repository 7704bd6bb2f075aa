import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from oppo.exec.models.tiny import prepared_checkpoints
from tests.invoke import train  # noqa: E402  (the command line in this process; Ctrl-C below needs a real one)


def test_smoke_run_writes_contract_files(tmp_path):
    out = tmp_path / "run"
    res = train(
        "--preset",
        "tiny-cpu",
        "--policy",
        "oppo",
        "--steps",
        "4",
        "--batch",
        "4",
        "--seed",
        "1",
        "--out",
        str(out),
        "--lengths",
        "traces/hh_rlhf_harmless_lengths.csv.gz",
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == "oppo" and summary["steps"] == 4 and summary["batch"] == 4
    assert set(summary["utilization"]) == {"cpu0"}
    for name in ("steps.csv", "trace.csv", "sequences.csv", "metrics.csv", "config.json", "curves.png"):
        assert (out / name).stat().st_size > 0
    phases = {line.split(",")[3] for line in (out / "trace.csv").read_text().splitlines()[1:]}
    assert {"decode", "prefill", "score", "train_actor", "train_critic"} <= phases


def test_hf_preset_loads_local_folders(tmp_path):
    paths = prepared_checkpoints("tiny-cpu")
    res = train(
        "--preset",
        "hf",
        "--actor",
        str(paths["actor"]),
        "--reward",
        str(paths["reward"]),
        "--policy",
        "sync",
        "--steps",
        "2",
        "--batch",
        "2",
        "--out",
        str(tmp_path / "hf"),
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--preset", "hf", "--actor", "nowhere", "--reward", "nowhere"), "checkpoint folder not found"),
        (("--batch", "0"), "batch must be > 0"),
        (("--chunk", "0"), "chunk must be > 0"),
        (("--policy", "fast"), "unknown policy"),
        (("--lengths", "missing.csv"), "not found"),
        (("--algo", "grpo"), "algo grpo needs group_size >= 2"),
        (("--policy", "async", "--placement", "disaggregated"), "async trains in one process"),
        (("--device", "nope"), "unknown device 'nope'"),
        (("--policy", "tppo", "--algo", "grpo", "--group-size", "4"), "tppo trains segments of single sequences"),
    ],
)
def test_bad_input_exit_2_one_line(tmp_path, extra, message):
    res = train("--steps", "2", "--out", str(tmp_path / "o"), *extra)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert not (tmp_path / "o").exists()


def test_bad_lengths_file(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("response_tokens\n12\n-4\n")
    res = train("--steps", "2", "--out", str(tmp_path / "o"), "--lengths", str(bad))
    assert res.returncode == 2 and "non-negative" in res.stderr


def test_ctrl_c_keeps_records(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "oppo.exec.train", "--steps", "100000", "--out", str(out)]
    # SIGINT handled as on a terminal even when this test runs where SIGINT is ignored (a background job)
    default_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline and not (out / "steps.csv").exists():  # written every 10 steps
            time.sleep(0.2)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # the run this test started, by its handle
            proc.kill()
    assert proc.returncode == 130, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] >= 10
    rows = (out / "steps.csv").read_text().splitlines()
    assert len(rows) == summary["steps"] + 1
    assert os.path.exists(out / "trace.csv")


def test_prompts_file(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("t5 t6 t7\n\nt9 t10 t11 t12\n")
    out = tmp_path / "p"
    res = train("--policy", "sync", "--steps", "2", "--batch", "2", "--prompts", str(prompts), "--out", str(out))
    assert res.returncode == 0, res.stderr
    res = train("--steps", "2", "--prompts", str(tmp_path / "none.txt"), "--out", str(tmp_path / "q"))
    assert res.returncode == 2 and "prompts file not found" in res.stderr


def test_config_reruns_the_same_run(tmp_path):
    first, again = tmp_path / "first", tmp_path / "again"
    res = train(
        "--policy",
        "oppo",
        "--steps",
        "4",
        "--batch",
        "4",
        "--chunk",
        "4",
        "--seed",
        "3",
        "--lengths",
        "traces/hh_rlhf_harmless_lengths.csv.gz",
        "--epochs",
        "1",
        "--out",
        str(first),
    )
    assert res.returncode == 0, res.stderr
    stored = json.loads((first / "config.json").read_text())
    assert os.path.isabs(stored["task"]["lengths"]) and stored["sources"]["lengths"]["sha256"]
    assert stored["ppo"]["epochs"] == 1 and stored["remote_roles"] == ["reward"] and stored["placement"] == "colocated"
    # re-run by another interpreter (another hash seed, nothing cached), from another directory
    cmd = [sys.executable, "-m", "oppo.exec.train", "--config", str(first / "config.json"), "--out", str(again)]
    env = os.environ | {"PYTHONHASHSEED": "12345"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    # same seed, same records: everything but the measured times
    for name in ("metrics.csv", "sequences.csv", "config.json"):
        assert (again / name).read_bytes() == (first / name).read_bytes(), name
    res = train(
        "--config", str(first / "config.json"), "--steps", "2", "--policy", "sync", "--out", str(tmp_path / "s")
    )
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert res.returncode == 0 and summary["steps"] == 2 and summary["policy"] == "sync"


def test_mode_is_the_former_name_of_policy(capsys):
    """``--policy`` names the policy as in the simulator; ``--mode`` (scripts call it) gives the same config with
    a one-line note, and the two disagreeing is bad input."""
    from oppo.exec.train import build_parser, config_from

    by_policy = config_from(build_parser().parse_args(["--policy", "sync"]))
    assert capsys.readouterr().err == ""
    by_mode = config_from(build_parser().parse_args(["--mode", "sync"]))
    assert by_mode == by_policy and by_mode.schedule.policy == "sync"
    assert capsys.readouterr().err == "note: --mode is now --policy (same values); --mode stays accepted\n"
    with pytest.raises(ValueError, match="--mode inter and --policy sync disagree"):
        config_from(build_parser().parse_args(["--mode", "inter", "--policy", "sync"]))


def test_a_config_from_before_max_prompt_tokens_reruns_with_its_old_cap(tmp_path):
    """Before --max-prompt-tokens, --prompt-tokens also capped the --prompts / --data prompts: a stored config without
    the new field reads its cap from the old one, so a --config re-run is the run it was."""
    from oppo.exec.config import ExecConfig, TaskConfig, load_config
    from oppo.records.io import write_json

    stored = json.loads(json.dumps(dataclasses.asdict(ExecConfig(task=TaskConfig(prompt_tokens=96)))))
    del stored["task"]["max_prompt_tokens"]
    write_json(tmp_path / "config.json", stored)
    task = load_config(tmp_path / "config.json").task
    assert (task.prompt_tokens, task.max_prompt_tokens) == (96, 96)
