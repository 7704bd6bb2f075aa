"""verl's asynchronous trainers' logs (one-step-off and fully async, ``verl/experimental``): their ``timing_s/gen`` is
the trainer's wait for samples and is never fitted as generation; the one-step-off trainer's
``timing_s/generate_async`` is; the setup read from the launch command splits off the rollout GPUs, and the
stages' terms are recovered from a log synthesised from known terms."""

from pathlib import Path

import numpy as np
import pytest

from oppo.sim.cost.stage import StageCost
from oppo.sim.logs.fit import async_step_seconds
from oppo.sim.logs.read import load_run_log
from oppo.sim.logs.setup_from_log import setup_from_log
from oppo.sim.setup.toml_file import load_setup
from tests import invoke
from tests.sim.test_logfit import synthesized_log, within_run

DATA = Path(__file__).with_name("data")
COMMAND = (
    "+ python3 -m verl.experimental.one_step_off_policy.main_ppo algorithm.adv_estimator=grpo "
    "data.train_batch_size=64 data.max_prompt_length=512 data.max_response_length=512 "
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct actor_rollout_ref.actor.ppo_mini_batch_size=16 "
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 "
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 "
    "actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.model.enable_gradient_checkpointing=True "
    "actor_rollout_ref.rollout.n=5 actor_rollout_ref.rollout.tensor_model_parallel_size=2 "
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.actor.use_kl_loss=False "
    "trainer.nnodes=1 trainer.n_gpus_per_node=6 rollout.nnodes=1 rollout.n_gpus_per_node=2"
)
TRUTH = {
    "gen": StageCost(efficiency=0.4, per_token_s=2e-5),
    "old_log_prob": StageCost(efficiency=0.6, half_efficiency_tokens=3000.0),
    "update_actor": StageCost(efficiency=0.45, half_efficiency_tokens=4000.0),
    "weight_sync": StageCost(gather_bandwidth_frac=0.025),  # a slow push (3 s): whether it hides shows in the step
}
TRAINER = ("weight_sync", "old_log_prob", "update_actor")  # what the trainer runs in a step, one after another


def one_step_off_log(tmp_path: Path, steps: int = 30, truth: dict = TRUTH) -> Path:
    """A one-step-off trainer's console log written from a setup with known terms: its launch command, then per
    step the generation it ran in the background (``generate_async``), the weight push, the trainer's stages, its
    wait for the batch (``gen``) and its step as verl's trainer runs them (:func:`one_step_off_clock`), with the
    lengths of the shared MI300X run's steps."""
    setup = setup_from_log(
        write(tmp_path / "cmd.log", COMMAND + "\n" + step_line(1, {"gen": 1.0}, 100, 500, 5, 50)), gpu="h100"
    ).setup()
    real = list(load_run_log(DATA / "verl_deepseek_7b_ppo_8xmi300x.csv.gz").steps)[:steps]
    logged = synthesized_log(setup, truth, real).steps
    waits, step_s = one_step_off_clock(
        [s.stages["gen"] for s in logged],
        [s.stages["weight_sync"] for s in logged],
        [s.stages["old_log_prob"] + s.stages["update_actor"] for s in logged],
    )
    lines = [COMMAND]
    for s, wait, step in zip(logged, waits, step_s, strict=True):
        times = {"gen": wait, "generate_async": s.stages["gen"], "sync_rollout_weights": s.stages["weight_sync"]}
        times |= {"old_log_prob": s.stages["old_log_prob"], "update_actor": s.stages["update_actor"], "step": step}
        lines.append(step_line(s.step, times, s.response_mean, s.response_max, s.response_min, s.prompt_mean))
    return write(tmp_path / "one_step_off.log", "\n".join(lines) + "\n")


def one_step_off_clock(gen: list, push: list, train: list) -> tuple[list, list]:
    """verl's one-step-off trainer's order, written out apart from the simulator: step s waits for batch s (and its
    own previous step), pushes its weights, starts generating batch s + 1 with them, and trains. Returns each
    step's wait (``timing_s/gen``) and its seconds (``timing_s/step``, from the previous step's end)."""
    waits, steps, closed, ready = [], [], 0.0, gen[0]  # batch 0 starts with the run
    for s in range(len(gen)):
        start = max(closed, ready)
        pushed = start + push[s]
        if s + 1 < len(gen):
            ready = pushed + gen[s + 1]
        waits.append(start - closed)
        steps.append(pushed + train[s] - closed)
        closed = pushed + train[s]
    return waits, steps


