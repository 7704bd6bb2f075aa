"""PPO math as pure functions (OpenRLHF section 3.3 / TRL conventions). Shapes: B rows, T response positions.

Position t of a row is the state before response token t; ``mask`` (B, T) marks the positions that count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oppo.exec.config import KL_ESTIMATORS, LOSS_AGGS


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
    estimator: str = "k1",
    clamp: float = 0.0,
) -> torch.Tensor:
    """Per-token rewards: -kl_coef * KL estimate (:func:`kl_estimate`; k1 is logp - ref_logp), plus the score on
    each scored row's last position."""
    rewards = -kl_coef * kl_estimate(logprobs, ref_logprobs, estimator, clamp) * mask
    last = (mask.cumsum(1) == mask.sum(1, keepdim=True)) & mask.bool()  # (B, T) one-hot on the last position
    return rewards + last * (score * scored)[:, None]


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str, clamp: float = 0.0) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from the log-probs of tokens pi sampled, (B, T), with d = logp - ref_logp:
    k1 = d (unbiased, may be negative), k2 = d^2 / 2, k3 = exp(-d) + d - 1 (unbiased, >= 0, low variance), abs =
    |d|. ``clamp`` > 0 bounds each estimate to [-clamp, clamp] (verl clamps k3 at 10; 0: no bound)."""
    d = logprobs - ref_logprobs
    if estimator == "k1":
        kl = d
    elif estimator == "k2":
        kl = 0.5 * d**2
    elif estimator == "k3":
        kl = torch.exp(-d) + d - 1
    elif estimator == "abs":
        kl = d.abs()
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose from {', '.join(KL_ESTIMATORS)}")
    return kl.clamp(-clamp, clamp) if clamp > 0 else kl


@dataclass(frozen=True)
class Aggregate:
    """How a per-token loss (B, T) becomes a scalar (verl's ``loss_agg_mode``), with denominators counted over a
    whole minibatch, so that the data-parallel ranks' terms sum to the loss one rank takes alone.

    - ``token-mean``: sum over tokens / ``tokens``;
    - ``seq-mean-token-mean``: each row's token mean, summed / ``rows``;
    - ``seq-mean-token-sum``: each row's token sum, summed / ``rows``;
    - ``seq-mean-token-sum-norm``: the token sums, summed / ``norm`` (Dr. GRPO: a constant, here the response cap;
      verl's default is the batch's padded width, which changes with how rows are batched)."""

    mode: str = "token-mean"
    tokens: float | None = None  # masked tokens of the minibatch (None: of this batch)
    rows: float | None = None  # rows with a masked token in the minibatch (None: of this batch)
    norm: float | None = None  # seq-mean-token-sum-norm's divisor (None: this batch's width T)

    def __post_init__(self) -> None:
        if self.mode not in LOSS_AGGS:
            raise ValueError(f"unknown loss aggregation {self.mode!r}; choose from {', '.join(LOSS_AGGS)}")

    def __call__(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.mode == "token-mean":
            return masked_mean(x, mask, self.tokens)
        per_row = (x * mask).sum(-1)  # (B,)
        if self.mode == "seq-mean-token-sum-norm":
            return per_row.sum() / (self.norm or mask.shape[-1])
        if self.mode == "seq-mean-token-mean":
            per_row = per_row / mask.sum(-1).clamp(min=1)
        rows = float((mask.sum(-1) > 0).sum()) if self.rows is None else self.rows
        return per_row.sum() / max(rows, 1.0)


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


def group_advantages(
    score: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """GRPO: each sample's score relative to its prompt group, (r - mean_g) / (std_g + eps). (B,) -> (B,).

    std_g is the sample standard deviation (divided by n - 1), as ``torch.std`` computes it in TRL's and verl's
    GRPO. A group whose samples all scored alike, or a group of one, carries no signal: its advantages are 0.
    ``norm_by_std`` False (Dr. GRPO; verl's ``norm_adv_by_std_in_grpo``) leaves r - mean_g undivided."""
    _, group = torch.unique(group_ids, return_inverse=True)  # (B,) group index 0..G-1
    count = torch.zeros(int(group.max()) + 1, dtype=score.dtype).index_add_(0, group, torch.ones_like(score))
    mean = torch.zeros_like(count).index_add_(0, group, score) / count
    if not norm_by_std:
        return score - mean[group]
    squares = torch.zeros_like(count).index_add_(0, group, (score - mean[group]) ** 2)
    std = (squares / (count - 1).clamp(min=1)).sqrt()
    return (score - mean[group]) / (std[group] + eps)


def entropy(logprobs: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the distributions whose log-probs over the last dimension are given (the sampled one:
    :func:`sampled_logprobs`): (..., V) -> (...)."""
    return -(logprobs.exp() * logprobs).sum(-1)


def kl_k3(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, total: float | None = None
) -> torch.Tensor:
    """The k3 estimator of KL(pi || ref) per token, exp(d) - d - 1 with d = ref_logp - logp (>= 0, unbiased):
    the KL term of the GRPO loss. Masked mean, a scalar. The order matters: ``logprobs`` are the policy's, of
    tokens it sampled; swapped, the mean estimates E_pi[pi / ref] - 1 - KL(pi || ref) instead."""
    return masked_mean(kl_estimate(logprobs, ref_logprobs, "k3"), mask, total)
