"""``plan --knobs framework``: the rollout engine's tensor-parallel size and memory share and the update's
micro-batch searched beside the schedule, screened for memory, the best written as verl overrides."""

import csv
import dataclasses

import pytest

from oppo.sim.cost.engine import model_shape
from oppo.sim.setup.toml_file import load_setup
from oppo.sim.study.knobs import activation_bytes, colocated_bytes, framework_grid, verl_overrides, with_framework_knobs
from oppo.sim.study.plan import Candidate, Space, candidates, fits_memory, sim_config
from tests import invoke


def test_the_grid_holds_tensor_parallel_sizes_that_divide_the_gpus_and_the_heads():
    """deepseek-llm-7b (32 heads, 32 KV heads) on 8 MI300X: TP 1, 2, 4, 8; Gemma-2 2B (8 heads, 4 KV heads) on 2
    GPUs: TP 1, 2; five memory shares where the setup bounds the engine; the micro-batch halved, kept, doubled."""
    grid = framework_grid(load_setup("verl-deepseek-llm-7b-ppo-8xmi300x"))
    assert sorted({g["rollout_tp"] for g in grid}) == [1, 2, 4, 8]
    assert sorted({g["micro_batch"] for g in grid}) == [8, 16, 32]
    assert sorted({g["memory_fraction"] for g in grid}) == [0.4, 0.5, 0.6, 0.7, 0.8]
    assert len(grid) == 4 * 5 * 3
    gemma = framework_grid(load_setup("verl-gemma-2-2b-gsm8k"))
    assert sorted({g["rollout_tp"] for g in gemma}) == [1, 2] and sorted({g["micro_batch"] for g in gemma}) == [1, 2, 4]
    # an async split of 3 rollout GPUs holds engines of 1 or 3 GPUs only (3 does not divide 32 heads: 1)
    assert {g["rollout_tp"] for g in framework_grid(load_setup("verl-deepseek-llm-7b-ppo-8xmi300x"), 3)} == {1}


def test_a_micro_batch_knob_scales_the_scoring_and_critic_micro_batches_alike():
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")  # update 16, critic 32, forward 32
    fw = with_framework_knobs(setup, 2, 0.6, 8).framework
    assert (fw.rollout_tensor_parallel, fw.rollout_memory_fraction) == (2, 0.6)
    assert (fw.train_micro_batch, fw.critic_train_micro_batch, fw.forward_micro_batch) == (8, 16, 16)
    assert with_framework_knobs(setup, None, None, None) is setup
    qwen = load_setup("verl-qwen2.5-0.5b-gsm8k")  # update 2, forward 4, the critic's values pass 2
    fw = with_framework_knobs(qwen, None, None, 8).framework
    assert (fw.train_micro_batch, fw.forward_micro_batch, fw.critic_forward_micro_batch) == (8, 16, 8)
    chosen = with_framework_knobs(qwen, None, None, 8)
    assert "critic.forward_micro_batch_size_per_gpu=8" in verl_overrides(qwen, chosen, "sync")


def test_the_hybrid_engine_memory_is_the_training_states_beside_vllms_share():
    """verl's colocated engine. vLLM's sleep mode takes its share of the GPU beside the trained models' states;
    verl's vLLM 0.6 (re-initialised cache) took its share of the memory left free after them and its weights. While
    the models train: a micro-batch's activations beside the engine's weights (sleep mode frees those too)."""
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")  # reinit, 40% of 192 GB
    schedule = setup.schedule(policy="sync")
    model, gpu = model_shape(setup.actor), setup.gpu_datasheet()
    training, weights, activations = 123e9, model.weight_bytes / 4, activation_bytes(setup, schedule)
    free = gpu.memory_bytes - training - weights
    assert colocated_bytes(setup, schedule, training) == pytest.approx(
        max(training + weights + 0.4 * free, training + activations + weights), rel=1e-12
    )
    sleep = with_kv_reset(setup, "sleep")
    assert colocated_bytes(sleep, schedule, training) == pytest.approx(
        max(training + 0.4 * gpu.memory_bytes, training + activations), rel=1e-12
    )
    tokens = 16 * (setup.lengths.prompt_tokens + setup.max_new_tokens)  # gradient checkpointing: inputs kept
    per_token = model.layers * 2 * model.hidden + 34 * model.hidden + 8 * model.vocab
    assert activations == pytest.approx(tokens * per_token, rel=1e-12)


def with_kv_reset(setup, reset: str):
    return dataclasses.replace(setup, framework=dataclasses.replace(setup.framework, kv_cache_reset=reset))


