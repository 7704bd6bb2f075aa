"""``python -m oppo.exec.tasks.arithmetic``: a verifiable task a 135M instruct model learns on a CPU in tens of steps.

    python -m oppo.exec.tasks.arithmetic --out data/add --train 2000 --val 200 --seed 0
    python -m oppo.exec.train --preset smollm2 --data data/add/train.jsonl --val-data data/add/val.jsonl \\
        --reward-fn gsm8k --algo grpo --eval-every 5 --max-prompt-tokens 96 --max-new-tokens 48 --out runs/add

One-step addition word problems in GSM8K's form ("Tom has 12 pens. Tom gets 7 more pens. How many pens does Tom
have now? Give the final answer after ####."), the answer a bare number scored by verl's gsm8k check (the strict
``#### N``). Why this task: SmolLM2-135M-Instruct (Q4_1) answers 12.5% of 48 of them right greedily with a 48-token
cap (14.6% reading the last number written; docs/executor.md has the measurement): well above 0, so groups of
samples disagree and GRPO has a signal, and well below 1. Its errors are ones RL can remove: it subtracts, or talks
past the cap before it writes ``####``.

Rows are in verl's schema (``prompt`` as chat messages, ``data_source``, ``reward_model.ground_truth``,
``extra_info``), written as JSON lines. The same seed writes the same files. Validation holds its own pairs of
addends: no validation problem has the numbers of a training problem, in either order (names and objects aside,
which change nothing of the sum), so held-out accuracy measures adding numbers not seen in training, not recalling
a trained problem's answer.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

from oppo.cli import run_cli
from oppo.records.io import atomic_write_text

DATA_SOURCE = "oppo/addition"
NAMES = ("Tom", "Ann", "Sam", "Lily", "Ben", "Mia", "Leo", "Zoe")
OBJECTS = ("apples", "pens", "books", "coins", "cards", "stickers", "shells", "marbles")
LOW, HIGH = 2, 20  # the two addends' range (inclusive)
QUESTION = "{n} has {a} {o}. {n} gets {b} more {o}. How many {o} does {n} have now? Give the final answer after ####."


def problems(train: int, val: int, seed: int) -> tuple[list, list]:
    """``train`` and ``val`` distinct problems (a, b, name, object), in a seeded order, the validation ones on
    pairs {a, b} of their own: the pairs are shuffled and split in proportion to the two counts."""
    rng = random.Random(seed)
    pairs = sorted({(min(a, b), max(a, b)) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)})
    rng.shuffle(pairs)
    # the pairs split in proportion, each side with a pair where it has a problem
    cut = min(max(math.ceil(len(pairs) * val / (train + val)), 1 if val else 0), len(pairs) - (1 if train else 0))
    chosen = []
    for part, count in ((pairs[:cut], val), (pairs[cut:], train)):
        space = [(a, b, n, o) for x, y in part for a, b in {(x, y), (y, x)} for n in NAMES for o in OBJECTS]
        if count > len(space):
            raise ValueError(f"{train} training and {val} validation problems do not fit the {len(pairs)} pairs")
        chosen.append(rng.sample(sorted(space), count))
    val_problems, train_problems = chosen
    return train_problems, val_problems


def row(problem: tuple[int, int, str, str], split: str, index: int) -> dict:
    a, b, name, obj = problem
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": QUESTION.format(n=name, a=a, b=b, o=obj)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": split, "index": index},
    }


def write(out: Path, train: int, val: int, seed: int) -> dict[str, Path]:
    """Write ``out/train.jsonl`` and ``out/val.jsonl``; their paths."""
    files = {}
    for split, part in zip(("train", "val"), problems(train, val, seed)):
        text = "".join(json.dumps(row(p, split, i)) + "\n" for i, p in enumerate(part))
        files[split] = out / f"{split}.jsonl"
        atomic_write_text(files[split], text)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oppo.exec.tasks.arithmetic", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for train.jsonl and val.jsonl")
    parser.add_argument("--train", type=int, default=2000, help="training problems (default: 2000)")
    parser.add_argument("--val", type=int, default=200, help="validation problems, none of them trained (default: 200)")
    parser.add_argument("--seed", type=int, default=0, help="which problems, in which order (default: 0)")
    args = parser.parse_args(argv)
    if args.train < 1 or args.val < 0:
        raise ValueError("--train must be >= 1 and --val >= 0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = write(out, args.train, args.val, args.seed)
    print(f"{args.train} training and {args.val} validation problems -> {files['train']}, {files['val']}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
