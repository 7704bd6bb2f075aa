"""The executor: runs the scheduler's plans with real models, one PPO step at a time (colocated, one process).

A step reads top to bottom: 1. admit prompts, 2. streamed scorers take the sequences in flight, 3. generate in
rounds (streaming each round's tokens), 4. score the trained sequences, 5. PPO update, 6. close the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from oppo.exec import task
from oppo.exec.config import ExecConfig
from oppo.exec.generation import ChunkedDecoder
from oppo.exec.models import Roles, load_prompts
from oppo.exec.ppo import gae, kl_shaped_rewards, masked_whiten, policy_loss, value_loss
from oppo.exec.scoring import LocalScorer, score_once
from oppo.exec.timing import Recorder
from oppo.lengths import LengthTrace
from oppo.scheduler import Scheduler, StepOutcome


@dataclass
class SeqData:
    prompt: list[int]
    response: list[int] = field(default_factory=list)
    forced_length: int | None = None  # traced response length (EOS forced there), None = natural

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.response


@dataclass(frozen=True)
class StepMetrics:
    step: int
    mean_reward: float
    rule_score: float  # the task's ground-truth score of the trained responses
    kl: float  # mean per-token log(pi / pi_ref) of the trained tokens
    policy_loss: float
    value_loss: float
    response_len: float  # mean response tokens of the trained sequences


class Executor:
    def __init__(self, config: ExecConfig, roles: Roles, recorder: Recorder, lengths: LengthTrace | None = None,
                 scorers: dict | None = None):  # fmt: skip
        """``scorers``: a handle per scorer role (local or remote, same methods); default: all local."""
        self.config, self.roles, self.rec, self.lengths = config, roles, recorder, lengths
        self.scheduler = Scheduler(config.schedule)
        self.data: dict[int, SeqData] = {}
        self.device = device_name(roles.device)
        self.actor_opt = torch.optim.Adam(roles.actor.parameters(), lr=config.ppo.lr)
        self.critic_opt = torch.optim.Adam(roles.critic.parameters(), lr=config.ppo.critic_lr)
        self.scorers = scorers if scorers is not None else local_scorers(config, roles, recorder)
        streamed = config.schedule.streamed_scorers if config.schedule.streaming else ()
        self.streamed = {role: handle for role, handle in self.scorers.items() if role in streamed}
        self.prompts = load_prompts(config) if config.task.prompts else None  # token ids per line

    def _seed(self, *parts: int) -> int:
        return derived_seed(self.config.seed, *parts)

    # -- one step ---------------------------------------------------------------------------------------
    def step(self) -> tuple[StepOutcome, StepMetrics]:
        rec, sched = self.rec, self.scheduler
        plan = sched.plan_step(rec.now())
        # 1. admit the new prompts
        for seq_id in plan.new:
            self.data[seq_id] = self._new_sequence(seq_id)
        for seq_id in plan.restarted:  # tailbatch: an aborted sample is generated again from its prompt
            self.data[seq_id].response = []
        contexts = [(i, self.data[i].tokens, len(self.data[i].prompt)) for i in plan.active]
        # 2. scorers get this step's critic; streamed ones take every sequence in flight (carried ones keep a
        #    frozen scorer's cache)
        if "critic" in self.scorers:
            self.scorers["critic"].sync_weights(plan.step, self.roles.critic)
        for scorer in self.streamed.values():
            scorer.begin(plan.step, contexts)
        # 3. generation in rounds; every complete chunk is streamed to the scorers
        self._generate(plan)
        # 4. score the trained sequences
        trained = sched.select()
        scores = self._score(plan.step, trained)
        # 5. PPO update
        losses = self._train(plan.step, trained, scores)
        # 6. close the step
        outcome = sched.close_step(rec.now(), scores["mean_reward"])
        for scorer in self.scorers.values():
            scorer.end(list(outcome.carried))
            for row in scorer.collect():
                rec.add(row)
        for t in outcome.trained:
            if t.finished:
                del self.data[t.seq_id]
        return outcome, StepMetrics(plan.step, scores["mean_reward"], scores["rule_score"], scores["kl"], *losses,
                                    response_len=float(np.mean([t.response_tokens for t in trained])))  # fmt: skip

    def _new_sequence(self, seq_id: int) -> SeqData:
        if self.prompts is not None:  # the dataset, cycled in order
            prompt = self.prompts[seq_id % len(self.prompts)]
        else:
            g = torch.Generator().manual_seed(self._seed(1, seq_id))
            prompt = task.random_prompts(g, 1, self.config.task.prompt_tokens, self.roles.vocab_size)[0]
        forced = None
        if self.lengths is not None:
            forced = forced_length(self.lengths, self.config.seed, seq_id, self.config.schedule.max_new_tokens)
        return SeqData(prompt=prompt, forced_length=forced)

    def _generate(self, plan) -> None:
        rec, sched = self.rec, self.scheduler
        rows = [i for i in plan.active if i in plan.budgets]
        if not rows:
            return
        with rec.op(plan.step, self.device, "actor", "prefill", batch=len(rows)) as info:
            contexts = [self.data[i].tokens for i in rows]
            info["tokens"] = len(rows) * max(map(len, contexts))  # left-padded: every row computes the width
            decoder = ChunkedDecoder(
                self.roles.actor, contexts, [plan.budgets[i] for i in rows], self.roles.eos_id, self.roles.pad_id,
                torch.Generator(self.roles.device).manual_seed(self._seed(3, plan.step)),
                self.config.ppo.temperature, [self.data[i].forced_length for i in rows],
                [len(self.data[i].response) for i in rows],
            )  # fmt: skip
        unstreamed: dict[int, list[int]] = {}  # tokens decoded since the last streamed chunk
        while not sched.generation_done:
            n = sched.next_round_tokens()
            with rec.op(plan.step, self.device, "actor", "decode") as info:
                # every row of the batch is computed each iteration, stopped ones too (as in HF generate):
                # tokens processed = iterations x rows; context = cached positions of all rows at the start
                info["batch"], info["context"] = len(rows), decoder.width * len(rows) + decoder.iterations * len(rows)
                before = decoder.iterations
                finished, chunk = decoder.decode(n)
                info["tokens"] = (decoder.iterations - before) * len(rows)
            new = {rows[r]: tokens for r, tokens in enumerate(chunk) if tokens}
            for seq_id, tokens in new.items():
                self.data[seq_id].response.extend(tokens)
                unstreamed.setdefault(seq_id, []).extend(tokens)
            sched.report_round(rec.now(), n, {rows[r]: k for r, k in finished.items()})
            if sched.stream_now:
                for scorer in self.streamed.values():
                    scorer.feed(plan.step, unstreamed)  # a remote scorer prefills while the next rounds decode
                unstreamed = {}

    def _score(self, step: int, trained) -> dict:
        """Old log-probs (current policy), reference log-probs, values and scores of the trained sequences.
        Scorer roles are asked first, so remote ones work while the actor recomputes its log-probs here."""
        seqs = [(t.seq_id, self.data[t.seq_id].tokens, len(self.data[t.seq_id].prompt)) for t in trained]
        ids = [t.seq_id for t in trained]
        pending = {}
        for role, scorer in self.scorers.items():
            pending[role] = scorer.outputs(step, ids) if role in self.streamed else scorer.score(step, seqs)
        with self.rec.op(step, self.device, "actor", "score", batch=len(seqs), tokens=sum(len(s[1]) for s in seqs)):
            out = {"actor": score_once(self.roles.actor, "logprob", seqs, self.roles.pad_id)}
        out |= {role: [t.to(self.roles.device) for t in p.get()] for role, p in pending.items()}
        rule = task.rule_score([self.data[i].response for i in ids])
        score = torch.stack(out["reward"]).float().cpu() if "reward" in out else rule
        finished = torch.tensor([t.finished for t in trained])
        shown = score[finished] if finished.any() else score
        kl = torch.cat([a - r for a, r in zip(out["actor"], out["reference"])]).float()
        return {"old_logprobs": out["actor"], "ref_logprobs": out["reference"], "values": out["critic"],
                "score": score, "mean_reward": float(shown.mean()), "rule_score": float(rule.mean()),
                "kl": float(kl.mean())}  # fmt: skip

    # -- PPO update ------------------------------------------------------------------------------------
    def _train(self, step: int, trained, scores: dict) -> tuple[float, float]:
        """``epochs`` x ``minibatches`` updates of actor and critic; returns mean (policy loss, value loss)."""
        cfg, roles = self.config.ppo, self.roles
        batch = _padded_batch(trained, self.data, roles.pad_id, cfg.tppo_drop_tokens, self.config.schedule.truncated)
        batch = {k: v.to(roles.device) for k, v in batch.items()}
        batch |= self._targets(trained, scores, batch["mask"])
        ids, attn, pos, targets = batch["ids"], batch["attn"], batch["pos"], batch["targets"]
        g = torch.Generator().manual_seed(self._seed(4, step))
        losses = []
        for _ in range(cfg.epochs):
            for mb in torch.randperm(len(trained), generator=g).chunk(cfg.minibatches):
                mb = mb.to(roles.device)
                tokens = int(attn[mb].sum())
                with self.rec.op(step, self.device, "actor", "train_actor", batch=len(mb), tokens=tokens):
                    logits = roles.actor(input_ids=ids[mb], attention_mask=attn[mb]).logits  # (b, L, V)
                    logp = _gather_logprobs(logits.to(batch["adv"].dtype) / cfg.temperature, pos[mb], targets[mb])
                    p_loss, _ = policy_loss(logp, batch["old_lp"][mb], batch["adv"][mb], batch["mask"][mb], cfg.clip)
                    _step(self.actor_opt, p_loss, roles.actor, cfg.max_grad_norm)
                with self.rec.op(step, self.device, "critic", "train_critic", batch=len(mb), tokens=tokens):
                    hidden = roles.critic.base_model(input_ids=ids[mb], attention_mask=attn[mb]).last_hidden_state
                    values = roles.critic.score(hidden).squeeze(-1).to(batch["adv"].dtype).gather(1, pos[mb])  # (b, T)
                    v_loss = value_loss(values, batch["old_values"][mb], batch["returns"][mb],
                                        batch["value_mask"][mb], cfg.value_clip)  # fmt: skip
                    _step(self.critic_opt, cfg.value_coef * v_loss, roles.critic, cfg.max_grad_norm)
                losses.append((p_loss.item(), cfg.value_coef * v_loss.item()))
        return tuple(float(x) for x in np.mean(losses, axis=0))

    def _targets(self, trained, scores: dict, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Old log-probs, advantages (whitened), returns and loss masks, all (B, T) over response positions."""
        cfg, device, truncated = self.config.ppo, self.roles.device, self.config.schedule.truncated
        dtype = scores["values"][0].dtype
        pad = lambda rows: _pad_rows(rows, mask.shape[1]).to(device, dtype)  # noqa: E731
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


