import gc
import json
import subprocess
import sys

import pytest

from tests import invoke

ALPACA = "traces/alpaca_eval_lengths.csv.gz"


def sim(*args, cwd=None):
    return invoke.sim(*args, cwd=cwd)  # in this process: the real one is tests/test_packaging.py's


def test_run_in_process_leaves_the_cyclic_collector_on(tmp_path):
    """``run`` pauses the collector while its records live, not for the rest of a process that called it."""
    from oppo.sim.cli import main

    assert gc.isenabled()
    main(["run", "--setup", "paper-7b-h200", "--steps", "2", "--batch", "4", "--out", str(tmp_path / "run")])
    assert gc.isenabled() and (tmp_path / "run" / "trace.csv").exists()


FREED = """
import gc, sys
from oppo.sim.cli import main
gc.disable()  # what reference counting alone frees, in a fresh process (matplotlib imported by run)
main(["run", "--setup", "paper-7b-h200", "--steps", "3", "--batch", "8", "--out", sys.argv[1]])
records = {"SimResult", "TrainedColumns", "StepRecord", "OpTrace"}
print(sum(type(o).__name__ in records for o in gc.get_objects()))
"""


def test_run_frees_its_records_by_reference_counting(tmp_path):
    """Importing matplotlib leaves reference cycles through the importing frames: ``run`` imports it where no
    record is held, so its records go when written, not at the collector's next pass over all of them."""
    out = subprocess.run([sys.executable, "-c", FREED, str(tmp_path / "run")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0"


def test_run_writes_contract_files(tmp_path):
    out = tmp_path / "run"
    res = sim(
        "run",
        "--setup",
        "paper-7b-h200",
        "--policy",
        "oppo",
        "--steps",
        "8",
        "--batch",
        "32",
        "--seed",
        "1",
        "--out",
        str(out),
        "--lengths",
        ALPACA,
        "--chunk",
        "auto",
        "--delta",
        "auto",
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "policy",
        "steps",
        "batch",
        "mean_step_s",
        "p50_step_s",
        "p99_step_s",
        "total_s",
        "utilization",
        "mean_utilization",
        "deferral_hist",
        "mean_deferrals",
        "final_reward",
        "wall_s",
        "config",
    ):
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
    header = res.stdout.splitlines()[0].split()
    assert header[:3] == ["policy", "samples_speedup", "tokens_speedup"] and "per_step_speedup" in header
    assert "oppo" in res.stdout
    assert (tmp_path / "utilization.png").exists() and (tmp_path / "compare.csv").exists()
    assert (tmp_path / "staleness.png").exists()
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


@pytest.mark.parametrize(
    "toml, message",
    [
        ('gpu = "h900"', "unknown gpu 'h900'; choose from"),
        ("colour = 1", "unknown key 'colour'"),
        ('[framework]\nbase = "nope"', "[framework] base 'nope'; choose from"),
        ('gpu = "cpu-core"', "no fitted efficiency for gpu 'cpu-core'"),  # a KeyError once, shown as "error: cpu-core"
        ('actor = "missing.config.json"', "model config not found: "),  # named relative to the TOML
        ("[framework]\nrollout_tensor_parallel = 2", "rollout tensor parallel 2 does not divide the 7 generating"),
        ("[framework]\nrollout_memory_fraction = 0.05", "leaves no KV memory beside the weights"),
        ("[framework]\nrollout_memory_fraction = 1.5", "0 <= rollout_memory_fraction <= 1"),
    ],
)
def test_bad_setup_file_exit_2_one_line(tmp_path, toml, message):
    (tmp_path / "bad.toml").write_text(f'base = "paper-7b-h200"\n{toml}\n')
    res = sim("run", "--setup", str(tmp_path / "bad.toml"), "--steps", "2", "--out", str(tmp_path / "o"))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert not (tmp_path / "o").exists()


def test_the_framework_keys_of_a_real_run_load_and_cost_what_they_say(tmp_path):
    """The bundled setup of a real verl run (every [framework] key of the contract) runs; padding every row to the
    longest makes its scoring and training passes slower, CUDA graphs its decoding faster."""
    seconds = {}
    for name, extra in (("as-run", ""), ("padded", "packed = false"), ("graphs", "decode_cuda_graphs = true")):
        toml = tmp_path / f"{name}.toml"
        toml.write_text(f'base = "verl-deepseek-llm-7b-ppo-8xmi300x"\n[framework]\n{extra}\n')
        res = sim("run", "--setup", str(toml), "--steps", "3", "--seed", "1", "--out", str(tmp_path / name))
        assert res.returncode == 0, res.stderr
        phases = json.loads((tmp_path / name / "summary.json").read_text())["phase_s_per_step"]
        seconds[name] = phases
    assert seconds["padded"]["actor/train_actor"] > seconds["as-run"]["actor/train_actor"]
    assert seconds["padded"]["critic/score"] > seconds["as-run"]["critic/score"]
    assert seconds["graphs"]["actor/decode"] < seconds["as-run"]["actor/decode"]
    assert seconds["graphs"]["actor/train_actor"] == pytest.approx(seconds["as-run"]["actor/train_actor"], rel=1e-9)


def test_help():
    for cmd in ("run", "compare", "sweep"):
        res = sim(cmd, "--help")
        assert res.returncode == 0 and "--setup" in res.stdout


def test_config_reruns_the_same_run(tmp_path):
    first, again, shorter = tmp_path / "first", tmp_path / "again", tmp_path / "shorter"
    res = sim(
        "run",
        "--setup",
        "paper-3b-a100",
        "--policy",
        "oppo",
        "--steps",
        "12",
        "--batch",
        "24",
        "--seed",
        "4",
        "--lengths",
        ALPACA,
        "--lengths-model",
        "alpaca-7b",
        "--chunk",
        "256",
        "--out",
        str(first),
    )
    assert res.returncode == 0, res.stderr
    stored = json.loads((first / "config.json").read_text())
    assert stored["lengths_model"] == "alpaca-7b" and stored["sources"]["lengths"]["sha256"]
    assert stored["setup"]["name"] == "paper-3b-a100" and stored["schedule"]["chunk"] == "256"
    # from another directory: nothing in the stored config depends on the working directory
    res = sim("run", "--config", str(first / "config.json"), "--out", str(again), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for name in ("steps.csv", "trace.csv", "sequences.csv", "config.json"):
        assert (again / name).read_bytes() == (first / name).read_bytes(), name
    res = sim("run", "--config", str(first), "--steps", "5", "--policy", "sync", "--out", str(shorter))
    assert res.returncode == 0, res.stderr
    summary = json.loads((shorter / "summary.json").read_text())
    assert summary["steps"] == 5 and summary["policy"] == "sync" and summary["batch"] == 24


def test_config_with_changed_lengths_file_is_refused(tmp_path):
    trace = tmp_path / "lengths.csv"
    trace.write_text("response_tokens\n10\n20\n300\n")
    res = sim("run", "--setup", "tiny-cpu", "--steps", "3", "--lengths", str(trace), "--out", str(tmp_path / "a"))
    assert res.returncode == 0, res.stderr
    trace.write_text("response_tokens\n10\n20\n301\n")
    res = sim("run", "--config", str(tmp_path / "a" / "config.json"), "--out", str(tmp_path / "b"))
    assert res.returncode == 2 and "changed since the run" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "b").exists()


def test_config_with_a_value_of_the_wrong_type_is_refused(tmp_path):
    """A stored value of the wrong type (a hand-edited config.json) is an error naming it, not a run that reads
    "yes" as true or fails later with a traceback."""
    res = sim("run", "--setup", "tiny-cpu", "--steps", "2", "--policy", "async", "--out", str(tmp_path / "a"))
    assert res.returncode == 0, res.stderr
    stored = json.loads((tmp_path / "a" / "config.json").read_text())
    stored["rollout"] = {"inflight_updates": "yes", "queue_groups": 1.5}
    (tmp_path / "a" / "config.json").write_text(json.dumps(stored))
    res = sim("run", "--config", str(tmp_path / "a"), "--out", str(tmp_path / "b"))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "queue_groups = 1.5 (expected int)" in res.stderr
    assert "inflight_updates = 'yes' (expected bool)" in res.stderr
    assert not (tmp_path / "b").exists()


def test_setup_with_a_checkpoint_config(tmp_path):
    """A user's own config.json is a shape source for any setup."""
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "num_hidden_layers": 24,
                "hidden_size": 896,
                "num_attention_heads": 14,
                "num_key_value_heads": 2,
                "intermediate_size": 4864,
                "vocab_size": 151936,
                "torch_dtype": "bfloat16",
            }
        )
    )
    setup = tmp_path / "mine.toml"
    setup.write_text(f'base = "paper-7b-gh200-gsm8k"\nactor = "{config}"\n')
    res = sim("run", "--setup", str(setup), "--steps", "3", "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    (tmp_path / "setups").mkdir()
    (tmp_path / "setups" / "relative.toml").write_text('base = "paper-7b-gh200-gsm8k"\nactor = "../config.json"\n')
    res = sim(
        "run", "--setup", str(tmp_path / "setups" / "relative.toml"), "--steps", "3", "--out", str(tmp_path / "r")
    )
    assert res.returncode == 0, res.stderr  # a config.json path is relative to the TOML, not the working directory
    stored = json.loads((tmp_path / "r" / "config.json").read_text())["setup"]["actor"]
    assert stored == str(config.resolve())
    config.write_text(json.dumps({"hidden_size": 896}))
    res = sim("run", "--setup", str(setup), "--steps", "3", "--out", str(tmp_path / "bad"))
    assert res.returncode == 2 and "missing num_hidden_layers" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_compare_leaves_out_a_policy_that_cannot_run_and_says_why(tmp_path):
    res = sim(
        "compare",
        "--setup",
        "paper-7b-h200",
        "--policies",
        "sync,oppo,april,tailbatch,async,tppo",
        "--algo",
        "grpo",
        "--group-size",
        "8",
        "--batch",
        "16",
        "--steps",
        "3",
        "--out",
        str(tmp_path),
    )
    assert res.returncode == 0, res.stderr
    policies = [line.split()[0] for line in res.stdout.splitlines()[1:] if not line.startswith("left out")]
    assert sorted(policies) == ["april", "async", "oppo", "sync", "tailbatch"]  # ranked by work done
    assert "left out tppo: tppo trains segments of single sequences" in res.stdout
    assert (tmp_path / "staleness.png").stat().st_size > 1000
