"""``--eval-every``: the trained weights scored on fixed held-out prompts, without touching the run it measures."""

import csv
import math

import pytest
import torch

from oppo.exec.compute.timing import Recorder
from oppo.exec.config import ExecConfig, ModelConfig, TaskConfig, default_schedule
from oppo.exec.models.roles import load_roles
from oppo.exec.step.runner import Executor
from tests import invoke


def executor_for(eval_every=0, policy="async", seed=5, **task):
    config = ExecConfig(
        schedule=default_schedule(policy=policy, batch=4, max_new_tokens=24, staleness=1),
        model=ModelConfig(dtype="float64"),
        task=TaskConfig(eval_every=eval_every, **task),
        seed=seed,
    )
    torch.manual_seed(config.seed)
    return Executor.colocated(config, load_roles(config.model), Recorder())


def test_evaluation_does_not_change_the_run_it_measures():
    plain, evaluated = executor_for(), executor_for(eval_every=2)
    for step in range(4):
        (a, ma), (b, mb) = plain.step(), evaluated.step()
        assert [t.seq_id for t in a.trained] == [t.seq_id for t in b.trained]
        # the same operations on the run's side: bit for bit
        assert (ma.mean_reward, ma.policy_loss, ma.value_loss) == (mb.mean_reward, mb.policy_loss, mb.value_loss)
        assert math.isnan(ma.held_out_reward)
        assert math.isnan(mb.held_out_reward) == (step % 2 == 0)  # after the 2nd and 4th updates


def test_the_score_is_of_the_weights_alone():
    executor = executor_for(eval_every=1, eval_prompts=6)
    held_out = executor.held_out
    first, again = held_out.score(), held_out.score()
    assert (first.reward, first.rule_score, first.response_len) == (again.reward, again.rule_score, again.response_len)
    for _ in range(5):  # new weights (one small update may not flip any sampled token), the same prompts and noise
        executor.step()
    moved = held_out.score()
    assert (moved.reward, moved.response_len) != (first.reward, first.response_len)
    assert 0 <= moved.rule_score <= 1 and 1 <= moved.response_len <= 24


def test_greedy_answers_take_the_most_likely_token():
    executor = executor_for(eval_every=1, eval_decoding="greedy", eval_prompts=3)
    held_out = executor.held_out
    held_out.eos_id = -1  # no token ends an answer (they end at 1-5 tokens otherwise): 24 tokens checked per prompt
    answers = held_out.answers()
    assert [len(a) for a in answers] == [24] * 3
    actor = executor.group.rank.roles.actor
    with torch.no_grad():
        for prompt, answer in zip(held_out.prompts, answers):
            logits = actor(input_ids=torch.tensor([prompt + answer[:-1]])).logits[0]
            assert answer == logits[len(prompt) - 1 :].argmax(-1).tolist()  # each token the argmax given the rest


def test_the_run_clock_stops_while_it_evaluates(tmp_path):
    res = train(tmp_path, "--steps", "4", "--eval-every", "2", "--eval-prompts", "64")
    assert res.returncode == 0, res.stderr
    steps = list(csv.DictReader(open(tmp_path / "steps.csv")))
    metrics = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    held_out_s = float(metrics[1]["held_out_s"])
    gap = float(steps[2]["start_s"]) - float(steps[1]["end_s"])  # the evaluation ran after step 1
    assert held_out_s > 0 and gap < held_out_s / 2, (gap, held_out_s)
    assert [m["held_out_reward"] == "nan" for m in metrics] == [True, False, True, False]


def train(out, *args):
    return invoke.train("--preset", "tiny-cpu", "--batch", "4", "--out", out, *args)


@pytest.mark.parametrize(
    "args, message",
    [
        (("--eval-every", "-1"), "eval_every must be >= 0"),
        (("--eval-every", "1", "--eval-decoding", "beam"), "unknown eval_decoding 'beam'"),
        (("--eval-every", "1", "--eval-prompts", "0"), "eval_prompts must be > 0"),
        (("--eval-every", "1", "--dp", "2"), "--eval-every scores the actor in this process"),
    ],
)
def test_bad_evaluation_options_exit_2_in_one_line(tmp_path, args, message):
    res = train(tmp_path / "run", "--steps", "1", *args)
    assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "run").exists()


def test_a_prompts_file_gives_its_last_lines_to_evaluation(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"a b c {i}\n" for i in range(5)))
    executor = executor_for(eval_every=1, eval_prompts=2, prompts=str(prompts))
    whole = executor_for(prompts=str(prompts)).prompts
    assert len(whole) == 5 and executor.prompts == whole[:3] and executor.held_out.prompts == whole[3:]
    prompts.write_text("".join(f"a b c {i}\n" for i in range(3)))
    res = train(tmp_path / "run", "--steps", "1", "--prompts", str(prompts), "--eval-every", "1", "--eval-prompts", "3")
    assert res.returncode == 2 and "--eval-prompts 3 leaves no training prompt of the 3 given" in res.stderr


def test_study_variants_name_their_executor_options():
    from oppo.exec.learning import variant_flags, variant_options

    assert variant_options("async4-decoupled") == {"policy": "async", "staleness": "4", "offpolicy": "decoupled"}
    assert variant_flags("oppo") == ["--policy", "oppo"]
    for bad in ("asyncX", "sync-clipped", "tppo"):
        with pytest.raises(ValueError, match="unknown variant"):
            variant_options(bad)


def test_any_seed_gives_sampling_keys_torch_takes():
    """Keys are int64 whatever the seed (a seed of 2e9 overflowed them at the first evaluation)."""
    _, metrics = executor_for(eval_every=1, seed=2_000_000_000).step()
    assert math.isfinite(metrics.held_out_reward)
