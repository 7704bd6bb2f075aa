"""The executor: runs the scheduler's plans with real models, one PPO step at a time.

A step reads top to bottom: 1. admit prompts and deal them to the actor group's ranks, 2. streamed scorers take
the sequences in flight, 3. generate in rounds (streaming each round's tokens), 4. score the trained sequences,
5. PPO update, 6. close the step. The driver keeps the scheduling core, the sequences' tokens and the scorers it
holds (the reward model, and roles in their own workers); the actor group (:mod:`oppo.exec.step.rank`) decodes,
scores with the actor and its colocated roles, and trains.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from oppo.catalog.lengths import LengthTrace
from oppo.core.scheduler import Scheduler, StepOutcome
from oppo.exec.compute.timing import Recorder
from oppo.exec.compute.update import cut_at_cap, deal, longest_first, minibatch_totals, minibatches, step_batch
from oppo.exec.config import ExecConfig
from oppo.exec.models.roles import Roles, actor_tokenizer, load_prompts
from oppo.exec.step.evaluation import HeldOut, synthetic_prompts
from oppo.exec.step.parts import local_parts
from oppo.exec.tasks import synthetic
from oppo.exec.tasks.verifiable import DatasetPrompts, Judge, Judgement, RewardFailed
from oppo.records.schema import HOST


class RunAborted(RuntimeError):
    """The run cannot go on (a worker died, ranks diverged); it stops with the records written so far."""


@dataclass
class SeqData:
    prompt: list[int]
    response: list[int] = field(default_factory=list)
    forced_length: int | None = None  # traced response length (EOS forced there), None = natural
    item: int | None = None  # --data: the dataset item the prompt comes from
    behaviour_logprobs: list[float] = field(default_factory=list)  # per response token, at sampling (float64)

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
    actor_grad_norm: float  # before clipping, mean over the step's minibatches
    critic_grad_norm: float
    response_len: float  # mean response tokens of the trained sequences
    # mean per-token entropy of the sampled distribution over the trained tokens (nats; NaN in records written
    # before it was logged)
    entropy: float = math.nan
    # --eval-every: the trained weights' greedy answers to held-out prompts after this step's update (NaN: none)
    held_out_reward: float = math.nan
    held_out_rule_score: float = math.nan
    held_out_len: float = math.nan
    held_out_s: float = 0.0  # wall seconds the evaluation took (outside the step's own timing)
    # async with rollout workers: how the trainer and the rollout met (0 elsewhere)
    trainer_idle_s: float = 0.0  # the trainer waited this long for a generated step
    rollout_idle_s: float = 0.0  # the rollout waited this long before generating it (staleness bound, full queue)
    queue_wait_s: float = 0.0  # from the step's generation end to its training start
    queue_depth: int = 0  # generated steps waiting when the trainer took this one, this one included
    # mean over the trained tokens of (this step - the weights version that generated the token): K without
    # in-flight updates once the run is K steps in, less with them (NaN: not recorded, runs without rollout workers)
    mean_token_lag: float = math.nan
    # the share of trained samples cut at --max-new-tokens without their EOS (NaN: not recorded)
    truncated_frac: float = math.nan
    # mean and largest |p_engine - p_trainer| over the trained tokens (NaN: not recorded, or --rollout-log-probs
    # engine, where the trainer's are not computed)
    rollout_probs_diff_mean: float = math.nan
    rollout_probs_diff_max: float = math.nan
    # --rollout-engine vllm: requests the engine preempted this step (their KV blocks taken back, recomputed later),
    # and the share of prompt tokens its prefix cache held (NaN: the hf loop, which has neither)
    engine_preemptions: float = math.nan
    prefix_cache_hit_rate: float = math.nan


class WeightHistory:
    """``async`` in one process: the actor's weights of the last K + 1 versions (version v: after v updates). Step s
    generates with version max(0, s - K), the oldest a rollout running ahead of training may use (AReaL's bound,
    reached: generation as far ahead as allowed), then training goes on with the newest. Nothing overlaps in time:
    this is the learning side of asynchronous RL (stale samples, their behaviour log-probs, the correction), not its
    speed."""

    def __init__(self, actor: torch.nn.Module, staleness: int) -> None:
        self.actor = actor
        self.versions: deque[dict[str, torch.Tensor]] = deque([self._copy()], maxlen=staleness + 1)
        self.newest = 0  # updates applied

    def _copy(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.actor.state_dict().items()}

    @property
    def generating_version(self) -> int:
        return self.newest - (len(self.versions) - 1)

    def updated(self) -> None:
        self.versions.append(self._copy())
        self.newest += 1

    @contextmanager
    def generating(self):
        """The actor holds the generating version's weights inside, the newest again after."""
        if len(self.versions) == 1:  # K = 0, or the first step: the newest weights generate
            yield
            return
        with torch.no_grad():
            self.actor.load_state_dict(self.versions[0])
            try:
                yield
            finally:
                self.actor.load_state_dict(self.versions[-1])