def within_first(log) -> int:
    """The first validated step of :func:`within_run`'s default split (60% fitted)."""
    return max(1, int(len(log.steps) * 0.6))


def step_line(step: int, times: dict, mean, high, low, prompt) -> str:
    parts = [f"timing_s/{k}:{v:.6f}" for k, v in times.items()]
    parts += [f"response_length/mean:{mean}", f"response_length/max:{high}", f"response_length/min:{low}"]
    parts += [f"prompt_length/mean:{prompt}"]
    return f"(TaskRunner pid=1) step:{step} - " + " - ".join(parts)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_trainers_wait_is_not_generation(tmp_path):
    log = load_run_log(one_step_off_log(tmp_path, steps=3))
    assert log.asynchronous
    for step in log.steps:
        trainer = sum(step.stages[stage] for stage in TRAINER)
        assert step.trainer_wait_s == pytest.approx(step.async_step_s - trainer, abs=1e-5)
        assert step.stages["gen"] > 1.0  # generate_async, the generation itself
        assert "step" not in step.stages  # wait + overlap: no sum of stages
    # the one-step-off recipe of 2025 (recipe/one_step_off_policy): the wait is wait_prev_gen, generation the
    # rollout workers' generate_sequences; today's trainer logs the slowest request's generate time beside
    # generate_async, and that is generation
    recipe = write(
        tmp_path / "recipe.log",
        "step:1 - timing_s/wait_prev_gen:0.4 - timing_s/generate_sequences:30.0 - timing_s/sync_rollout_weights:1.0"
        " - timing_s/old_log_prob:3.0 - timing_s/update_actor:9.0 - timing_s/step:14.0 - response_length/mean:300\n"
        "step:2 - timing_s/gen:0.2 - timing_s/generate_async:41.0 - timing_s/agent_loop/generate_sequences/max:33.0"
        " - timing_s/old_log_prob:3.0 - timing_s/update_actor:9.0 - timing_s/step:13.0 - response_length/mean:300\n",
    )
    one, two = load_run_log(recipe).steps
    assert (one.trainer_wait_s, one.stages["gen"], two.trainer_wait_s, two.stages["gen"]) == (0.4, 30.0, 0.2, 33.0)


# the same run under the fully async trainer: a trainer step of ppo_mini_batch_size x require_batches prompts
FULLY_ASYNC = (
    COMMAND.replace("one_step_off_policy.main_ppo", "fully_async_policy.fully_async_main")
    .replace("data.train_batch_size=64", "data.train_batch_size=0")
    .replace("ppo_mini_batch_size=16", "ppo_mini_batch_size=8 async_training.require_batches=2")
    + " async_training.trigger_parameter_sync_step=4"
)


def fully_async_log(tmp_path: Path, rows: int = 15, trigger: int = 4, first_version: int = 1) -> Path:
    """verl's fully async trainer's console log written from a setup with known terms: each row one weight version,
    its timings and token count summed over ``trigger`` trainer steps (each simulated at its own lengths: those of
    the shared MI300X run's steps), its lengths' means averaged, max and min taken over them (verl's
    ``MetricsAggregator``), ``training/global_step`` the last trainer step, and the weight push with its wait in a
    second line of the same step."""
    first = step_line(1, {"gen": 1.0, "update_actor": 9.0}, 100, 500, 5, 50) + " - training/global_step:4"
    first += " - fully_async/count/current_param_version:0"
    setup = setup_from_log(write(tmp_path / "cmd.log", f"{FULLY_ASYNC}\n{first}\n"), gpu="h100").setup()
    real = list(load_run_log(DATA / "verl_deepseek_7b_ppo_8xmi300x.csv.gz").steps)[: rows * trigger]
    logged = synthesized_log(setup, TRUTH, real).steps
    lines = [FULLY_ASYNC]
    for row in range(rows):
        group = logged[row * trigger : (row + 1) * trigger]
        version = first_version + row
        times = {stage: sum(s.stages[stage] for s in group) for stage in ("old_log_prob", "update_actor")}
        times |= {"gen": 0.5 * trigger, "step": sum(times.values()) + 0.5 * trigger}  # the wait: no generation
        mean = float(np.mean([s.response_mean for s in group]))
        high, low = max(s.response_max for s in group), min(s.response_min for s in group)
        line = step_line(version, times, mean, high, low, float(np.mean([s.prompt_mean for s in group])))
        tokens = sum(s.total_tokens for s in group)
        counts = f"training/global_step:{version * trigger} - fully_async/count/current_param_version:{version - 1}"
        lines.append(f"{line} - perf/total_num_tokens:{tokens} - {counts}")
        push = group[0].stages["weight_sync"]
        lines.append(f"step:{version} - timing_s/wait_last_valid:0.2 - timing_s/param_sync:{push}")
    return write(tmp_path / "fully_async.log", "\n".join(lines) + "\n")


