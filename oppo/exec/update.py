"""The update of a step: PPO (actor and critic, GAE) or GRPO (actor only, group-relative advantages, KL loss).

:class:`Learner` owns the optimizers; the targets are computed once per step from the scores, then ``epochs`` x
``minibatches`` updates run over the trained sequences. Math in :mod:`oppo.exec.ppo`.
"""

from __future__ import annotations

import numpy as np
import torch

from oppo.exec.config import ExecConfig
from oppo.exec.models import Roles
from oppo.exec.ppo import (
    gae,
    group_advantages,
    kl_k3,
    kl_shaped_rewards,
    masked_whiten,
    policy_loss,
    value_loss,
)
from oppo.exec.timing import Recorder


class Learner:
    def __init__(self, config: ExecConfig, roles: Roles, recorder: Recorder, device: str) -> None:
        self.config, self.roles, self.rec, self.device = config, roles, recorder, device
        self.grpo = config.schedule.algo == "grpo"  # no critic: group-relative advantages, KL in the loss
        self.actor_opt = torch.optim.Adam(roles.actor.parameters(), lr=config.ppo.lr)
        self.critic_opt = None if self.grpo else torch.optim.Adam(roles.critic.parameters(), lr=config.ppo.critic_lr)

    def train(self, step: int, trained, data, scores: dict, seed: int) -> tuple[float, float]:
        """``epochs`` x ``minibatches`` updates; returns the mean (policy loss, value loss). ``data``: seq id ->
        its tokens (``prompt``, ``response``); ``scores``: the step's scores (:meth:`Executor._score`)."""
        cfg, roles = self.config.ppo, self.roles
        truncated = self.config.schedule.truncated
        batch = padded_batch(trained, data, roles.pad_id, cfg.tppo_drop_tokens, truncated)
        batch = {k: v.to(roles.device) for k, v in batch.items()}
        batch |= (
            self.grpo_targets(trained, scores, batch["mask"])
            if self.grpo
            else self.ppo_targets(trained, scores, batch["mask"])
        )
        g = torch.Generator().manual_seed(seed)
        losses = []
        for _ in range(cfg.epochs):
            for mb in torch.randperm(len(trained), generator=g).chunk(cfg.minibatches):
                mb = mb.to(roles.device)
                tokens = int(batch["attn"][mb].sum())
                with self.rec.op(step, self.device, "actor", "train_actor", batch=len(mb), tokens=tokens):
                    p_loss = self._actor_step(batch, mb)
                v_loss = 0.0
                if not self.grpo:
                    with self.rec.op(step, self.device, "critic", "train_critic", batch=len(mb), tokens=tokens):
                        v_loss = self._critic_step(batch, mb)
                losses.append((p_loss, v_loss))
        return tuple(float(x) for x in np.mean(losses, axis=0))

    def _actor_step(self, batch: dict, mb: torch.Tensor) -> float:
        cfg, actor = self.config.ppo, self.roles.actor
        logits = actor(input_ids=batch["ids"][mb], attention_mask=batch["attn"][mb]).logits  # (b, L, V)
        logp = gather_logprobs(logits.to(batch["adv"].dtype) / cfg.temperature, batch["pos"][mb], batch["targets"][mb])
        mask = batch["mask"][mb]
        loss, _ = policy_loss(logp, batch["old_lp"][mb], batch["adv"][mb], mask, cfg.clip)
        if self.grpo:  # GRPO keeps the policy near the reference through a loss term, not the reward
            loss = loss + cfg.kl_coef * kl_k3(logp, batch["ref_lp"][mb], mask)
        optimizer_step(self.actor_opt, loss, actor, cfg.max_grad_norm)
        return loss.item()

    def _critic_step(self, batch: dict, mb: torch.Tensor) -> float:
        cfg, critic = self.config.ppo, self.roles.critic
        hidden = critic.base_model(input_ids=batch["ids"][mb], attention_mask=batch["attn"][mb]).last_hidden_state
        values = critic.score(hidden).squeeze(-1).to(batch["adv"].dtype).gather(1, batch["pos"][mb])  # (b, T)
        loss = cfg.value_coef * value_loss(values, batch["old_values"][mb], batch["returns"][mb],
                                           batch["value_mask"][mb], cfg.value_clip)  # fmt: skip
        optimizer_step(self.critic_opt, loss, critic, cfg.max_grad_norm)
        return loss.item()

    def ppo_targets(self, trained, scores: dict, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Old log-probs, advantages (whitened), returns and loss masks, all (B, T) over response positions."""
        cfg, device, truncated = self.config.ppo, self.roles.device, self.config.schedule.truncated
        dtype = scores["values"][0].dtype
        pad = lambda rows: pad_rows(rows, mask.shape[1]).to(device, dtype)  # noqa: E731
        old_lp, ref_lp, old_values = pad(scores["old_logprobs"]), pad(scores["ref_logprobs"]), pad(scores["values"])
        mask = mask.to(dtype)
        finished = torch.tensor([t.finished for t in trained], device=device)
        capped = torch.tensor(
            [t.response_tokens >= self.config.schedule.max_new_tokens for t in trained], device=device
        )
        scored = finished | (capped & (not truncated))  # T-PPO scores a sequence only once it has finished
        rewards = kl_shaped_rewards(scores["score"].to(device, dtype), old_lp, ref_lp, mask, cfg.kl_coef, scored)
        adv, returns = gae(rewards, old_values, mask, cfg.gamma, cfg.lam, ~scored if truncated else None)  # EGAE
        value_mask = mask * finished[:, None] if truncated else mask  # T-PPO: the critic learns from finished ones
        return {"old_lp": old_lp, "old_values": old_values, "adv": masked_whiten(adv, mask), "returns": returns,
                "mask": mask, "value_mask": value_mask}  # fmt: skip

    def grpo_targets(self, trained, scores: dict, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Old and reference log-probs and the group-relative advantage of each sample on all its tokens."""
        device = self.roles.device
        dtype = scores["old_logprobs"][0].dtype
        pad = lambda rows: pad_rows(rows, mask.shape[1]).to(device, dtype)  # noqa: E731
        groups = torch.tensor([t.group_id for t in trained])
        adv = group_advantages(scores["score"].to(dtype), groups).to(device)  # (B,)
        mask = mask.to(dtype)
        return {"old_lp": pad(scores["old_logprobs"]), "ref_lp": pad(scores["ref_logprobs"]),
                "adv": adv[:, None] * mask, "mask": mask}  # fmt: skip


def optimizer_step(optimizer, loss: torch.Tensor, model: torch.nn.Module, max_norm: float) -> None:
    optimizer.zero_grad()
    if loss.requires_grad:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()


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


def gather_logprobs(logits: torch.Tensor, pos: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log pi(target | prefix) at the given positions. logits (B, L, V), pos/targets (B, T) -> (B, T)."""
    picked = logits.gather(1, pos[:, :, None].expand(-1, -1, logits.shape[-1]))  # (B, T, V)
    return torch.log_softmax(picked, dim=-1).gather(2, targets[:, :, None]).squeeze(2)
