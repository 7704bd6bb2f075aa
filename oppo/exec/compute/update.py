"""The update of a step: PPO (actor and critic, GAE) or GRPO (actor only, group-relative advantages, KL loss).

The driver turns the step's trained sequences into one batch with its targets (:func:`step_batch`, whitening
and group statistics over the whole batch), cuts ``epochs`` x ``minibatches`` minibatches and deals each one's
rows to the data-parallel ranks (:func:`deal`). Each rank's :class:`Learner` takes its share: the loss is divided
by the minibatch's token count over all ranks and the gradients are summed over the ranks (all-reduce), so N
ranks take exactly the step one rank takes alone. Math in :mod:`oppo.exec.algos` (the advantage estimators, KL
estimators and loss aggregations: registries, read by name).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from oppo.exec.algos import advantages
from oppo.exec.algos.advantages import ADVANTAGE_ESTIMATORS, masked_whiten
from oppo.exec.algos.aggregation import Aggregate, masked_mean
from oppo.exec.algos.kl import kl_estimate, kl_shaped_rewards
from oppo.exec.algos.ppo import (
    behaviour_weight,
    entropy,
    policy_loss,
    rollout_is_weight,
    sampled_logprobs,
    value_loss,
)
from oppo.exec.compute.sharding import full, is_sharded, local_digest
from oppo.exec.compute.timing import Recorder
from oppo.exec.config import ExecConfig, PPOConfig
from oppo.exec.models.roles import Roles


class Learner:
    """One rank's optimizers and its share of each minibatch step."""

    def __init__(self, config: ExecConfig, roles: Roles, recorder: Recorder, device: str) -> None:
        self.config, self.roles, self.rec, self.device = config, roles, recorder, device
        self.grpo = config.schedule.algo == "grpo"  # no critic: group-relative advantages, KL in the loss
        actor_lr, critic_lr = config.learning_rates
        self.actor_opt = adam(roles.actor, actor_lr)
        self.critic_opt = None if self.grpo else adam(roles.critic, critic_lr)
        self.optimizers = [self.actor_opt] + ([] if self.grpo else [self.critic_opt])
        self.written: dict[torch.nn.Module, str] = {}  # --check-ranks, sharded: shard digests after each update
        if config.check_ranks and config.shard:
            for optimizer, model in zip(self.optimizers, (roles.actor, roles.critic)):
                optimizer.register_step_post_hook(lambda *_, m=model: self.written.update({m: local_digest(m)}))

    def train(self, step: int, part: dict[str, torch.Tensor], totals: dict[str, float]) -> tuple[float, ...]:
        """One minibatch step. ``part``: this rank's rows of the minibatch (:func:`step_batch` tensors, maybe no
        rows); ``totals``: the minibatch's token and row counts over all ranks (:func:`minibatch_totals`), the
        loss denominators. Returns this rank's terms of the (policy, value) losses and of the token-mean entropy
        (the ranks' terms sum to the minibatch's), and the (actor, critic) gradient norms before clipping (the
        same on every rank)."""
        part = {k: v.to(self.roles.device) for k, v in part.items()}
        rows, tokens = part["ids"].shape[0], int(part["attn"].sum())
        with self.rec.op(step, self.device, "actor", "train_actor", batch=rows, tokens=tokens):
            p_loss, p_entropy, p_norm = self._actor_step(part, totals)
        v_loss = v_norm = 0.0
        if not self.grpo:
            with self.rec.op(step, self.device, "critic", "train_critic", batch=rows, tokens=tokens):
                v_loss, v_norm = self._critic_step(part, totals)
        return p_loss, v_loss, p_entropy, p_norm, v_norm

    def _actor_step(self, part: dict, totals: dict[str, float]) -> tuple[float, float, float]:
        cfg, actor = self.config.ppo, self.roles.actor
        self.actor_opt.zero_grad()
        loss = mean_entropy = 0.0
        if len(part["ids"]):
            picked = response_logits(actor, part).to(part["adv"].dtype)  # (b, T, V)
            loss, token_entropy = actor_loss(self.config, picked, part, totals)
            mean_entropy = float(masked_mean(token_entropy, part["mask"], totals["mask"]))
            loss.backward()
            loss = loss.item()
        return loss, mean_entropy, apply_gradients(self.actor_opt, actor, cfg.max_grad_norm)

    def _critic_step(self, part: dict, totals: dict[str, float]) -> tuple[float, float]:
        cfg, critic = self.config.ppo, self.roles.critic
        self.critic_opt.zero_grad()
        loss = 0.0
        if len(part["ids"]):
            hidden = critic.base_model(input_ids=part["ids"], attention_mask=part["attn"]).last_hidden_state
            values = critic.score(hidden).squeeze(-1).to(part["adv"].dtype).gather(1, part["pos"])  # (b, T)
            agg = aggregate(self.config, totals, "value_mask")
            loss = cfg.value_coef * value_loss(
                values, part["old_values"], part["returns"], part["value_mask"], cfg.value_clip, agg
            )
            loss.backward()
            loss = loss.item()
        return loss, apply_gradients(self.critic_opt, critic, cfg.max_grad_norm)


