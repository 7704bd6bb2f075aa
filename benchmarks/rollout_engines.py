"""Generation speed of the two rollout engines on the same model and prompts: the hf decode loop against vLLM's
engine (in its own process), sampled tokens at natural lengths up to the cap.

    python -m oppo.exec.tasks.arithmetic --out data/add
    python benchmarks/rollout_engines.py --data data/add/train.jsonl --prompts 8 --samples 8 --repeats 3

Each round generates the same requests on both engines, in turn (each round starts with the other engine), so that
the machine's drift falls on both alike. Prints per engine the median tokens per second over the rounds with the
spread (min-max), and the median of the rounds' vllm / hf ratios. The engine's load is timed apart (it is paid once
a run).
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


def generate(rollout, prompts: list[list[int]], budget: int, seed: int) -> tuple[float, int]:
    """(seconds, tokens generated) of one batch of requests, each decoded until EOS or ``budget``."""
    decoding = [(i, budget, seed * 1_000_003 + i, None, 0) for i in range(len(prompts))]
    start = time.perf_counter()
    rollout.begin(0, dict(enumerate(prompts)), decoding)
    tokens = 0
    while True:
        _, new, _ = rollout.decode(0, budget)
        if not new:
            break
        tokens += sum(map(len, new.values()))
    rollout.end()
    return time.perf_counter() - start, tokens


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


if __name__ == "__main__":
    main()
