"""Generation speed of the two rollout engines on the same model and prompts: the hf decode loop against vLLM's
engine (in its own process), sampled tokens at natural lengths up to the cap.

    python -m oppo.exec.tasks.arithmetic --out data/add
    python benchmarks/rollout_engines.py --data data/add/train.jsonl --prompts 8 --samples 8 --repeats 3

Each round generates the same requests on both engines, in turn (each round starts with the other engine), so that
the machine's drift falls on both alike. Prints per engine the median tokens per second over the rounds with the
spread (min-max), and the median of the rounds' vllm / hf ratios. The engine's load is timed apart (it is paid once
a run). Then what is reproducible: the same requests with the same sampling keys sampled again, as one batch and
each alone, counted against their first tokens (the hf loop's sampling noise is keyed by sequence and position, so
it is batch independent by construction; vLLM's per-request generator is seeded by the key, and its kernels may
reduce in another order when the batch changes).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oppo.exec.compute.rollout import make_rollout  # noqa: E402
from oppo.exec.compute.timing import Recorder  # noqa: E402
from oppo.exec.config import (  # noqa: E402
    ExecConfig,
    ModelConfig,
    PPOConfig,
    RolloutConfig,
    TaskConfig,
    default_schedule,  # noqa: E402
)
from oppo.exec.models.roles import actor_tokenizer, load_roles  # noqa: E402
from oppo.exec.tasks.verifiable import DatasetPrompts  # noqa: E402

ENGINES = ("hf", "vllm")


def config_for(engine: str, args) -> ExecConfig:
    return ExecConfig(
        schedule=default_schedule(max_new_tokens=args.max_new_tokens),
        model=ModelConfig(preset="smollm2", threads=args.threads),
        ppo=PPOConfig(temperature=args.temperature),
        task=TaskConfig(data=args.data, reward_fn="gsm8k", max_prompt_tokens=args.max_prompt_tokens),
        rollout=RolloutConfig(rollout_engine=engine, engine_eager=args.eager),
    )


def sample(rollout, prompts: list[list[int]], budget: int, seed: int, only: list[int] | None = None) -> dict:
    """Each request's tokens ({index: tokens}), decoded until EOS or ``budget``; ``only``: these requests alone."""
    keys = [seed * 1_000_003 + i for i in range(len(prompts))]
    decoding = [(i, budget, keys[i], None, 0) for i in (range(len(prompts)) if only is None else only)]
    rollout.begin(0, dict(enumerate(prompts)), decoding)
    out: dict[int, list[int]] = {i: [] for i, *_ in decoding}
    while True:
        _, new, _ = rollout.decode(0, budget)
        if not new:
            break
        for i, tokens in new.items():
            out[i] += tokens
    rollout.end()
    return out


def generate(rollout, prompts: list[list[int]], budget: int, seed: int) -> tuple[float, int]:
    """(seconds, tokens generated) of one batch of requests, each decoded until EOS or ``budget``."""
    start = time.perf_counter()
    tokens = sum(map(len, sample(rollout, prompts, budget, seed).values()))
    return time.perf_counter() - start, tokens


def reproducibility(rollout, prompts: list[list[int]], budget: int) -> tuple[int, int]:
    """Of the requests sampled twice with the same keys: (as the same batch again, each alone), how many got the same
    tokens as the first time."""
    first = sample(rollout, prompts, budget, seed=99)
    again = sample(rollout, prompts, budget, seed=99)
    alone = {i: sample(rollout, prompts, budget, seed=99, only=[i])[i] for i in range(len(prompts))}
    return sum(again[i] == first[i] for i in first), sum(alone[i] == first[i] for i in first)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="prompts with answers (the arithmetic task's train.jsonl)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8, help="requests per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-prompt-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of this process (the hf loop's)")
    parser.add_argument("--eager", action="store_true", help="vLLM without torch.compile")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    configs = {engine: config_for(engine, args) for engine in ENGINES}
    torch.set_num_threads(args.threads)
    roles = load_roles(configs["hf"].model, which=("actor",))
    tokenizer = actor_tokenizer(configs["hf"].model)
    data = DatasetPrompts(args.data, tokenizer, "auto", args.max_prompt_tokens, "error")
    prompts = [p for p in data.prompts[: args.prompts] for _ in range(args.samples)]
    rollouts, load_s = {}, {}
    for engine in ENGINES:
        start = time.perf_counter()
        rollouts[engine] = make_rollout(configs[engine], roles.actor, roles.eos_id, roles.pad_id, Recorder(), "cpu0")
        load_s[engine] = time.perf_counter() - start
    rates = {engine: [] for engine in ENGINES}
    try:
        for r in range(args.repeats):
            for engine in ENGINES[r % 2 :] + ENGINES[: r % 2]:
                seconds, tokens = generate(rollouts[engine], prompts, args.max_new_tokens, r)
                rates[engine].append(tokens / seconds)
        same = {engine: reproducibility(rollouts[engine], prompts, args.max_new_tokens) for engine in ENGINES}
    finally:
        for rollout in rollouts.values():
            rollout.close()
    shape = f"{args.prompts} prompts x {args.samples} samples, cap {args.max_new_tokens}, T {args.temperature}"
    print(f"\nsmollm2 generation: {shape}, {args.repeats} interleaved round(s); vLLM loaded in {load_s['vllm']:.1f} s")
    print(f"{'engine':<8} {'tokens/s (min-max)':>24}")
    for engine in ENGINES:
        t = np.asarray(rates[engine])
        print(f"{engine:<8} {np.median(t):>10.1f} ({t.min():.1f}-{t.max():.1f})")
    ratios = np.asarray(rates["vllm"]) / np.asarray(rates["hf"])
    print(f"vllm / hf: {np.median(ratios):.2f}x ({ratios.min():.2f}-{ratios.max():.2f})")
    print("the same requests with the same sampling keys, against their first tokens:")
    for engine, (again, alone) in same.items():
        n = len(prompts)
        print(f"{engine:<8} as the same batch again: {again} of {n} identical; each alone: {alone} of {n} identical")


if __name__ == "__main__":
    main()
