"""Advantage estimators, a registry (verl's ``adv_estimator``): GAE and T-PPO's EGAE from token rewards and a
critic's values, GRPO's and Dr. GRPO's group-relative advantages from sequence scores.

As in verl, the two kinds take different inputs: a critic's estimator maps (rewards, values, mask, finished, gamma,
lam), all (B, T) but ``finished`` (B,) bool, to (advantages, returns), both (B, T); a group-relative one maps
(score, group ids), both (B,), to advantages (B,). The run's options select one (:func:`select`): ``--algo``, a
truncating policy (``--policy tppo``) and ``--no-norm-adv-by-std``.
"""

from __future__ import annotations

import torch

from oppo.exec.algos.registry import Registry

ADVANTAGE_ESTIMATORS = Registry("advantage estimator", verl="`adv_estimator`", trl="GRPOTrainer `scale_rewards`")


def select(algo: str, truncated: bool, norm_by_std: bool) -> str:
    """The estimator the options select: GRPO's group-relative advantages (Dr. GRPO without the std), else GAE,
    EGAE where a policy trains truncated segments (T-PPO).

    >>> select("ppo", False, True), select("ppo", True, True), select("grpo", False, True), select("grpo", False, False)
    ('gae', 'egae', 'grpo', 'dr-grpo')
    """
    if algo == "grpo":
        return "grpo" if norm_by_std else "dr-grpo"
    return "egae" if truncated else "gae"


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries, with the unbiased variance (sum of squares / (n - 1)) as verl's
    ``masked_whiten`` and TRL's ``whiten`` have it; masked-out entries become 0. One entry whitens to 0 (verl
    raises there)."""
    n = mask.sum()
    mean = (x * mask).sum() / n.clamp(min=1)
    var = (((x - mean) ** 2) * mask).sum() / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def gae(
    rewards: torch.Tensor,  # (B, T)
    values: torch.Tensor,  # (B, T)
    mask: torch.Tensor,  # (B, T), contiguous run of ones per row
    gamma: float,
    lam: float,
    bootstrap: torch.Tensor | None = None,  # (B,) bool: EGAE, V(s_l) = V(s_{l-1}) after the last position
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation. Returns (advantages, returns), both (B, T), zero where masked.

    Without ``bootstrap`` the state after a row's last position is terminal (value 0). T-PPO's EGAE treats a
    truncated row's next state as worth its last value (``bootstrap`` rows).

    Three tokens, the score 1 on the last, values 0.5, 0.6, 0.8, gamma 1, lambda 0.5: the TD errors are
    0.6 - 0.5 = 0.1, 0.8 - 0.6 = 0.2 and 1 - 0.8 = 0.2, so A = 0.1 + 0.5 (0.2 + 0.5 x 0.2) = 0.25, 0.3, 0.2 and
    the returns A + V = 0.75, 0.9, 1.0. Bootstrapped (EGAE), the last TD error is 1 + 0.8 - 0.8 = 1:

    >>> import torch
    >>> r = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    >>> v, mask = torch.tensor([[0.5, 0.6, 0.8]], dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64)
    >>> [x.round(decimals=6).tolist() for x in gae(r, v, mask, gamma=1.0, lam=0.5)]
    [[[0.25, 0.3, 0.2]], [[0.75, 0.9, 1.0]]]
    >>> gae(r, v, mask, 1.0, 0.5, bootstrap=torch.tensor([True]))[0].round(decimals=6).tolist()
    [[0.45, 0.7, 1.0]]
    """
    t = rewards.shape[1]
    boot = torch.zeros_like(mask, dtype=torch.bool)[:, 0] if bootstrap is None else bootstrap
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    for i in reversed(range(t)):
        valid = mask[:, i].bool()
        last = valid & (~mask[:, i + 1].bool() if i + 1 < t else torch.ones_like(valid))
        value = values[:, i]
        next_value = torch.where(last, torch.where(boot, value, torch.zeros_like(value)), next_value)
        next_adv = torch.where(last, torch.zeros_like(next_adv), next_adv)
        delta = rewards[:, i] + gamma * next_value - value
        advantages[:, i] = (delta + gamma * lam * next_adv) * valid
        next_value, next_adv = value * valid, advantages[:, i]
    return advantages, (advantages + values) * mask


def group_advantages(
    score: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """GRPO: each sample's score relative to its prompt group, (r - mean_g) / (std_g + eps). (B,) -> (B,).

    std_g is the sample standard deviation (divided by n - 1), as ``torch.std`` computes it in TRL's and verl's
    GRPO. A group whose samples all scored alike, or a group of one, carries no signal: its advantages are 0.
    ``norm_by_std`` False (Dr. GRPO; verl's ``norm_adv_by_std_in_grpo``) leaves r - mean_g undivided.

    A group of 3 scored 1, 0, 0: mean 1/3, std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3), so the advantages are
    (2/3) / sqrt(1/3) = 1.155 and -(1/3) / sqrt(1/3) = -0.577 (Dr. GRPO: 2/3 and -1/3):

    >>> import torch
    >>> score, groups = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), torch.tensor([7, 7, 7])
    >>> group_advantages(score, groups).round(decimals=3).tolist()
    [1.155, -0.577, -0.577]
    >>> group_advantages(score, groups, norm_by_std=False).round(decimals=4).tolist()
    [0.6667, -0.3333, -0.3333]
    """
    _, group = torch.unique(group_ids, return_inverse=True)  # (B,) group index 0..G-1
    count = torch.zeros(int(group.max()) + 1, dtype=score.dtype).index_add_(0, group, torch.ones_like(score))
    mean = torch.zeros_like(count).index_add_(0, group, score) / count
    if not norm_by_std:
        return score - mean[group]
    squares = torch.zeros_like(count).index_add_(0, group, (score - mean[group]) ** 2)
    std = (squares / (count - 1).clamp(min=1)).sqrt()
    return (score - mean[group]) / (std[group] + eps)


# -- the registered estimators -------------------------------------------------------------------------------


@ADVANTAGE_ESTIMATORS.register("gae", verl="gae")
def terminal_gae(rewards, values, mask, finished, gamma, lam) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (PPO): the state after a row's last position is terminal (TRL's PPOTrainer, its only estimator)."""
    return gae(rewards, values, mask, gamma, lam)


@ADVANTAGE_ESTIMATORS.register("egae")
def egae(rewards, values, mask, finished, gamma, lam) -> tuple[torch.Tensor, torch.Tensor]:
    """T-PPO's EGAE: GAE where an unfinished row's next state is worth its last value, V(s_l) = V(s_{l-1})."""
    return gae(rewards, values, mask, gamma, lam, ~finished)


@ADVANTAGE_ESTIMATORS.register("grpo", verl="grpo", trl="group")
def grpo(score, groups) -> torch.Tensor:
    """GRPO: (r - mean_g) / (std_g + eps) over each prompt group, std_g the sample standard deviation."""
    return group_advantages(score, groups)


@ADVANTAGE_ESTIMATORS.register("dr-grpo", verl="grpo", trl="none")
def dr_grpo(score, groups) -> torch.Tensor:
    """Dr. GRPO: r - mean_g, not divided by the group's std (verl's `grpo` with `norm_adv_by_std_in_grpo` off)."""
    return group_advantages(score, groups, norm_by_std=False)