class Executor:
    # The run's clock stands still while --eval-every evaluates (nothing else runs meanwhile in this process)
    pause_for_evaluation = True

    def __init__(
        self,
        config: ExecConfig,
        group,
        scorers: dict,
        recorder: Recorder,
        token_ids: tuple[int, int, int],
        lengths: LengthTrace | None = None,
    ):
        """``group``: the actor group (:class:`~oppo.exec.step.rank.LocalGroup` or a Ray group, same methods);
        ``scorers``: a handle per scorer role the driver holds (local or remote, same methods); ``token_ids``:
        (padding id, EOS id, vocabulary size)."""
        self.config, self.group, self.scorers, self.rec, self.lengths = config, group, scorers, recorder, lengths
        self.pad_id, self.eos_id, self.vocab_size = token_ids
        self.scheduler = Scheduler(config.schedule)
        self.data: dict[int, SeqData] = {}
        self.rank_of: dict[int, int] = {}  # the rank holding each sequence in flight (and its scorer caches)
        self.streamed_roles = config.streamed_roles
        self.streamed = {role: handle for role, handle in scorers.items() if role in self.streamed_roles}
        self.prompts = load_prompts(config) if config.task.prompts else None  # token ids per line
        self.dataset, self.judge = task_with_answers(config, token_ids[1])  # --data, --reward-fn (else None)
        self.judged: dict[int, Judgement] = {}  # --reward-fn: each sequence's, from when it finished
        self.history = None  # async: the actor's recent versions (one process: the group's one rank)
        if config.schedule.asynchronous and not config.rollout_workers:
            self.history = WeightHistory(group.rank.roles.actor, config.schedule.staleness)
        self.held_out = self._held_out(token_ids) if config.task.eval_every else None
        self.precomputed: dict[str, dict[int, torch.Tensor]] = {}  # role -> seq id -> outputs scored elsewhere

    def _held_out(self, token_ids: tuple[int, int, int]) -> HeldOut:
        """The evaluator of ``--eval-every`` (one process: it scores the live actor); a prompts file gives up its
        last lines to it."""
        n = self.config.task.eval_prompts
        if self.dataset is not None:
            return self._held_out_items(token_ids)
        if self.prompts is not None:
            if len(self.prompts) <= n:
                raise ValueError(f"--eval-prompts {n} leaves no training prompt of the {len(self.prompts)} given")
            self.prompts, held_out = self.prompts[:-n], self.prompts[-n:]
        else:
            held_out = synthetic_prompts(n, self.config.task.prompt_tokens, self.vocab_size, self._seed(5))
        return self._evaluator(held_out, token_ids)

    def _evaluator(self, prompts: list[list[int]], token_ids: tuple[int, int, int], judge=None) -> HeldOut:
        """The held-out evaluator of ``prompts``, sampling as the run does; ``judge``: scores the answers instead of
        the reward model and the rule (:class:`~oppo.exec.step.evaluation.HeldOut`)."""
        cfg, task = self.config, self.config.task
        reward = self.scorers["reward"].model if "reward" in self.scorers else None
        return HeldOut(
            self.group.rank.roles.actor, reward, prompts, token_ids[:2], cfg.schedule.max_new_tokens,
            task.eval_decoding, cfg.ppo.temperature, self._seed(6), task.eval_samples, judge,
            (cfg.ppo.top_k, cfg.ppo.top_p), self._engine_answers(),
        )  # fmt: skip

    def _engine_answers(self):
        """The rollout engine's generation for held-out answers (None: the hf loop decodes them here)."""
        return getattr(self.group.rank.rollout, "answers", None)

    def _held_out_items(self, token_ids: tuple[int, int, int]) -> HeldOut:
        """``--eval-every`` on a task with answers: ``--val-data`` (its first ``--eval-prompts``, 0: all), or the
        last ``--eval-prompts`` items of ``--data``, left out of training."""
        task = self.config.task
        if task.val_data:
            cap, tokenizer = task.max_prompt_tokens, self.dataset.tokenizer
            held = DatasetPrompts(task.val_data, tokenizer, task.chat_template, cap, task.prompt_truncation)
            indices = list(range(len(held)))[: task.eval_prompts or None]
        else:
            held, indices = self.dataset, self.dataset.split_last(task.eval_prompts)
        samples = task.eval_samples

        def judge(answers: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
            if self.judge is None:  # a reward model scores; no answer check
                reward = self.held_out._scores(answers)[0]
                return reward, torch.full_like(reward, math.nan)
            try:
                verdicts = [
                    self.judge(held.items[indices[k // samples]], answer, f"held-out item {indices[k // samples]}")
                    for k, answer in enumerate(answers)
                ]
            except RewardFailed as err:
                raise RunAborted(f"held-out evaluation: {err}") from err
            return torch.tensor([v.reward for v in verdicts]), torch.tensor([v.correct for v in verdicts])

        return self._evaluator([held.prompts[i] for i in indices], token_ids, judge)

    @classmethod
    def colocated(cls, config: ExecConfig, roles: Roles, recorder: Recorder, lengths: LengthTrace | None = None):
        """Every role in this process, on ``roles.device``."""
        group, scorers = local_parts(config, roles, recorder)
        return cls(config, group, scorers, recorder, (roles.pad_id, roles.eos_id, roles.vocab_size), lengths)

    def _seed(self, *parts: int) -> int:
        return derived_seed(self.config.seed, *parts)

    # -- one step ---------------------------------------------------------------------------------------
    def step(self) -> tuple[StepOutcome, StepMetrics]:
        rec, sched, group = self.rec, self.scheduler, self.group
        plan = sched.plan_step(rec.now(), None if self.history is None else self.history.generating_version)
        # 1. admit the new prompts and deal every sequence in flight to a rank
        for seq_id in plan.new:
            self.data[seq_id] = self._new_sequence(seq_id)
        self._restart(plan.restarted)
        self._deal(plan)
        # 2. a critic scoring elsewhere gets this step's weights; streamed scorers take every sequence in flight
        #    (carried ones keep a frozen scorer's cache)
        if "critic" in self.scorers:
            self.scorers["critic"].sync_weights(plan.step, group.first("state", "critic"))
        contexts = [(i, self.data[i].tokens, len(self.data[i].prompt)) for i in plan.active]
        for scorer in self.streamed.values():
            scorer.begin(plan.step, contexts)
        with self.history.generating() if self.history else contextlib.nullcontext():
            group.call(
                "begin",
                [
                    (plan.step, self._mine(r, contexts), self._decoding(r, plan), self.streamed_roles)
                    for r in range(group.size)
                ],
            )
            # 3. generation in rounds; every complete chunk is streamed to the scorers
            self._generate(plan)
            group.send("halt", [(plan.step,)] * group.size)  # an engine stops what the step will not take
        # 4. score the trained sequences
        trained = sched.select()
        scores = self._score(plan.step, trained)
        # 5. PPO update
        losses = self._train(plan.step, trained, scores)
        cut = cut_at_cap(trained, self.data, self.config.schedule.max_new_tokens, self.eos_id)
        if self.history:
            self.history.updated()
        # 6. close the step
        outcome = sched.close_step(rec.now(), scores["mean_reward"])
        carried = list(outcome.carried)
        group.send("end", [(carried,)] * group.size)
        for scorer in self.scorers.values():
            scorer.end(carried)
            for row in scorer.collect():
                rec.add(row)
        for row in group.collect():
            rec.add(row)
        if self.config.check_ranks:
            self._check_ranks(plan.step)
        for t in outcome.trained:
            if t.finished:
                del self.data[t.seq_id], self.rank_of[t.seq_id]
        metrics = StepMetrics(
            plan.step,
            scores["mean_reward"],
            scores["rule_score"],
            scores["kl"],
            *losses[:4],
            response_len=float(np.mean([t.response_tokens for t in trained])),
            entropy=losses[4],
            truncated_frac=float(cut.float().mean()),
            **self._mismatch(scores),
            **engine_metrics(group.first("engine_stats")),
        )
        return outcome, self._held_out_metrics(plan.step, metrics)

    def _mismatch(self, scores: dict) -> dict[str, float]:
        """The engine-trainer probability gap of the step; none where the engine's log-probs were the old ones."""
        if self.config.rollout.rollout_log_probs == "engine":
            return {}
        return {key: scores[key] for key in ("rollout_probs_diff_mean", "rollout_probs_diff_max")}

    def _held_out_metrics(self, step: int, metrics: StepMetrics) -> StepMetrics:
        """``metrics`` with the held-out scores of the trained weights, on the steps ``--eval-every`` names."""
        if not self.held_out or (step + 1) % self.config.task.eval_every:
            return metrics
        with self.rec.paused() if self.pause_for_evaluation else contextlib.nullcontext():
            held = self.held_out.score()
        return dataclasses.replace(
            metrics,
            held_out_reward=held.reward,
            held_out_rule_score=held.rule_score,
            held_out_len=held.response_len,
            held_out_s=held.seconds,
        )

    def _restart(self, seq_ids) -> None:
        """tailbatch: aborted samples are generated again from their prompts; what they had (their tokens, and the
        verdict on an answer finished before the abort) is discarded."""
        for seq_id in seq_ids:
            self.data[seq_id].response, self.data[seq_id].behaviour_logprobs = [], []
            self.judged.pop(seq_id, None)

    def evaluate_start(self) -> dict[str, float] | None:
        """``--eval-every``: the held-out scores of the weights before any update (None without evaluation)."""
        if not self.held_out:
            return None
        with self.rec.paused() if self.pause_for_evaluation else contextlib.nullcontext():
            held = self.held_out.score()
        return {"reward": held.reward, "rule_score": held.rule_score, "response_len": held.response_len}

    def _new_sequence(self, seq_id: int) -> SeqData:
        group = self.scheduler.buffer.group_id[seq_id]  # the samples of a group answer one prompt
        item = None
        if self.dataset is not None:  # epochs over the dataset, each shuffled
            item = self.dataset.item_of_group(group, self.config.seed)
            prompt = self.dataset.prompts[item]
        elif self.prompts is not None:  # the prompts file, cycled in order
            prompt = self.prompts[group % len(self.prompts)]
        else:
            g = torch.Generator().manual_seed(self._seed(1, group))
            prompt = synthetic.random_prompts(g, 1, self.config.task.prompt_tokens, self.vocab_size)[0]
        forced = None
        if self.lengths is not None:
            forced = forced_length(self.lengths, self.config.seed, seq_id, self.config.schedule.max_new_tokens)
        return SeqData(prompt=prompt, forced_length=forced, item=item)

    def _deal(self, plan) -> None:
        """Sequences new to the group go to the rank with the least expected work (the tokens it will prefill
        plus the most it may decode this step, longest first); carried ones stay where their caches are."""
        work = {i: len(self.data[i].tokens) + plan.budgets.get(i, 0) for i in plan.active}
        load = [0] * self.group.size
        for i in plan.active:
            if i in self.rank_of:
                load[self.rank_of[i]] += work[i]
        new = [i for i in plan.active if i not in self.rank_of]
        self.rank_of.update(zip(new, longest_first([work[i] for i in new], self.group.size, load)))

    def _mine(self, rank: int, rows: list[tuple]) -> list[tuple]:
        """The rows (seq id first) of sequences dealt to ``rank``."""
        return [row for row in rows if self.rank_of[row[0]] == rank]

    def _decoding(self, rank: int, plan) -> list[tuple]:
        """What ``rank`` decodes this step: (seq id, budget, sampling key, forced length, response tokens)."""
        return [
            (i, plan.budgets[i], self._seed(3, i), self.data[i].forced_length, len(self.data[i].response))
            for i in plan.active
            if i in plan.budgets and self.rank_of[i] == rank
        ]

    def _generate(self, plan) -> None:
        rec, sched, group = self.rec, self.scheduler, self.group
        if not any(i in plan.budgets for i in plan.active):
            return
        unstreamed: dict[int, list[int]] = {}  # tokens decoded since the last streamed chunk
        while not sched.generation_done:
            n = sched.next_round_tokens()
            finished: dict[int, int] = {}
            for done, new, logprobs in group.call("decode", [(plan.step, n)] * group.size):  # every rank decodes
                finished |= done
                for seq_id, tokens in new.items():
                    self.data[seq_id].response.extend(tokens)
                    self.data[seq_id].behaviour_logprobs.extend(logprobs[seq_id])
                    unstreamed.setdefault(seq_id, []).extend(tokens)
            if self.judge is not None:  # a rule reward scores each sequence as it finishes (on the host)
                self._judge(plan.step, list(finished))
            sched.report_round(rec.now(), n, finished)  # over-commit stops every rank at the same check
            if sched.stream_now:
                group.send("stream", [(plan.step,)] * group.size)  # ranks feed their own scorers
                for scorer in self.streamed.values():
                    scorer.feed(plan.step, unstreamed)  # a remote scorer prefills while the next rounds decode
                unstreamed = {}

    def _score(self, step: int, trained) -> dict:
        """Old log-probs (current policy), reference log-probs, values and scores of the trained sequences.
        The driver's scorers are asked first, so remote ones work while the ranks score theirs."""
        seqs = [(t.seq_id, self.data[t.seq_id].tokens, len(self.data[t.seq_id].prompt)) for t in trained]
        ids = [t.seq_id for t in trained]
        pending = {
            role: scorer.outputs(step, ids) if role in self.streamed else scorer.score(step, seqs)
            for role, scorer in self.scorers.items()
        }
        by_id: dict[str, dict[int, torch.Tensor]] = {}
        shares = [self._mine(r, seqs) for r in range(self.group.size)]
        for share, outputs in zip(shares, self.group.call("score", [(step, share) for share in shares])):
            for role, tensors in outputs.items():
                by_id.setdefault(role, {}).update(zip((s[0] for s in share), tensors))
        out = {role: [rows[i] for i in ids] for role, rows in by_id.items()}
        out |= {role: [t.cpu() for t in p.get()] for role, p in pending.items()}
        out |= {role: [rows.pop(i) for i in ids] for role, rows in self.precomputed.items()}
        behaviour = [torch.tensor(self.data[i].behaviour_logprobs, dtype=torch.float64) for i in ids]
        if "actor" not in out:  # --rollout-log-probs engine: the sampled tokens' log-probs as the engine gave them
            out["actor"] = [b.to(r.dtype) for b, r in zip(behaviour, out["reference"])]
        if self.dataset is not None:
            score, rule = self._dataset_scores(step, trained, out.get("reward"))
        else:
            rule = synthetic.rule_score([self.data[i].response for i in ids])
            score = torch.stack(out["reward"]).float() if "reward" in out else rule
        finished = torch.tensor([t.finished for t in trained])
        shown = score[finished] if finished.any() else score
        kl = torch.cat([a - r for a, r in zip(out["actor"], out["reference"])]).float()
        return {
            **probs_diff(out["actor"], behaviour),
            "old_logprobs": out["actor"],
            "behaviour_logprobs": behaviour,
            "ref_logprobs": out["reference"],
            "values": out.get("critic"),
            "score": score,
            "mean_reward": float(shown.mean()),
            "rule_score": float(rule.nanmean()) if not rule.isnan().all() else math.nan,
            "kl": float(kl.mean()),
        }

    def _judge(self, step: int, seq_ids: list[int]) -> None:
        """Score ``seq_ids`` with the reward function, once each; recorded as the reward role's scoring."""
        todo = [i for i in seq_ids if i not in self.judged]
        if not todo:
            return
        with self.rec.op(step, HOST, "reward", "score", batch=len(todo)) as info:
            info["tokens"] = sum(len(self.data[i].response) for i in todo)
            for i in todo:
                seq = self.data[i]
                try:
                    self.judged[i] = self.judge(self.dataset.items[seq.item], seq.response, f"sequence {i}")
                except RewardFailed as err:
                    raise RunAborted(f"step {step}: {err}") from err

    def _dataset_scores(self, step: int, trained, reward_model) -> tuple[torch.Tensor, torch.Tensor]:
        """(reward, answer check) of the trained sequences of a task with answers: the reward function's on the
        finished ones (those cut at the cap are judged now), or the reward model's with no answer check. A T-PPO
        segment of an unfinished sequence has no answer yet: reward 0 (unused: it bootstraps) and no check."""
        if self.judge is None:
            score = torch.stack(reward_model).float()
            return score, torch.full_like(score, math.nan)
        self._judge(step, [t.seq_id for t in trained if t.finished])
        unanswered = Judgement(0.0, math.nan)
        verdicts = [self.judged.pop(t.seq_id) if t.finished else unanswered for t in trained]
        return torch.tensor([v.reward for v in verdicts]), torch.tensor([v.correct for v in verdicts])

    def _train(self, step: int, trained, scores: dict) -> tuple[float, ...]:
        """``epochs`` x ``minibatches`` synchronous data-parallel steps; the means of the (policy, value) loss, the
        (actor, critic) gradient norm and the policy's entropy over its minibatches."""
        batch = step_batch(self.config, trained, self.data, scores, self.pad_id, self.eos_id)
        losses = []
        for mb in minibatches(len(trained), self.config.ppo, self._seed(4, step)):
            totals = minibatch_totals(batch, mb)
            shares = deal(mb, batch["attn"][mb].sum(1), self.group.size)
            if self.config.shard and not all(len(share) for share in shares):  # (the config check rules it out)
                raise RunAborted(f"step {step}: a rank has no row of a minibatch of {len(mb)}; sharded, it would hang")
            parts = [(step, {k: v[share] for k, v in batch.items()}, totals) for share in shares]
            results = self.group.call("train", parts)
            # the ranks' loss and entropy terms summed; rank 0's norms (every rank's are the same)
            p_loss, v_loss, mean_entropy = np.sum(results, axis=0)[:3]
            losses.append((p_loss, v_loss, *results[0][3:], mean_entropy))
        return tuple(float(x) for x in np.mean(losses, axis=0))  # policy, value loss; actor, critic norm; entropy

    def _check_ranks(self, step: int) -> None:
        digests = self.group.call("digest", [()] * self.group.size)
        if len(set(digests)) > 1:
            raise RunAborted(f"step {step}: the ranks' weights differ (digests {', '.join(digests)})")

    def close(self) -> None:
        self.group.close()


def engine_metrics(stats) -> dict[str, float]:
    """A step's ``engine_preemptions`` and ``prefix_cache_hit_rate`` from the engine's counts (None: no engine)."""
    if stats is None:
        return {}
    return {"engine_preemptions": float(stats.preemptions), "prefix_cache_hit_rate": stats.prefix_hit_rate}


def probs_diff(trainer: list[torch.Tensor], engine: list[torch.Tensor]) -> dict[str, float]:
    """The mean and the largest |p_engine - p_trainer| over the sampled tokens (verl's rollout_probs_diff_*): how far
    the probabilities the rollout sampled with are from the ones the trainer computes for the same weights and tokens
    (0 to rounding for the hf loop, which samples from the trainer's own forward passes)."""
    # an EOS put at a traced length (--lengths on an engine) has no engine log-prob (NaN): left out; a NaN of the
    # trainer's stays in, and shows
    diff = torch.cat([(t.double().exp() - e.double().exp()).abs()[~e.isnan()] for t, e in zip(trainer, engine)])
    if not len(diff):
        return {"rollout_probs_diff_mean": math.nan, "rollout_probs_diff_max": math.nan}
    return {"rollout_probs_diff_mean": float(diff.mean()), "rollout_probs_diff_max": float(diff.max())}


def task_with_answers(config: ExecConfig, eos_id: int) -> tuple[DatasetPrompts | None, Judge | None]:
    """``--data``'s prompts and ``--reward-fn``'s judge, each None where not given."""
    task = config.task
    if not task.data:
        return None, None
    tokenizer = actor_tokenizer(config.model)
    dataset = DatasetPrompts(task.data, tokenizer, task.chat_template, task.max_prompt_tokens, task.prompt_truncation)
    return dataset, Judge(task.reward_fn, tokenizer, eos_id) if task.reward_fn else None


def derived_seed(seed: int, *parts: int) -> int:
    """A seed for one purpose (``parts``) of a run, independent of how many draws other purposes made."""
    return (seed * 1_000_003 + sum(p * 7919**i for i, p in enumerate(parts, 1))) % 2**62


def forced_length(lengths: LengthTrace, seed: int, seq_id: int, cap: int) -> int:
    """The traced response length forced on sequence ``seq_id`` (EOS included), within [1, cap]."""
    traced = lengths.sample(np.random.default_rng(derived_seed(seed, 2, seq_id)), 1)[0][0]
    return int(min(max(traced, 1), cap))
