"""Held-out evaluation: the trained actor's answers to fixed prompts, scored.

The rewards of the samples a step trains on describe the weights that generated them: under ``async`` those are up
to K versions older than the learner's, so they lag the learner (and a learner that improves looks worse than it
is by about K steps of progress). Scoring the trained weights themselves on prompts no step trains on measures the
learner: the comparison of sync, OPPO and async that staleness arguments need.

Answers are sampled with the same noise at every evaluation (fixed sampling keys: common random numbers), so two
evaluations differ by the weights alone, or decoded greedily. Greedy decoding suits a task with one best answer; on
the default task it stops at once (EOS is the single most likely token of a policy whose content tokens spread over
the vocabulary), so sampling is the default.

Held-out prompts are synthetic prompts drawn from their own seed stream; with ``--prompts`` or ``--data``, the
file's last ``--eval-prompts`` prompts (then left out of training); with ``--val-data``, that file's. A task with
answers (``--data`` and ``--reward-fn``) is judged by its reward function: ``rule_score`` is then the answer check
alone (accuracy), the mean over ``--eval-samples`` answers per prompt when sampling (mean@n).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from oppo.exec.compute.scoring import score_once
from oppo.exec.engines.hf import ChunkedDecoder
from oppo.exec.tasks import synthetic


@dataclass(frozen=True)
class HeldOutScore:
    reward: float  # the mean reward of the answers: the reward model's, the reward function's or the rule's
    rule_score: float  # the task's ground-truth score (with a reward function: the answer check, accuracy)
    response_len: float  # mean answer tokens, EOS included
    seconds: float  # wall time of the evaluation (outside every step's timing)


NOT_EVALUATED = HeldOutScore(math.nan, math.nan, math.nan, 0.0)


# (prompts, token budget, sampling keys, greedy) -> each prompt's answer: a rollout engine's generation
Generate = Callable[[list[list[int]], int, list[int], bool], list[list[int]]]

# (answers, one per held-out prompt in order) -> (reward, answer check) per answer, each of shape (N,)
Judge = Callable[[list[list[int]]], tuple[torch.Tensor, torch.Tensor]]


class HeldOut:
    """Scores ``actor`` (a live module: the weights the last update wrote) on ``prompts`` (token ids per prompt)."""

    def __init__(
        self,
        actor,
        reward,
        prompts: list[list[int]],
        token_ids: tuple[int, int],
        max_new_tokens: int,
        decoding: str = "sample",
        temperature: float = 1.0,
        seed: int = 0,
        samples: int = 1,
        judge: Judge | None = None,
        cut: tuple[int, float] = (0, 1.0),
        generate: Generate | None = None,
    ):
        """``reward``: the reward model, or None for the rule; ``token_ids``: (padding id, EOS id); ``seed``: the
        sampling keys' (the same at every evaluation); ``samples``: answers per prompt; ``judge``: scores the
        answers instead of the reward model and the rule (a task with answers), called with ``samples`` answers
        per prompt, prompt by prompt; ``cut``: the sampling's (top_k, top_p); ``generate``: a rollout engine's
        answers (its own sampling: the same keys give the same noise only within that engine), else the hf loop's."""
        self.actor, self.reward, self.max_new_tokens = actor, reward, max_new_tokens
        self.prompts = [p for p in prompts for _ in range(samples)]
        self.pad_id, self.eos_id = token_ids
        self.greedy, self.temperature, self.judge, self.cut = decoding == "greedy", temperature, judge, cut
        self.keys = [(seed * 7919 + i) % 2**62 for i in range(len(self.prompts))]  # int64 keys whatever the seed
        self.generate = generate

    @torch.no_grad()
    def score(self) -> HeldOutScore:
        start = time.perf_counter()
        answers = self.answers()
        reward, rule = self.judge(answers) if self.judge is not None else self._scores(answers)
        return HeldOutScore(
            float(reward.mean()),
            float(rule.mean()),
            sum(map(len, answers)) / len(answers),
            time.perf_counter() - start,
        )

    def _scores(self, answers: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The reward model's scores (the rule's without one) and the rule's, per answer."""
        rule = synthetic.rule_score(answers)
        if self.reward is None:
            return rule, rule
        seqs = [(i, p + a, len(p)) for i, (p, a) in enumerate(zip(self.prompts, answers))]
        return torch.stack(score_once(self.reward, "reward", seqs, self.pad_id)).double(), rule

    def answers(self) -> list[list[int]]:
        """Each prompt's answer, until EOS or the cap."""
        if self.generate is not None:
            return self.generate(self.prompts, self.max_new_tokens, self.keys, self.greedy)
        budgets = [self.max_new_tokens] * len(self.prompts)
        decoder = ChunkedDecoder(
            self.actor,
            self.prompts,
            budgets,
            self.eos_id,
            self.pad_id,
            self.keys,
            temperature=self.temperature,
            greedy=self.greedy,
            top_k=self.cut[0],
            top_p=self.cut[1],
        )
        decoder.decode(self.max_new_tokens)
        return decoder.new_tokens


def synthetic_prompts(n: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """``n`` held-out synthetic prompts drawn with ``seed`` (a stream no training prompt is drawn from)."""
    return synthetic.random_prompts(torch.Generator().manual_seed(seed), n, length, vocab_size)
