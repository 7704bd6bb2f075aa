"""Sharded data parallelism (``--shard``): the trained models' parameters, gradients and Adam states split over
the ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Each decoder layer, the rest of the backbone (embeddings, final norm) and the output head are sharded units:
the executor calls the backbone and the head separately (streamed scoring, the critic's values), and each
call gathers what it needs. A head tied to the input embedding (Qwen2.5 0.5B-3B, Llama 3.2, Gemma) is one
parameter used by two modules, so it must belong to one unit: as two units it would become two copies, each
updated with its own part of the gradient. A tied model's units are its decoder layers and the whole model for
the rest (embeddings, final norm and head), which the executor only calls through the whole model or while the
weights are gathered. Generation and scoring run a different number of forward passes on each rank, so
they cannot gather layer by layer in lockstep: :func:`gather` all-gathers the whole model once per step (as
verl's hybrid engine hands whole weights to its rollout engine) and keeps it gathered until :func:`release`,
before the update, which then gathers one layer at a time. Gradients are reduce-scattered as a sum: each rank's
loss is already divided by the minibatch's global token count (:mod:`oppo.exec.compute.update`).
"""

from __future__ import annotations

import hashlib

import torch
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from oppo.exec.models.roles import backbone, is_tied, score_head


def shard(model: torch.nn.Module) -> None:
    """Shard ``model`` in place (decoder layers, the backbone's own parameters, the head; a tied model: its
    layers, then the whole model for the rest); sums gradients."""
    body = backbone(model)
    for layer in body.layers:
        fully_shard(layer)
    if is_tied(model):
        fully_shard(model)  # the embedding, which is the head, and the final norm: one unit, the root
    else:
        fully_shard(body)
        fully_shard(score_head(model))
    for unit in _units(model):
        unit.set_gradient_divide_factor(1.0)  # a sum over ranks, not a mean
        unit.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no pre-multiplied sum)


def is_sharded(model: torch.nn.Module) -> bool:
    return any(True for _ in _units(model))


def gather(model: torch.nn.Module) -> None:
    """All-gather every parameter and keep them gathered across forward passes (a collective: every rank)."""
    for unit in _units(model):
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()


def release(model: torch.nn.Module) -> None:
    """Free the gathered parameters (local); forward passes gather one unit at a time again."""
    for unit in _units(model):
        unit.reshard()
        unit.set_reshard_after_forward(True, recurse=False)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a parameter, sharded or not (a collective for a sharded one)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local_digest(model: torch.nn.Module) -> str:
    """A digest of this rank's shards of ``model``'s parameters, bit for bit (local: no collective)."""
    h = hashlib.sha256()
    for p in model.parameters():
        local = p.detach().to_local() if isinstance(p, DTensor) else p.detach()
        h.update(local.cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _units(model: torch.nn.Module):
    return (m for m in model.modules() if isinstance(m, FSDPModule))