def fully_async_row(version: int, update_s: float, global_step: int | None, old_log_prob: float = 3.0) -> str:
    counted = "" if global_step is None else f" - training/global_step:{global_step}"
    return (
        f"step:{version} - timing_s/gen:1 - timing_s/old_log_prob:{old_log_prob} - timing_s/update_actor:{update_s}"
        f"{counted} - fully_async/count/current_param_version:{version - 1} - response_length/mean:300"
    )


def test_a_fully_async_row_is_the_trainer_steps_between_two_weight_versions(tmp_path):
    """Row v sums the trainer steps after (v - 1) x trigger up to its training/global_step, fresh or resumed and
    whatever rows are missing (a W&B export samples rows); its push is made once; its wait is no generation."""
    log = load_run_log(fully_async_log(tmp_path, rows=3, first_version=5))
    assert log.fully_async and [s.trainer_steps for s in log.steps] == [4, 4, 4]
    assert set(log.steps[0].stages) == {"old_log_prob", "update_actor", "weight_sync"}  # gen: the wait
    assert log.steps[0].trainer_wait_s == pytest.approx(2.0)
    # rows 3 and 5 missing; the last row syncs after 2 steps (verl's final sync), then a sync after no step, whose
    # row holds the push alone (verl prints a bare step:N, then its push)
    rows = [fully_async_row(v, 9.0, 4 * v) for v in (1, 2, 4)] + [fully_async_row(6, 4.5, 22)]
    rows += ["step:7", "step:7 - timing_s/wait_last_valid:0.1 - timing_s/param_sync:2.0"]
    gaps = write(tmp_path / "gaps.log", "\n".join(rows) + "\n")
    assert [(s.step, s.trainer_steps) for s in load_run_log(gaps).steps] == [(1, 4), (2, 4), (4, 4), (6, 2)]
    # a log resumed on its last, partial row: the full rows of the run say the period
    resumed = write(tmp_path / "resumed.log", "\n".join([fully_async_row(10, 9, 40), fully_async_row(11, 4.5, 42)]))
    assert [s.trainer_steps for s in load_run_log(resumed).steps] == [4, 2]
    uncounted = write(tmp_path / "uncounted.log", gaps.read_text().replace(" - training/global_step:22", ""))
    with pytest.raises(ValueError, match="step 6: .* no training/global_step to count them"):
        load_run_log(uncounted)


def test_a_fully_async_trainer_that_took_the_rollouts_log_probs_ran_no_old_log_prob_pass(tmp_path):
    """verl's default (use_rollout_log_probs) copies the rollout's log-probs as the old ones and times the copy at
    ~1e-5 s: no pass to fit, the stage is not read (a timed one is)."""
    rows = [fully_async_row(v, 9.0, 4 * v, old_log_prob=1.2e-5) for v in (1, 2, 3)]
    copied = load_run_log(write(tmp_path / "copied.log", "\n".join(rows)))
    assert copied.stages == ["update_actor"]
    rows[1] = fully_async_row(2, 9.0, 8, old_log_prob=2.5)
    assert load_run_log(write(tmp_path / "computed.log", "\n".join(rows))).stages == ["old_log_prob", "update_actor"]


def test_the_stages_of_a_fully_async_log_are_recovered(tmp_path):
    """setup-from-log reads a trainer step's batch (ppo_mini_batch_size x require_batches; train_batch_size is 0)
    and the split; calibrated on the first 60% of rows, each row's stages (four trainer steps' worth, and one
    push) are predicted to 2%, and the push's link share recovered to 5%. The trainer's wait and step are not
    predicted: its rollouter's generation is timed nowhere in the rows."""
    path = fully_async_log(tmp_path)
    read = setup_from_log(path, gpu="h100")
    setup = read.setup()
    assert (setup.batch, setup.minibatches, setup.group_size, setup.placement.rollout_gpus) == (16, 2, 5, 2)
    fitted, report = within_run(setup, load_run_log(path))
    assert set(report["stages"]) == {"old_log_prob", "update_actor", "weight_sync"}
    for stage, errors in report["stages"].items():
        assert errors["median_abs_err"] <= 0.02, stage
    assert fitted.framework.weight_sync.gather_bandwidth_frac == pytest.approx(0.025, rel=0.05)
    assert "async_step" not in report  # not even where a row is one trainer step: its wait is the rollouter's
    (tmp_path / "one").mkdir()
    _, one = within_run(setup, load_run_log(fully_async_log(tmp_path / "one", rows=10, trigger=1)))
    assert "async_step" not in one
    # the setup setup-from-log wrote is the log's own (its batch is no contradiction of train_batch_size 0)
    toml = write(tmp_path / "setup.toml", read.toml())
    res = invoke.sim("validate-log", "--log", path, "--setup", toml, "--out", tmp_path / "v")
    assert res.returncode == 0, res.stderr
    # one trainer step's loads for a row of four would be four times too light: the fit would take them 4x slower
    assert fitted.framework.update_actor.efficiency == pytest.approx(TRUTH["update_actor"].efficiency, rel=0.1)


