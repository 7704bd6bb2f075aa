"""A task of prompts with answers (``--data``) and its verifiable reward (``--reward-fn``).

:class:`DatasetPrompts` holds a dataset's items and their prompts as the actor's token ids (chat template applied,
capped at ``--max-prompt-tokens``), and deals them to the groups of a run in epochs, each epoch a new permutation drawn
from the run's seed (a run's prompts depend on its seed and the group's position alone, as verl's shuffled
sampler). :class:`Judge` scores a response as verl's reward managers do: the response decoded to text without its
special tokens, passed with the item's ``data_source``, ``ground_truth`` and ``extra_info`` to the reward function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oppo.exec.tasks.datasets import PromptItem, encode_prompt, load_items
from oppo.exec.tasks.rewards import SHAPING_ONLY, finite, load_reward_fn, score_value


def _first_line(err: BaseException) -> str:
    """The first line of an exception's text ("" where its own ``__str__`` fails: a user's class may break it)."""
    try:
        return (str(err).splitlines() or [""])[0]
    except Exception:
        return ""


class RewardFailed(RuntimeError):
    """The reward function raised or returned no number for a sample: the run cannot go on."""


@dataclass(frozen=True)
class Judgement:
    reward: float  # what the policy is trained on
    # the answer check alone: the function's "acc" where its dict carries one (verl's math_dapo does), NaN for a
    # shaping-only built-in (format), else the reward itself
    correct: float


class DatasetPrompts:
    """The items of a dataset file and each one's prompt as token ids."""

    def __init__(self, path: str | Path, tokenizer, chat_template: str, max_tokens: int, truncation: str):
        self.path, self.tokenizer = Path(path), tokenizer
        self.items: list[PromptItem] = load_items(self.path)
        self.trained = len(self.items)  # items dealt to training: the first ones
        self.prompts: list[list[int]] = []
        for index, item in enumerate(self.items):
            try:
                self.prompts.append(encode_prompt(item, tokenizer, chat_template, max_tokens, truncation, index))
            except ValueError as err:
                raise ValueError(
                    f"{self.path}: {err}; raise --max-prompt-tokens or give --prompt-truncation left"
                ) from None
            if not self.prompts[-1]:
                raise ValueError(f"{self.path}: row {index}: the prompt has no token")

    def __len__(self) -> int:
        return len(self.items)

    def split_last(self, n: int) -> list[int]:
        """Hold out the last ``n`` items (never trained); their indices."""
        if len(self.items) <= n:
            raise ValueError(f"--eval-prompts {n} leaves no training prompt of the {len(self.items)} in {self.path}")
        self.trained = len(self.items) - n
        return list(range(self.trained, len(self.items)))

    def item_of_group(self, group: int, seed: int) -> int:
        """The item group ``group`` (0, 1, ... in admission order) answers: position ``group mod n`` of its
        epoch's permutation."""
        epoch, position = divmod(group, self.trained)
        order = np.random.default_rng([seed, 7, epoch]).permutation(self.trained)
        return int(order[position])


class Judge:
    """Scores decoded responses with a reward function of verl's signature."""

    def __init__(self, spec: str, tokenizer, eos_id: int) -> None:
        self.spec, self.fn, self.tokenizer, self.eos_id = spec, load_reward_fn(spec), tokenizer, eos_id
        self.shaping_only = spec in SHAPING_ONLY

    def text(self, response: list[int]) -> str:
        """The response as the reward function reads it: without its closing EOS and special tokens."""
        tokens = response[:-1] if response and response[-1] == self.eos_id else response
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def __call__(self, item: PromptItem, response: list[int], sample: str) -> Judgement:
        """``sample`` names the response in an error (e.g. "sequence 12 of step 3")."""
        try:
            result = self.fn(
                data_source=item.data_source,
                solution_str=self.text(response),
                ground_truth=item.ground_truth,
                extra_info=item.extra_info,
            )
            reward = score_value(result)
            correct = (
                finite(result["acc"], "a reward dict's 'acc'")
                if isinstance(result, dict) and "acc" in result
                else reward
            )
        except (Exception, SystemExit) as err:  # whatever a user's function raises, sys.exit() too: one line
            raise RewardFailed(
                f"reward function {self.spec} on {sample}: {type(err).__name__}: {_first_line(err)}"
            ) from err
        return Judgement(reward, math.nan if self.shaping_only else correct)
