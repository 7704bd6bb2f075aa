"""Per-token estimators of KL(pi || ref) (Schulman, "Approximating KL divergence"), a registry, and the two places a
KL estimate goes: the reward (:func:`kl_shaped_rewards`) or the loss (GRPO's :func:`kl_k3`).

Each estimator maps d = logp - ref_logp, the log-ratio of tokens pi sampled, (B, T), to its estimate. Torch-free
(tensor methods only): :mod:`oppo.exec.config` reads :data:`KL_ESTIMATORS`' names without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oppo.exec.algos.aggregation import masked_mean
from oppo.exec.algos.registry import Registry

if TYPE_CHECKING:
    import torch

KL_ESTIMATORS = Registry("KL estimator", verl="`kl_loss_type` / `kl_penalty`", trl="PPOTrainer `kl_estimator`")


@KL_ESTIMATORS.register("k1", verl="kl", trl="k1")
def k1(d: torch.Tensor) -> torch.Tensor:
    """d: unbiased, may be negative.

    >>> import torch
    >>> k1(torch.tensor([0.5, -1.0], dtype=torch.float64)).tolist()
    [0.5, -1.0]
    """
    return d


@KL_ESTIMATORS.register("k2", verl="mse")
def k2(d: torch.Tensor) -> torch.Tensor:
    """d^2 / 2: >= 0, biased.

    >>> import torch
    >>> k2(torch.tensor([0.5, -1.0], dtype=torch.float64)).tolist()
    [0.125, 0.5]
    """
    return 0.5 * d**2


@KL_ESTIMATORS.register("k3", verl="low_var_kl", trl="k3")
def k3(d: torch.Tensor) -> torch.Tensor:
    """exp(-d) + d - 1: unbiased, >= 0, low variance.

    >>> import torch
    >>> k3(torch.tensor([0.5, -1.0], dtype=torch.float64)).round(decimals=4).tolist()  # e^-0.5 - 0.5, e - 2
    [0.1065, 0.7183]
    """
    return (-d).exp() + d - 1


@KL_ESTIMATORS.register("abs", verl="abs")
def abs_d(d: torch.Tensor) -> torch.Tensor:
    """abs(d).

    >>> import torch
    >>> abs_d(torch.tensor([0.5, -1.0], dtype=torch.float64)).tolist()
    [0.5, 1.0]
    """
    return d.abs()


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str, clamp: float = 0.0) -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from the log-probs of tokens pi sampled, (B, T): the :data:`KL_ESTIMATORS`
    entry ``estimator`` of d = logp - ref_logp. ``clamp`` > 0 bounds each estimate to [-clamp, clamp] (verl clamps
    k3 at 10; 0: no bound).

    >>> import torch
    >>> logp, ref = torch.tensor([-1.0, -2.0], dtype=torch.float64), torch.tensor([-1.5, -1.0], dtype=torch.float64)
    >>> kl_estimate(logp, ref, "k2").tolist(), kl_estimate(logp, ref, "k1", clamp=0.75).tolist()
    ([0.125, 0.5], [0.5, -0.75])
    """
    kl = KL_ESTIMATORS[estimator].fn(logprobs - ref_logprobs)
    return kl.clamp(-clamp, clamp) if clamp > 0 else kl


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


def kl_k3(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, total: float | None = None
) -> torch.Tensor:
    """The k3 estimator of KL(pi || ref) per token, exp(d) - d - 1 with d = ref_logp - logp (>= 0, unbiased):
    the KL term of the GRPO loss. Masked mean, a scalar. The order matters: ``logprobs`` are the policy's, of
    tokens it sampled; swapped, the mean estimates E_pi[pi / ref] - 1 - KL(pi || ref) instead."""
    return masked_mean(kl_estimate(logprobs, ref_logprobs, "k3"), mask, total)