def test_a_memory_share_that_leaves_no_room_for_the_trained_states_is_screened_out():
    """deepseek 7B PPO on 8 MI300X under vLLM's sleep mode: the actor and critic trained whole (16 bytes a
    parameter) and the reference's weights, 29 GB a GPU, beside 60% of 192 GB fit the 90% budget, beside 80% not."""
    setup = with_kv_reset(load_setup("verl-deepseek-llm-7b-ppo-8xmi300x"), "sleep")
    setup = dataclasses.replace(setup, framework=dataclasses.replace(setup.framework, offload=()))
    fits = {
        f: fits_memory(sim_config(with_framework_knobs(setup, None, f, None), Candidate("sync"), {}, 1, 0))
        for f in (0.6, 0.8)
    }
    assert fits == {0.6: True, 0.8: False}


def test_the_framework_space_crosses_every_policy_configuration_with_the_grid():
    setup = load_setup("verl-gemma-2-2b-gsm8k")
    plain = candidates(setup, Space(("sync", "async")))
    crossed = candidates(setup, Space(("sync", "async"), framework=True))
    async_splits = [c for c in plain if c.policy == "async"]
    assert len(crossed) == len(framework_grid(setup)) + sum(
        len(framework_grid(setup, c.rollout_gpus)) for c in async_splits
    )


def test_overrides_name_each_changed_knob_in_verls_keys():
    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    chosen = with_framework_knobs(setup, 2, 0.6, 32)
    assert verl_overrides(setup, chosen, "sync") == [
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.actor.ppo_micro_batch_size=null",  # verl refuses a global and a per-GPU size together
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size=null",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.ref.log_prob_micro_batch_size=null",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64",
        "critic.ppo_micro_batch_size=null",
        "critic.ppo_micro_batch_size_per_gpu=64",
        "critic.forward_micro_batch_size=null",  # the values pass, as the simulator prices it
        "critic.forward_micro_batch_size_per_gpu=64",
    ]
    assert verl_overrides(setup, setup, "sync") == []  # the run's own knobs: nothing to change
    split = dataclasses.replace(chosen, placement=dataclasses.replace(chosen.placement, rollout_gpus=2))
    assert verl_overrides(setup, split, "async")[-2:] == ["trainer.n_gpus_per_node=6", "rollout.n_gpus_per_node=2"]


def test_plan_with_framework_knobs_writes_the_best_ones_as_verl_overrides(tmp_path):
    out = tmp_path / "plan"
    args = ("--setup", "verl-gemma-2-2b-gsm8k", "--lengths", "gsm8k", "--policies", "sync", "--knobs", "framework")
    res = invoke.sim(
        "plan",
        *args,
        "--budget",
        "40",
        "--rung-steps",
        "2,3",
        "--rung-seeds",
        "1,1",
        "--fresh-seeds",
        "0",
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr
    with open(out / "plan.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    last = max(r["rung"] for r in rows)  # the best is chosen among the last rung's searched configurations
    best = max(
        (r for r in rows if r["rung"] == last and r["searched"] == "True"), key=lambda r: float(r["samples_per_s"])
    )
    setup = load_setup("verl-gemma-2-2b-gsm8k")
    chosen = with_framework_knobs(
        setup, int(best["rollout_tp"]), float(best["memory_fraction"]), int(best["micro_batch"])
    )
    written = (out / "best" / "verl_overrides.txt").read_text().splitlines()
    assert written == verl_overrides(setup, chosen, "sync")
    assert all(
        line.count("=") == 1 and line.split("=")[0].startswith(("actor_rollout_ref.", "critic.")) for line in written
    )
    assert {r["rollout_tp"] for r in rows if r["searched"] == "True"} <= {"1", "2"}  # baselines: the setup's


def test_schedule_only_plans_write_no_overrides(tmp_path):
    args = ("--setup", "tiny-cpu", "--policies", "sync", "--budget", "4", "--rung-steps", "2", "--rung-seeds", "1")
    res = invoke.sim("plan", *args, "--fresh-seeds", "0", "--out", tmp_path / "p")
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "p" / "best" / "verl_overrides.txt").exists()


def test_the_memory_screen_keeps_an_offloaded_optimizers_moments_off_the_gpus():
    """An FSDP trainer whose optimizer is on the host holds 8 bytes a parameter fewer on each GPU (Adam's two fp32
    moments, sharded over the GPUs); an unsharded setup holds the whole of its states on each GPU."""
    from oppo.sim.cost.engine import model_shape
    from oppo.sim.study.knobs import training_bytes

    setup = load_setup("verl-deepseek-llm-7b-ppo-8xmi300x")
    params, gpus = model_shape(setup.actor).params, 8
    held = training_bytes(setup, ["actor", "critic"], gpus)
    fw = dataclasses.replace(setup.framework, optimizer_offload=("actor", "critic"))
    lighter = training_bytes(dataclasses.replace(setup, framework=fw), ["actor", "critic"], gpus)
    assert held - lighter == pytest.approx(2 * 8 * params / gpus, rel=1e-9)
    whole = dataclasses.replace(setup, framework=dataclasses.replace(setup.framework, sharded=False))
    assert training_bytes(whole, ["actor", "critic"], gpus) == pytest.approx(gpus * held, rel=1e-9)
