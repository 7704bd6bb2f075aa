"""TRL's PPOTrainer (the paper's baseline) and oppo.exec run on the same setup."""

import pytest

pytest.importorskip("trl")

from oppo.catalog.lengths import LengthTrace  # noqa: E402
from oppo.exec.baselines.trl_ppo import run_trl, trl_kl_estimator  # noqa: E402
from oppo.exec.compute.timing import Recorder  # noqa: E402
from oppo.exec.config import ExecConfig, ModelConfig, default_schedule  # noqa: E402
from oppo.exec.models.roles import load_roles  # noqa: E402
from oppo.exec.step.runner import Executor  # noqa: E402


def test_two_trl_steps_and_two_oppo_steps(monkeypatch):
    import numpy as np
    import trl.experimental.ppo as trl_ppo

    made = []  # TRL's PPOConfig as the baseline builds it
    real_config = trl_ppo.PPOConfig
    monkeypatch.setattr(trl_ppo, "PPOConfig", lambda **kw: made.append(real_config(**kw)) or made[-1])

    lengths = LengthTrace("fixed", np.array([5, 9, 30]), None)
    config = ExecConfig(
        schedule=default_schedule(policy="sync", batch=4, max_new_tokens=32),
        model=ModelConfig(preset="tiny-cpu"),
        steps=2,
    )
    trl_steps = run_trl(config, lengths)
    assert len(trl_steps) == 2
    # oppo.exec trains in float32 (on a CPU) and keeps every activation: TRL's defaults autocast and checkpoint
    assert len(made) == 1 and not made[0].bf16 and not made[0].gradient_checkpointing
    assert all(s.step_s > 0 and np.isfinite(s.mean_reward) for s in trl_steps)
    assert all(s.response_tokens in range(4 * 5, 4 * 30 + 1) for s in trl_steps)  # forced lengths: 5, 9 or 30 each
    executor = Executor.colocated(config, load_roles(config.model), Recorder(), lengths)
    for _ in range(2):
        outcome, metrics = executor.step()
        assert len(outcome.trained) == 4 and np.isfinite(metrics.mean_reward)
        assert {t.response_tokens for t in outcome.trained} <= {5, 9, 30}


@pytest.mark.parametrize(
    "options, named",
    [
        ({"clip_high": 0.28}, "clip_high"),
        ({"dual_clip": 3.0}, "dual_clip"),
        ({"kl_in": "loss"}, "kl_in loss"),
        ({"kl_estimator": "k2"}, "kl_estimator k2"),
        ({"loss_agg": "seq-mean-token-sum"}, "loss_agg"),
        ({"entropy_coef": 0.01}, "entropy_coef"),
    ],
)
def test_the_trl_baseline_refuses_options_trl_has_no_counterpart_for(options, named):
    """The baseline runs TRL's PPOTrainer as it is: an oppo.exec option it would silently drop is an error naming
    it; the KL estimators TRL has (k1, k3) pass through, and auto is TRL's default k1 (the KL in the reward)."""
    from oppo.exec.config import PPOConfig

    with pytest.raises(ValueError, match=f"no counterpart for {named}"):
        trl_kl_estimator(PPOConfig(**options))
    assert trl_kl_estimator(PPOConfig()) == "k1" and trl_kl_estimator(PPOConfig(kl_estimator="k3")) == "k3"