def actor_loss(
    config: ExecConfig, picked: torch.Tensor, part: dict[str, torch.Tensor], totals: dict[str, float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The actor's loss on a rank's share of a minibatch, and each token's entropy (no gradient), from the logits
    at the response positions ``picked`` (b, T, V): the clipped surrogate (clip-higher, dual clip, decoupled
    weights), plus kl_coef x the KL estimate where the KL goes in the loss, minus entropy_coef x the entropy, each
    aggregated alike (:func:`aggregate`: the ranks' terms sum to the minibatch's loss)."""
    cfg = config.ppo
    logp_all = sampled_logprobs(picked, cfg.temperature)  # (b, T, V), once for the log-probs and the entropy
    logp = logp_all.gather(2, part["targets"][:, :, None]).squeeze(2)  # (b, T)
    weight = None
    if cfg.offpolicy == "decoupled":  # the old log-probs are the proximal policy's
        weight = behaviour_weight(part["old_lp"], part["behav_lp"], cfg.max_importance_ratio)
    elif config.rollout.rollout_is != "none":  # the engine sampled from a slightly different distribution
        weight = rollout_is_weight(
            part["old_lp"], part["behav_lp"], part["mask"], config.rollout.rollout_is, config.rollout.rollout_is_cap
        )
    agg = aggregate(config, totals, "mask")
    clip_low = cfg.clip if cfg.clip_low is None else cfg.clip_low
    clip_high = cfg.clip if cfg.clip_high is None else cfg.clip_high
    loss, _ = policy_loss(
        logp, part["old_lp"], part["adv"], part["mask"], clip_low, agg, weight, clip_high, cfg.dual_clip
    )
    estimator, place = kl_use(config)
    if place == "loss":  # the policy kept near the reference by a loss term (GRPO's way)
        loss = loss + cfg.kl_coef * agg(kl_estimate(logp, part["ref_lp"], estimator, cfg.kl_clamp), part["mask"])
    with torch.set_grad_enabled(cfg.entropy_coef > 0 and torch.is_grad_enabled()):
        token_entropy = entropy(logp_all)  # (b, T) nats
    if cfg.entropy_coef > 0:  # a bonus: the loss falls as the entropy rises
        loss = loss - cfg.entropy_coef * agg(token_entropy, part["mask"])
    return loss, token_entropy.detach()


def kl_use(config: ExecConfig) -> tuple[str, str]:
    """The KL estimator and where it goes (``reward`` or ``loss``), with ``auto`` resolved: the place by the
    algorithm (PPO pays the KL in the reward as OpenRLHF and TRL do, GRPO adds it to the loss as DeepSeekMath and
    verl do), the estimator by the place: k1 in a reward, k3 in a loss (k1's gradient is zero in expectation over
    the policy's own samples, so as a loss term it would not pull towards the reference)."""
    grpo = config.schedule.algo == "grpo"
    place = config.ppo.kl_in if config.ppo.kl_in != "auto" else "loss" if grpo else "reward"
    estimator = config.ppo.kl_estimator if config.ppo.kl_estimator != "auto" else "k3" if place == "loss" else "k1"
    return estimator, place


def advantage_estimator(config: ExecConfig) -> str:
    """The advantage estimator the options select (:func:`oppo.exec.algos.advantages.select`): GAE, T-PPO's EGAE,
    GRPO's or Dr. GRPO's group-relative advantages."""
    return advantages.select(config.schedule.algo, config.schedule.truncated, config.ppo.norm_adv_by_std)


def minibatch_totals(batch: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, float]:
    """The loss denominators of the minibatch ``rows`` over all ranks: masked tokens (``mask``, ``value_mask``) and
    rows with a masked token (``mask_rows``, ``value_mask_rows``)."""
    totals = {}
    for key in ("mask", "value_mask"):
        if key in batch:
            totals[key] = float(batch[key][rows].sum())
            totals[f"{key}_rows"] = float((batch[key][rows].sum(1) > 0).sum())
    return totals


def aggregate(config: ExecConfig, totals: dict[str, float], mask_key: str) -> Aggregate:
    """The configured loss aggregation with the minibatch's denominators (``mask_key``: the loss's mask)."""
    norm = float(config.schedule.max_new_tokens)  # seq-mean-token-sum-norm: a constant, the response cap
    return Aggregate(config.ppo.loss_agg, totals[mask_key], totals[f"{mask_key}_rows"], norm)


def adam(model: torch.nn.Module, lr: float) -> torch.optim.Adam:
    """Adam over ``model``'s parameters; the fused kernel where it applies (plain tensors, not FSDP2 shards): one
    pass over parameters, gradients and both moments instead of a dozen elementwise ops each reading them all (on
    one core of this machine, under load: 0.17 s in place of 0.94 s per step of the 26M-parameter small-cpu actor,
    ``benchmarks/trainer_ops.py``). The same update, rounded differently."""
    return torch.optim.Adam(model.parameters(), lr=lr, fused=not is_sharded(model))


def apply_gradients(optimizer, model: torch.nn.Module, max_norm: float) -> float:
    """Sum the gradients over the data-parallel ranks (one flat all-reduce per model: each rank's loss is already
    divided by the global token count), then clip and step; every rank then holds the same weights. A sharded
    model's gradients were already summed, shard by shard, in its backward pass. Returns the gradients' norm
    before clipping (0 when there are none)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if dist.is_initialized() and dist.get_world_size() > 1 and not is_sharded(model):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]  # a rank with no rows
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for p, summed in zip(params, _unflatten_dense_tensors(flat, grads)):
            p.grad = summed
    if not any(p.grad is not None for p in params):
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    optimizer.step()
    return float(full(norm))


def weights_digest(*models: torch.nn.Module, optimizers=(), written: dict | None = None) -> str:
    """A digest of what the data-parallel ranks must agree on after a step, bit for bit (local: no collective).

    Whole weights: every rank holds them all, so their bytes are hashed. Sharded weights: each element lives on
    one rank only, so no peer can vouch for it, and a digest of the all-gathered tensors would only restate what
    the owners hold (the same on every rank whatever a shard holds). Hashed instead: what every rank holds a copy
    of, the parameters' names and whole shapes and the ``optimizers``' replicated state (each parameter's step
    count, the hyperparameters: a rank that skipped or repeated an update, or took another learning rate, differs
    there); and whether this rank's shards are still what its optimizer's last step left (``written``: their
    digest per model, recorded after every step): a shard changed by anything but an update marks the rank's
    digest. A shard updated wrongly from the right inputs has no second copy to be compared with; the equivalence
    tests against one rank cover that."""
    h = hashlib.sha256()
    for model in models:
        if not is_sharded(model):
            for p in model.parameters():
                h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            continue
        h.update(repr([(name, tuple(p.shape)) for name, p in model.named_parameters()]).encode())
        if written and model in written and written[model] != local_digest(model):
            h.update(f"rank {dist.get_rank()}: shards changed since the last update".encode())
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            h.update(repr(sorted((k, v) for k, v in group.items() if k != "params")).encode())
            h.update(repr([float(optimizer.state.get(p, {}).get("step", 0)) for p in group["params"]]).encode())
    return h.hexdigest()[:16]


def step_batch(config: ExecConfig, trained, data, scores: dict, pad_id: int, eos_id: int) -> dict[str, torch.Tensor]:
    """The trained sequences as one right-padded batch (CPU) with their PPO or GRPO targets, computed over the
    whole batch (advantage whitening, group statistics) whatever the number of ranks. ``--mask-truncated``: the
    samples cut at the length cap keep their place in those statistics (their reward counts, as in TRL) but leave
    the loss."""
    truncated = config.schedule.truncated
    batch = padded_batch(trained, data, pad_id, config.ppo.tppo_drop_tokens, truncated)
    if config.ppo.offpolicy == "decoupled" or config.rollout.rollout_is != "none":  # each token's sampling log-prob
        dtype = scores["old_logprobs"][0].dtype
        batch["behav_lp"] = pad_rows(scores["behaviour_logprobs"], batch["mask"].shape[1]).to(dtype)
    if config.schedule.algo == "grpo":
        batch |= grpo_targets(config, trained, scores, batch["mask"])
    else:
        batch |= ppo_targets(config, trained, scores, batch["mask"])
    if config.ppo.mask_truncated:
        cut = cut_at_cap(trained, data, config.schedule.max_new_tokens, eos_id)
        for key in ("mask", "value_mask"):
            if key in batch:
                batch[key] = batch[key] * ~cut[:, None]
    return batch


def cut_at_cap(trained, data, cap: int, eos_id: int) -> torch.Tensor:
    """Per trained sample, whether it ended at the length cap without its EOS. Shape (B,), bool."""
    return torch.tensor(
        [t.finished and len(data[t.seq_id].response) >= cap and data[t.seq_id].response[-1] != eos_id for t in trained]
    )


def minibatches(n: int, ppo: PPOConfig, seed: int) -> list[torch.Tensor]:
    """Row indices of each minibatch: ``epochs`` shuffles of ``n`` rows, each cut into exactly ``minibatches``
    pieces whose sizes differ by one row at most (the smallest has floor(n / minibatches) rows; ``torch.chunk``
    would give 7 rows as 3, 3, 1 and 6 rows as 3 pieces where 4 were asked)."""
    g = torch.Generator().manual_seed(seed)
    return [mb for _ in range(ppo.epochs) for mb in torch.randperm(n, generator=g).tensor_split(ppo.minibatches)]


def longest_first(work: Sequence[int], ranks: int, load: Sequence[int] = ()) -> list[int]:
    """The rank of each item: greedily, the item with the most ``work`` first, to the least loaded rank (ties: the
    lowest rank; equal work: in the given order); ``load``: each rank's work already there (default none). With
    positive work and at least ``ranks`` items on empty ranks, every rank gets an item."""
    load = list(load) or [0] * ranks
    owner = [0] * len(work)
    for i in sorted(range(len(work)), key=lambda i: -work[i]):  # stable: equal work in the given order
        owner[i] = min(range(ranks), key=load.__getitem__)
        load[owner[i]] += work[i]
    return owner


def deal(rows: torch.Tensor, tokens: torch.Tensor, ranks: int) -> list[torch.Tensor]:
    """Split a minibatch's ``rows`` over ``ranks`` with balanced ``tokens`` (per row, > 0): :func:`longest_first`,
    so every rank gets a row when there are at least ``ranks``. Each share keeps the minibatch's order. One rank
    takes the minibatch as it is."""
    if ranks == 1:
        return [rows]
    owner = torch.tensor(longest_first(tokens.tolist(), ranks), dtype=torch.long)
    return [rows[owner == r] for r in range(ranks)]


def ppo_targets(config: ExecConfig, trained, scores: dict, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Old log-probs, advantages (whitened), returns and loss masks, all (B, T) over response positions."""
    cfg, truncated = config.ppo, config.schedule.truncated
    dtype = scores["values"][0].dtype
    pad = lambda rows: pad_rows(rows, mask.shape[1]).to(dtype)  # noqa: E731
    old_lp, ref_lp, old_values = pad(scores["old_logprobs"]), pad(scores["ref_logprobs"]), pad(scores["values"])
    mask = mask.to(dtype)
    # The score counts where a sequence has finished (EOS or the length cap: the core marks a capped one finished);
    # only T-PPO trains unfinished segments, which get no score and bootstrap (EGAE).
    finished = torch.tensor([t.finished for t in trained])
    estimator, place = kl_use(config)
    kl_coef = cfg.kl_coef if place == "reward" else 0.0  # else the actor's loss carries it
    rewards = kl_shaped_rewards(
        scores["score"].to(dtype), old_lp, ref_lp, mask, kl_coef, finished, estimator, cfg.kl_clamp
    )
    estimate = ADVANTAGE_ESTIMATORS[advantage_estimator(config)].fn  # GAE, or EGAE where segments are truncated
    adv, returns = estimate(rewards, old_values, mask, finished, cfg.gamma, cfg.lam)
    value_mask = mask * finished[:, None] if truncated else mask  # T-PPO: the critic learns from finished ones
    targets = {
        "old_lp": old_lp,
        "old_values": old_values,
        "adv": masked_whiten(adv, mask),
        "returns": returns,
        "mask": mask,
        "value_mask": value_mask,
    }
    return targets | ({"ref_lp": ref_lp} if place == "loss" else {})


def grpo_targets(config: ExecConfig, trained, scores: dict, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Old and reference log-probs and the group-relative advantage of each sample on all its tokens. With the KL
    in the reward (``--kl-in reward``), a sample's score is its reward less kl_coef times its summed KL estimate
    (verl's ``use_kl_in_reward``: the outcome is the sum of the token-level rewards)."""
    cfg, dtype = config.ppo, scores["old_logprobs"][0].dtype
    pad = lambda rows: pad_rows(rows, mask.shape[1]).to(dtype)  # noqa: E731
    old_lp, ref_lp, mask = pad(scores["old_logprobs"]), pad(scores["ref_logprobs"]), mask.to(dtype)
    score = scores["score"].to(dtype)
    estimator, place = kl_use(config)
    if place == "reward":
        score = score - cfg.kl_coef * (kl_estimate(old_lp, ref_lp, estimator, cfg.kl_clamp) * mask).sum(1)
    groups = torch.tensor([t.group_id for t in trained])
    adv = ADVANTAGE_ESTIMATORS[advantage_estimator(config)].fn(score, groups)  # (B,): GRPO, or Dr. GRPO's
    return {"old_lp": old_lp, "ref_lp": ref_lp, "adv": adv[:, None] * mask, "mask": mask}


def padded_batch(trained, data, pad_id: int, drop: int, truncated: bool) -> dict[str, torch.Tensor]:
    """Right-padded full sequences and response-position indexing. ``pos[b, j]`` is the position whose output
    scores response token j (its predecessor); ``mask`` marks the tokens in the loss (T-PPO: this step's segment,
    minus ``drop`` last tokens of unfinished segments)."""
    seqs = [data[t.seq_id] for t in trained]
    width = max(len(s.tokens) for s in seqs)
    longest = max(len(s.response) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn, pos = torch.zeros_like(ids), torch.zeros(len(seqs), longest, dtype=torch.long)
    targets, mask = torch.full_like(pos, pad_id), torch.zeros(len(seqs), longest)
    for b, (t, s) in enumerate(zip(trained, seqs)):
        n, p = len(s.response), len(s.prompt)
        ids[b, : len(s.tokens)], attn[b, : len(s.tokens)] = torch.tensor(s.tokens), 1
        pos[b, :n], targets[b, :n] = torch.arange(p - 1, p + n - 1), torch.tensor(s.response)
        first = n - t.step_tokens if truncated else 0
        last = n - (drop if truncated and not t.finished else 0)
        mask[b, first : max(first, last)] = 1
    return {"ids": ids, "attn": attn, "pos": pos, "targets": targets, "mask": mask}


def pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=rows[0].dtype)
    for b, row in enumerate(rows):
        out[b, : len(row)] = row.cpu()
    return out


def response_logits(actor: torch.nn.Module, part: dict[str, torch.Tensor]) -> torch.Tensor:
    """``actor(...).logits`` (whatever the model applies after its head) at the response positions ``part["pos"]``:
    (b, T, V). The vocabulary projection runs on the positions from the first response's on, not on the prompts'
    (with a 49k vocabulary and a 576-wide model it costs a fifth of a position's forward and backward)."""
    first = int(part["pos"][:, 0].min())  # rows are right-padded: a row's response starts at its prompt's length
    if first < 0:
        raise ValueError("a trained sequence has an empty prompt: no position predicts its first response token")
    keep = part["ids"].shape[1] - first  # the last ``keep`` positions
    logits = actor(input_ids=part["ids"], attention_mask=part["attn"], logits_to_keep=keep).logits  # (b, keep, V)
    if logits.shape[1] != keep:
        raise ValueError(f"{type(actor).__name__} ignores logits_to_keep: its logits span {logits.shape[1]} positions")
    return at_positions(logits, (part["pos"] - first).clamp(min=0))  # padding's index 0 stays in range (masked)


def at_positions(logits: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The logits at the given positions: (B, L, V) and (B, T) -> (B, T, V)."""
    return logits.gather(1, pos[:, :, None].expand(-1, -1, logits.shape[-1]))
