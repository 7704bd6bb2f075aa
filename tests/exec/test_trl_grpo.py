"""TRL 1.12's GRPOTrainer set as an oppo GRPO run is: the option mapping of oppo.exec.baselines.trl_grpo."""

import pytest

from oppo.exec.config import ExecConfig, PPOConfig, TaskConfig, default_schedule

pytest.importorskip("trl")

from oppo.exec.baselines.trl_grpo import grpo_args  # noqa: E402


def config(**ppo) -> ExecConfig:
    schedule = default_schedule(policy="sync", algo="grpo", group_size=4, batch=3, max_new_tokens=32)
    return ExecConfig(schedule=schedule, ppo=PPOConfig(**ppo), steps=5, task=TaskConfig())


def test_one_oppo_step_is_one_trl_generation_of_epochs_x_minibatches_updates(tmp_path):
    args = grpo_args(config(epochs=2, minibatches=3, clip_high=0.28, mask_truncated=True, lr=2e-6), str(tmp_path))
    assert args.num_generations == 4 and args.max_completion_length == 32
    assert args.per_device_train_batch_size * args.steps_per_generation == 12  # 3 prompts x 4 samples a step
    assert (args.steps_per_generation, args.num_iterations) == (3, 2)
    assert args.max_steps == 5 * 2 * 3  # TRL counts optimizer steps
    assert args.loss_type == "bnpo"  # token-mean over each minibatch, as oppo's
    assert (args.epsilon, args.epsilon_high, args.beta, args.scale_rewards) == (0.2, 0.28, 0.05, "group")
    assert args.mask_truncated_completions and args.learning_rate == 2e-6 and args.lr_scheduler_type == "constant"
    # oppo.exec trains in float32 and keeps every activation; TRL's defaults autocast to bfloat16 and checkpoint
    assert not args.bf16 and not args.gradient_checkpointing


@pytest.mark.parametrize(
    ("ppo", "named"),
    [({"loss_agg": "seq-mean-token-sum"}, "loss_agg"), ({"kl_clamp": 10.0}, "kl_clamp"), ({"dual_clip": 3.0}, "dual")],
)
def test_options_trl_has_no_counterpart_for_are_refused(tmp_path, ppo, named):
    with pytest.raises(ValueError, match=f"no counterpart for .*{named}"):
        grpo_args(config(**ppo), str(tmp_path))


def test_the_clock_records_one_point_per_generation_with_its_reward():
    """6 optimizer steps per generation (epochs 2 x minibatches 3): TRL logs a generation's reward with its first
    step, and oppo's point for it is recorded after its last."""
    from types import SimpleNamespace

    from oppo.exec.baselines.trl_grpo import _Clock

    clock = _Clock(held=None, eval_every=0, updates=6, progress=None)
    clock.start()
    for global_step in range(1, 13):  # two generations
        state = SimpleNamespace(global_step=global_step)
        clock.on_step_end(None, state, None)
        logs = {"loss": 0.1} | ({"reward": 0.25 * global_step} if global_step % 6 == 1 else {})
        clock.on_log(None, state, None, logs=logs)
    assert [p.step for p in clock.points] == [0, 1, 2]
    assert [p.mean_reward for p in clock.points[1:]] == [0.25, 1.75]  # logged at global steps 1 and 7
