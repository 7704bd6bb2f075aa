"""The clipped PPO losses as pure functions (OpenRLHF section 3.3 / TRL conventions), and the step's RL math by
family: advantages (:mod:`~oppo.exec.algos.advantages`), KL estimators (:mod:`~oppo.exec.algos.kl`) and loss
aggregations (:mod:`~oppo.exec.algos.aggregation`), each a registry of its variants, re-exported here. Shapes: B rows,
T response positions.

Position t of a row is the state before response token t; ``mask`` (B, T) marks the positions that count.
"""

from __future__ import annotations

import torch

from oppo.exec.algos.advantages import gae, group_advantages, masked_whiten
from oppo.exec.algos.aggregation import Aggregate, masked_mean
from oppo.exec.algos.kl import kl_estimate, kl_k3, kl_shaped_rewards

__all__ = [
    "Aggregate",
    "behaviour_weight",
    "entropy",
    "gae",
    "group_advantages",
    "kl_estimate",
    "kl_k3",
    "kl_shaped_rewards",
    "masked_mean",
    "masked_whiten",
    "policy_loss",
    "rollout_is_weight",
    "sampled_logprobs",
    "value_loss",
]


def sampled_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs of the distribution the actor samples from, softmax(logits / T), over the last dimension (V).
    One definition for the sampler, the old and reference log-probs and the trainer's new log-probs: computed at
    another temperature, the PPO ratio is not 1 before an update and the KL is not 0 at the reference."""
    return torch.log_softmax(logits / temperature, dim=-1)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    agg: Aggregate = Aggregate(),  # noqa: B008 (frozen)
    weight: torch.Tensor | None = None,  # (B, T) per-token weight of the surrogate (decoupled PPO), no gradient
    clip_high: float | None = None,
    dual_clip: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate loss (to minimise) and the fraction of clipped positions (a token mean).

    The ratio is clipped to [1 - ``clip``, 1 + ``clip_high``] (clip-higher: DAPO, verl's ``clip_ratio_low/high``,
    TRL's ``epsilon_high``; None: symmetric). ``dual_clip`` C > 1 (Ye et al. 2020, verl's ``clip_ratio_c``) also
    bounds the loss of a negative-advantage token by -A * C, so a huge ratio cannot dominate; 0: off.

    With ``weight`` (:func:`behaviour_weight`) this is decoupled PPO (Hilton et al. 2021; AReaL): ``old_logprobs``
    are the proximal policy's (the trainer's weights before this update), the clip keeps the update near it, and
    each token's surrogate is reweighted from the behaviour policy that sampled it to the proximal one."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip, 1 + (clip if clip_high is None else clip_high))
    surrogate = torch.maximum(unclipped, clipped)
    if dual_clip > 0:
        surrogate = torch.where(advantages < 0, torch.minimum(surrogate, -advantages * dual_clip), surrogate)
    loss = agg(surrogate if weight is None else weight * surrogate, mask)
    return loss, masked_mean((clipped > unclipped).float(), mask, agg.tokens)


def behaviour_weight(proximal: torch.Tensor, behaviour: torch.Tensor, cap: float) -> torch.Tensor:
    """pi_prox / pi_behav per token, at most ``cap`` (truncated importance sampling: a token sampled by much older
    weights cannot dominate the update; AReaL instead drops tokens over its cap), without gradient. (B, T)."""
    return torch.exp(proximal - behaviour).clamp(max=cap).detach()


def rollout_is_weight(
    trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, level: str, cap: float
) -> torch.Tensor:
    """Truncated importance weights from the rollout engine's distribution to the trainer's, without gradient. (B, T).

    The engine samples with its own kernels (another attention, another matmul order, its own precision), so its
    probabilities differ from the trainer's for the same weights and tokens; the surrogate is reweighted by
    p_trainer / p_engine, truncated at ``cap`` (verl's rollout correction, TRL's
    ``vllm_importance_sampling_correction``).
    ``level``: ``token`` (each token's own ratio) or ``sequence`` (the product over the sample's masked tokens, one
    weight for all of them). ``mask``: the response tokens (B, T)."""
    log_ratio = (trainer - engine) * mask
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(trainer)
    return torch.exp(log_ratio).clamp(max=cap).detach()


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    agg: Aggregate = Aggregate(),  # noqa: B008 (frozen)
) -> torch.Tensor:
    """Clipped value loss: 0.5 * max((v - R)^2, (clip(v, old ± clip) - R)^2), aggregated by ``agg``."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * agg(torch.maximum((values - returns) ** 2, (clipped - returns) ** 2), mask)


def entropy(logprobs: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the distributions whose log-probs over the last dimension are given (the sampled one:
    :func:`sampled_logprobs`): (..., V) -> (...)."""
    return -(logprobs.exp() * logprobs).sum(-1)
