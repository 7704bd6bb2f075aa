"""PPO math as pure functions (OpenRLHF section 3.3 / TRL conventions). Shapes: B rows, T response positions.

Position t of a row is the state before response token t; ``mask`` (B, T) marks the positions that count.
"""

from __future__ import annotations

import torch


def sampled_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs of the distribution the actor samples from, softmax(logits / T), over the last dimension (V).
    One definition for the sampler, the old and reference log-probs and the trainer's new log-probs: computed at
    another temperature, the PPO ratio is not 1 before an update and the KL is not 0 at the reference."""
    return torch.log_softmax(logits / temperature, dim=-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, total: float | None = None) -> torch.Tensor:
    """Mean over the masked entries. ``total``: the count to divide by instead of ``mask.sum()``: a data-parallel
    rank divides its share of a minibatch by the whole minibatch's count, so the ranks' losses sum to the mean."""
    return (x * mask).sum() / (mask.sum().clamp(min=1) if total is None else max(total, 1.0))


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries, with the unbiased variance (sum of squares / (n - 1)) as verl's
    ``masked_whiten`` and TRL's ``whiten`` have it; masked-out entries become 0. One entry whitens to 0 (verl
    raises there)."""
    n = mask.sum()
    mean = (x * mask).sum() / n.clamp(min=1)
    var = (((x - mean) ** 2) * mask).sum() / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def kl_shaped_rewards(
    score: torch.Tensor,  # (B,) sequence score, paid on the last position of scored rows
    logprobs: torch.Tensor,  # (B, T) actor log-probs of the taken tokens
    ref_logprobs: torch.Tensor,  # (B, T) reference log-probs
    mask: torch.Tensor,  # (B, T)
    kl_coef: float,
    scored: torch.Tensor,  # (B,) bool: rows that receive their score (finished, or capped, responses)
) -> torch.Tensor:
    """Per-token rewards: -kl_coef * (logp - ref_logp), plus the score on each scored row's last position."""
    rewards = -kl_coef * (logprobs - ref_logprobs) * mask
    last = (mask.cumsum(1) == mask.sum(1, keepdim=True)) & mask.bool()  # (B, T) one-hot on the last position
    return rewards + last * (score * scored)[:, None]


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


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    total: float | None = None,  # the denominator of the token mean (see masked_mean)
    weight: torch.Tensor | None = None,  # (B, T) per-token weight of the surrogate (decoupled PPO), no gradient
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate loss (to minimise) and the fraction of clipped positions.

    With ``weight`` (:func:`behaviour_weight`) this is decoupled PPO (Hilton et al. 2021; AReaL): ``old_logprobs``
    are the proximal policy's (the trainer's weights before this update), the clip keeps the update near it, and
    each token's surrogate is reweighted from the behaviour policy that sampled it to the proximal one."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip, 1 + clip)
    surrogate = torch.maximum(unclipped, clipped)
    loss = masked_mean(surrogate if weight is None else weight * surrogate, mask, total)
    return loss, masked_mean((clipped > unclipped).float(), mask, total)


def behaviour_weight(proximal: torch.Tensor, behaviour: torch.Tensor, cap: float) -> torch.Tensor:
    """pi_prox / pi_behav per token, at most ``cap`` (truncated importance sampling: a token sampled by much older
    weights cannot dominate the update; AReaL instead drops tokens over its cap), without gradient. (B, T)."""
    return torch.exp(proximal - behaviour).clamp(max=cap).detach()


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    total: float | None = None,  # the denominator of the token mean (see masked_mean)
) -> torch.Tensor:
    """Clipped value loss: 0.5 * max((v - R)^2, (clip(v, old ± clip) - R)^2)."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * masked_mean(torch.maximum((values - returns) ** 2, (clipped - returns) ** 2), mask, total)


def group_advantages(score: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: each sample's score relative to its prompt group, (r - mean_g) / (std_g + eps). (B,) -> (B,).

    std_g is the sample standard deviation (divided by n - 1), as ``torch.std`` computes it in TRL's and verl's
    GRPO. A group whose samples all scored alike, or a group of one, carries no signal: its advantages are 0."""
    _, group = torch.unique(group_ids, return_inverse=True)  # (B,) group index 0..G-1
    count = torch.zeros(int(group.max()) + 1, dtype=score.dtype).index_add_(0, group, torch.ones_like(score))
    mean = torch.zeros_like(count).index_add_(0, group, score) / count
    squares = torch.zeros_like(count).index_add_(0, group, (score - mean[group]) ** 2)
    std = (squares / (count - 1).clamp(min=1)).sqrt()
    return (score - mean[group]) / (std[group] + eps)


def kl_k3(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, total: float | None = None
) -> torch.Tensor:
    """The k3 estimator of KL(pi || ref) per token, exp(d) - d - 1 with d = ref_logp - logp (>= 0, unbiased):
    the KL term of the GRPO loss. Masked mean, a scalar. The order matters: ``logprobs`` are the policy's, of
    tokens it sampled; swapped, the mean estimates E_pi[pi / ref] - 1 - KL(pi || ref) instead."""
    d = ref_logprobs - logprobs
    return masked_mean(torch.exp(d) - d - 1, mask, total)