def derived_seed(seed: int, *parts: int) -> int:
    """A seed for one purpose (``parts``) of a run, independent of how many draws other purposes made."""
    return (seed * 1_000_003 + sum(p * 7919**i for i, p in enumerate(parts, 1))) % 2**62


def forced_length(lengths: LengthTrace, seed: int, seq_id: int, cap: int) -> int:
    """The traced response length forced on sequence ``seq_id`` (EOS included), within [1, cap]."""
    traced = lengths.sample(np.random.default_rng(derived_seed(seed, 2, seq_id)), 1)[0][0]
    return int(min(max(traced, 1), cap))


def device_name(device: torch.device) -> str:
    return "cpu0" if device.type == "cpu" else f"cuda:{device.index or 0}"


def local_scorers(config: ExecConfig, roles: Roles, recorder: Recorder) -> dict:
    """Scorer roles in this process: reference, critic, and the reward model unless the reward is a rule."""
    names = ["reference", "critic"] + (["reward"] if config.task.reward_kind == "learned" else [])
    device = device_name(roles.device)
    return {role: LocalScorer.for_role(role, getattr(roles, role), roles.pad_id, recorder, device) for role in names}


def _step(optimizer, loss: torch.Tensor, model: torch.nn.Module, max_norm: float) -> None:
    optimizer.zero_grad()
    if loss.requires_grad:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()


def _padded_batch(trained, data, pad_id: int, drop: int, truncated: bool) -> dict[str, torch.Tensor]:
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


def _pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=rows[0].dtype)
    for b, row in enumerate(rows):
        out[b, : len(row)] = row.cpu()
    return out


def _gather_logprobs(logits: torch.Tensor, pos: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log pi(target | prefix) at the given positions. logits (B, L, V), pos/targets (B, T) -> (B, T)."""
    picked = logits.gather(1, pos[:, :, None].expand(-1, -1, logits.shape[-1]))  # (B, T, V)
    return torch.log_softmax(picked, dim=-1).gather(2, targets[:, :, None]).squeeze(2)
