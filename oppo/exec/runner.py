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
from oppo.exec.scoring import LocalScorer, score_once
from oppo.exec.timing import Recorder
from oppo.exec.update import Learner
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
        self.learner = Learner(config, roles, recorder, self.device)
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
        losses = self.learner.train(plan.step, trained, self.data, scores, self._seed(4, plan.step))
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
        group = self.scheduler.buffer.seqs[seq_id].group_id  # the samples of a group answer one prompt
        if self.prompts is not None:  # the dataset, cycled in order
            prompt = self.prompts[group % len(self.prompts)]
        else:
            g = torch.Generator().manual_seed(self._seed(1, group))
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
                [self._seed(3, i) for i in rows],  # sampling keyed by sequence: independent of the batch
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
        return {"old_logprobs": out["actor"], "ref_logprobs": out["reference"], "values": out.get("critic"),
                "score": score, "mean_reward": float(shown.mean()), "rule_score": float(rule.mean()),
                "kl": float(kl.mean())}  # fmt: skip


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
    """Scorer roles in this process: reference, the critic (PPO), and the reward model unless it is a rule."""
    names = ["reference"] + (["critic"] if config.schedule.algo == "ppo" else [])
    names += ["reward"] if config.task.reward_kind == "learned" else []
    device = device_name(roles.device)
    return {role: LocalScorer.for_role(role, getattr(roles, role), roles.pad_id, recorder, device) for role in names}