def test_the_setup_splits_off_the_rollout_gpus_on_the_trainers_node(tmp_path):
    """6 trainer and 2 rollout GPUs of one node (verl's scripts split a node): 8 GPUs, the first 2 generate, and
    the trainer's collectives run over the node's own link, not its network card."""
    setup = setup_from_log(one_step_off_log(tmp_path, steps=3), gpu="h100").setup()
    assert (setup.placement.actor_gpus, setup.placement.rollout_gpus, setup.cluster.gpus_per_node) == (8, 2, 8)
    assert (setup.algo, setup.group_size, setup.reference) == ("grpo", 5, False)
    costs = setup.costs("sync")
    assert costs["actor"].base.n_gpus == 6 and costs["rollout"].base.n_gpus == 2
    assert costs["actor"].collective_bytes_per_s == setup.gpu_datasheet().link_bytes_per_s


@pytest.mark.parametrize("bound", ["trainer", "generation"])
def test_the_stages_of_a_one_step_off_log_are_recovered(tmp_path, bound):
    """Calibrated on its own first 60% of steps, the rest predicted to 1%, each stage on its own GPUs (generation
    on the 2 rollout GPUs, the passes on the 6 that train, the weights pushed from one to the other); the step,
    which overlaps generation with the trainer, predicted by ``async`` with one step of lag to 5%, whether the
    trainer or generation is the longer (generation 4x slower: the push then adds to it, not hidden behind it)."""
    truth = TRUTH if bound == "trainer" else TRUTH | {"gen": StageCost(efficiency=0.1, per_token_s=8e-5)}
    path = one_step_off_log(tmp_path, truth=truth)
    setup = setup_from_log(path, gpu="h100").setup()
    log = load_run_log(path)
    fitted, report = within_run(setup, log)
    assert set(report["stages"]) == {"gen", "old_log_prob", "update_actor", "weight_sync"}
    for stage, errors in report["stages"].items():
        assert errors["median_abs_err"] <= 0.01, stage
    assert fitted.framework.gen.efficiency == pytest.approx(truth["gen"].efficiency, rel=0.05)
    assert fitted.framework.weight_sync.gather_bandwidth_frac == pytest.approx(0.025, rel=0.05)
    assert report["async_step"]["median_abs_err"] <= 0.05
    # the overlap is no rounding: the stages one after another (sync's step) would be far off the logged step
    assert report["step"]["predicted_s"] > 1.2 * report["async_step"]["measured_s"]
    generating = report["stages"]["gen"]["measured_s"] > report["stages"]["update_actor"]["measured_s"] + 1.0
    assert generating == (bound == "generation")
    if generating:  # the push after the update would hide it behind the generation still running: too short
        hidden = async_step_seconds(fitted, list(log.steps), push="after_update")[within_first(log) :]
        measured = np.array([s.async_step_s for s in log.steps])[within_first(log) :]
        assert np.median(np.abs(hidden - measured) / measured) > 0.04


def test_an_async_log_with_a_setup_that_does_not_split_its_gpus_is_refused(tmp_path):
    path = one_step_off_log(tmp_path, steps=4)
    text = setup_from_log(path, gpu="h100").toml()
    assert "rollout_gpus = 2" in text
    toml = write(tmp_path / "unsplit.toml", text.replace("rollout_gpus = 2", "rollout_gpus = 0"))
    res = invoke.sim("validate-log", "--log", path, "--setup", toml, "--out", tmp_path / "o")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "an asynchronous trainer's log" in res.stderr and "needs [placement] rollout_gpus" in res.stderr
    assert load_setup(str(toml)).placement.rollout_gpus == 0
