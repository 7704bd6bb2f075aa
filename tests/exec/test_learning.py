"""Training learns: PPO and GRPO on tiny-cpu raise the reward while staying near the reference (fixed seed).

Three measures, each the mean of the last 10 steps against the first 10, each with a stated margin:

- ``reward``: the learned reward model's score, what the policy is trained on (margin +1.0; the runs here rise by
  +3.4 (PPO) and +1.6 (GRPO));
- ``rule``: the task's ground-truth score, the fraction of target tokens (margin +0.05 from about 0.25; the runs
  here: +0.38 and +0.15): a policy that fools the reward model does not pass (one-token answers score about -2.1,
  random ones about -3);
- ``return``: the KL-regularised return, score - kl_coef * sum over the response of log(pi / pi_ref), the objective
  both algorithms maximise (margin +0.5; the runs here: +2.75 and +1.20).

Why ``kl_coef`` is raised from the default 0.05: with a wrong KL sign the policy is *paid* for leaving the
reference. On this task that does not hold the reward back (being surer of what it samples costs it nothing), so at
0.05 a flipped sign learns the reward faster than the right one and no reward test can see it. With a coefficient
that matters, the flipped sign drives the policy far from the reference. Under PPO (KL in the per-token reward, 0.2
here) responses grow towards the token cap (41 of 48 tokens) and the regularised return falls (seed 0: -3.24 ->
-3.84; the right sign: -3.25 -> -0.50). Under GRPO (KL term in the loss, 0.3 here) the policy collapses onto
near-empty responses: the reward model's score still rises, but the rule score falls (0.27 -> 0.18; the right sign:
0.27 -> 0.42).

Swapping ``kl_k3``'s arguments gives another penalty that also pulls towards the reference (the two agree to
second order near it), and the runs it gives stay within the seed-to-seed spread of the right one: its check is
in tests/exec/test_ppo.py (the formula, and what each argument order estimates).
"""

import torch

from oppo.exec.compute.timing import Recorder
from oppo.exec.config import ExecConfig, ModelConfig, PPOConfig, default_schedule
from oppo.exec.models.roles import load_roles
from oppo.exec.step.runner import Executor

STEPS = 60  # a test takes about 5 s on 2 idle CPU cores, 20 s on a loaded one


def train(kl_coef: float, **schedule) -> dict[str, tuple[float, float]]:
    """A tiny-cpu run of ``STEPS`` steps, seed 0, float32; the mean of each measure over its first and last 10."""
    config = ExecConfig(
        schedule=default_schedule(policy="sync", max_new_tokens=48, **schedule),
        model=ModelConfig(dtype="float32"),
        ppo=PPOConfig(kl_coef=kl_coef),
        steps=STEPS,
        seed=0,
    )
    torch.manual_seed(config.seed)
    executor = Executor.colocated(config, load_roles(config.model), Recorder())
    metrics = [executor.step()[1] for _ in range(STEPS)]
    series = {
        "reward": [m.mean_reward for m in metrics],
        "rule": [m.rule_score for m in metrics],
        "return": [m.mean_reward - kl_coef * m.kl * m.response_len for m in metrics],
    }
    means = {name: (sum(v[:10]) / 10, sum(v[-10:]) / 10) for name, v in series.items()}
    print({name: f"{a:.3f} -> {b:.3f}" for name, (a, b) in means.items()})
    return means


MARGINS = {"reward": 1.0, "rule": 0.05, "return": 0.5}


def assert_learns(means: dict[str, tuple[float, float]]) -> None:
    for name, margin in MARGINS.items():
        first, last = means[name]
        assert last > first + margin, f"{name}: first 10 steps {first:.3f}, last 10 {last:.3f}, margin {margin}"


def test_ppo_learns_near_the_reference():
    """PPO, the KL penalty in the per-token reward at kl_coef 0.2, B = 8."""
    assert_learns(train(0.2, batch=8))


def test_grpo_learns_near_the_reference():
    """GRPO, the k3 KL term in the loss at kl_coef 0.3, 4 groups of 4 samples."""
    assert_learns(train(0.3, batch=4, algo="grpo", group_size=4))
