"""How a per-token loss (B, T) becomes a scalar: the loss aggregations (verl's ``loss_agg_mode``), a registry.

Torch-free (tensor methods only): :mod:`oppo.exec.config` reads :data:`LOSS_AGGS`' names without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from oppo.exec.algos.registry import Registry

if TYPE_CHECKING:
    import torch

# verl's loss_agg_mode names; TRL's GRPOTrainer loss_type where it computes the same (its "dapo", and PPO's
# default, divide by the whole generation's tokens; its "dr_grpo" is seq-mean-token-sum-norm over the rows)
LOSS_AGGS = Registry("loss aggregation", verl="`loss_agg_mode`", trl="GRPOTrainer `loss_type`")


def masked_mean(x: torch.Tensor, mask: torch.Tensor, total: float | None = None) -> torch.Tensor:
    """Mean over the masked entries. ``total``: the count to divide by instead of ``mask.sum()``: a data-parallel
    rank divides its share of a minibatch by the whole minibatch's count, so the ranks' losses sum to the mean.

    >>> import torch
    >>> x, mask = torch.tensor([1.0, 2.0, 6.0], dtype=torch.float64), torch.tensor([1.0, 1.0, 0.0])
    >>> masked_mean(x, mask).item(), masked_mean(x, mask, total=6.0).item()
    (1.5, 0.5)
    """
    return (x * mask).sum() / (mask.sum().clamp(min=1) if total is None else max(total, 1.0))


@dataclass(frozen=True)
class Aggregate:
    """The configured loss aggregation (``mode``, a :data:`LOSS_AGGS` name) with denominators counted over a whole
    minibatch, so that the data-parallel ranks' terms sum to the loss one rank takes alone."""

    mode: str = "token-mean"
    tokens: float | None = None  # masked tokens of the minibatch (None: of this batch)
    rows: float | None = None  # rows with a masked token in the minibatch (None: of this batch)
    norm: float | None = None  # seq-mean-token-sum-norm's divisor (None: this batch's width T)

    def __post_init__(self) -> None:
        LOSS_AGGS[self.mode]  # an unknown mode: a ValueError naming the choices

    def __call__(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return LOSS_AGGS[self.mode].fn(x, mask, self)

    def row_count(self, mask: torch.Tensor) -> float:
        """The rows a sequence mean divides by: the minibatch's, else this batch's rows with a masked token."""
        return float((mask.sum(-1) > 0).sum()) if self.rows is None else self.rows


# Each aggregation: (x (B, T), mask (B, T), the Aggregate with its denominators) -> a scalar.
# x = [[1, 2], [6, pad]] below: row sums 3 and 6, row means 1.5 and 6, 3 tokens, 2 rows.


@LOSS_AGGS.register("token-mean", verl="token-mean", trl="bnpo")
def token_mean(x: torch.Tensor, mask: torch.Tensor, agg: Aggregate) -> torch.Tensor:
    """The sum over tokens / the minibatch's tokens.

    >>> import torch
    >>> x, mask = torch.tensor([[1.0, 2.0], [6.0, 9.0]], dtype=torch.float64), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    >>> Aggregate("token-mean")(x, mask).item()
    3.0
    """
    return masked_mean(x, mask, agg.tokens)


@LOSS_AGGS.register("seq-mean-token-mean", verl="seq-mean-token-mean", trl="grpo")
def seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor, agg: Aggregate) -> torch.Tensor:
    """Each row's token mean, summed / the minibatch's rows.

    >>> import torch
    >>> x, mask = torch.tensor([[1.0, 2.0], [6.0, 9.0]], dtype=torch.float64), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    >>> Aggregate("seq-mean-token-mean")(x, mask).item()
    3.75
    """
    per_row = (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # (B,)
    return per_row.sum() / max(agg.row_count(mask), 1.0)


@LOSS_AGGS.register("seq-mean-token-sum", verl="seq-mean-token-sum")
def seq_mean_token_sum(x: torch.Tensor, mask: torch.Tensor, agg: Aggregate) -> torch.Tensor:
    """Each row's token sum, summed / the minibatch's rows.

    >>> import torch
    >>> x, mask = torch.tensor([[1.0, 2.0], [6.0, 9.0]], dtype=torch.float64), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    >>> Aggregate("seq-mean-token-sum")(x, mask).item()
    4.5
    """
    return (x * mask).sum(-1).sum() / max(agg.row_count(mask), 1.0)


@LOSS_AGGS.register("seq-mean-token-sum-norm", verl="seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(x: torch.Tensor, mask: torch.Tensor, agg: Aggregate) -> torch.Tensor:
    """The token sums, summed / a constant, here the response cap (Dr. GRPO; verl's default divisor is the batch's
    padded width, which changes with how rows are batched).

    >>> import torch
    >>> x, mask = torch.tensor([[1.0, 2.0], [6.0, 9.0]], dtype=torch.float64), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    >>> Aggregate("seq-mean-token-sum-norm", norm=4.0)(x, mask).item()
    2.25
    """
    return (x * mask).sum(-1).sum() / (agg.norm or mask.shape[-1])
