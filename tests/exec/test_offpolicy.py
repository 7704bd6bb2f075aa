"""Off-policy correction: behaviour log-probs recorded at sampling, and decoupled PPO (``--offpolicy decoupled``)."""

import dataclasses
import math

import pytest
import torch

from oppo.exec.algos.ppo import behaviour_weight, policy_loss
from oppo.exec.compute import update
from oppo.exec.compute.timing import Recorder
from oppo.exec.config import ExecConfig, ModelConfig, PPOConfig, default_schedule
from oppo.exec.models.roles import load_roles
from oppo.exec.step.runner import Executor


def run(policy, offpolicy="none", steps=3, capture=None, monkeypatch=None, **schedule):
    config = ExecConfig(
        schedule=default_schedule(policy=policy, batch=4, max_new_tokens=24, **schedule),
        model=ModelConfig(dtype="float64"),
        ppo=PPOConfig(offpolicy=offpolicy),
        steps=steps,
        seed=11,
    )
    if capture is not None:  # keep every step's scores as the update sees them
        step_batch = update.step_batch
        monkeypatch.setattr(
            "oppo.exec.step.runner.step_batch",
            lambda cfg, trained, data, scores, pad, eos: (
                capture.append((trained, scores)) or step_batch(cfg, trained, data, scores, pad, eos)
            ),
        )
    torch.manual_seed(config.seed)
    executor = Executor.colocated(config, load_roles(config.model), Recorder())
    return executor, [executor.step() for _ in range(steps)]


def actor_weights(executor):
    return torch.cat([p.detach().flatten() for p in executor.group.rank.roles.actor.parameters()])


def test_behaviour_log_probs_are_the_old_log_probs_of_tokens_sampled_by_the_current_weights(monkeypatch):
    """Sequences generated within the step they are trained in were sampled by the weights that score them: the
    recorded log-probs (incremental decode) equal the recomputed ones (one full forward) to float64 noise."""
    captured = []
    run("sync", capture=captured, monkeypatch=monkeypatch)
    for _, scores in captured:
        for behaviour, old in zip(scores["behaviour_logprobs"], scores["old_logprobs"]):
            assert behaviour.shape == old.shape and behaviour.dtype == torch.float64
            torch.testing.assert_close(behaviour, old.double(), rtol=0, atol=1e-9)


def test_deferred_tokens_carry_the_log_probs_of_the_older_weights(monkeypatch):
    captured = []
    run("inter", capture=captured, monkeypatch=monkeypatch, steps=4, delta="2", check_tokens=2)
    gaps = [
        float((behaviour - old.double()).abs().max())
        for trained, scores in captured
        for t, behaviour, old in zip(trained, scores["behaviour_logprobs"], scores["old_logprobs"])
        if t.deferrals > 0
    ]
    assert gaps and max(gaps) > 1e-4  # an update came between sampling and training


def test_decoupled_is_plain_ppo_on_policy_and_differs_off_policy():
    sync_none, _ = run("sync")
    sync_dec, _ = run("sync", offpolicy="decoupled")
    a, b = actor_weights(sync_none), actor_weights(sync_dec)
    assert float((a - b).abs().max()) <= 1e-9 * float(a.abs().max())  # weights of 1 up to float64 noise
    inter_none, _ = run("inter", delta="2", check_tokens=2, steps=4)
    inter_dec, _ = run("inter", offpolicy="decoupled", delta="2", check_tokens=2, steps=4)
    assert float((actor_weights(inter_none) - actor_weights(inter_dec)).abs().max()) > 1e-6


def test_a_weight_of_one_is_the_plain_loss_and_weights_are_capped_without_gradient():
    g = torch.Generator().manual_seed(0)
    logp, old, adv = (torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(3))
    mask = (torch.rand(3, 5, generator=g) > 0.3).double()
    plain, _ = policy_loss(logp, old, adv, mask, 0.2)
    weighted, _ = policy_loss(logp, old, adv, mask, 0.2, weight=torch.ones_like(logp))
    assert weighted.item() == plain.item()
    proximal = torch.tensor([[0.0, 0.0, -0.1]], dtype=torch.float64, requires_grad=True)
    w = behaviour_weight(proximal, torch.tensor([[-5.0, 0.0, 0.0]], dtype=torch.float64), cap=5.0)
    assert w[0].tolist() == pytest.approx([5.0, 1.0, 0.9048374180359595], rel=1e-12) and not w.requires_grad


def test_decoupled_gradient_by_hand():
    """Two tokens: d loss / d logp_t = -w_t A_t r_t / 2 where the ratio r_t = exp(logp_t - prox_t) is inside the
    clip range, and 0 where the clip is active on the side of the advantage."""
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    prox = torch.tensor([[-1.1, -2.5]], dtype=torch.float64)  # ratios e^0.1 = 1.105 (inside), e^0.5 (clipped)
    behav = torch.tensor([[-1.5, -2.2]], dtype=torch.float64)
    adv = torch.tensor([[2.0, 1.0]], dtype=torch.float64)
    w = behaviour_weight(prox, behav, cap=5.0)
    loss, clipped = policy_loss(logp, prox, adv, torch.ones(1, 2, dtype=torch.float64), 0.2, weight=w)
    loss.backward()
    r0 = torch.exp(torch.tensor(0.1, dtype=torch.float64))
    expected0 = -float(w[0, 0]) * 2.0 * float(r0) / 2
    assert logp.grad[0, 0].item() == pytest.approx(expected0, rel=1e-12)
    assert logp.grad[0, 1].item() == 0.0 and clipped.item() == 0.5
    assert float(w[0, 0]) == pytest.approx(math.exp(0.4), rel=1e-12)


def test_bad_offpolicy_settings_are_refused():
    with pytest.raises(ValueError, match="unknown offpolicy 'sometimes'"):
        PPOConfig(offpolicy="sometimes")
    with pytest.raises(ValueError, match="max_importance_ratio must be >= 1"):
        dataclasses.replace(PPOConfig(), max_importance_ratio=0.5)
