"""Step time of the executor's policies on one preset, with traced response lengths forced, in one run.

    python benchmarks/exec_policies.py --preset tiny-cpu --steps 30
    python benchmarks/exec_policies.py --preset small-cpu --steps 8 --batch 8
    python benchmarks/exec_policies.py --preset smollm2 --data data/add/train.jsonl --reward-fn gsm8k --algo grpo \
        --group-size 4 --batch 4 --max-new-tokens 48 --max-prompt-tokens 96 --lengths '' --policies sync,intra,oppo

    python benchmarks/exec_policies.py --preset smollm2 --data data/add/train.jsonl --reward-fn gsm8k --algo grpo \
        --group-size 8 --batch 2 --max-new-tokens 128 --max-prompt-tokens 96 --lengths hh_rlhf_harmless \
        --policies sync@vllm,oppo@vllm --steps 6 --repeats 3

A policy may name its rollout engine (``oppo@vllm``; default the hf loop). Prints per policy: mean / p50 step time,
ratio to sync (on the same engine), tokens decoded per second, the per-phase breakdown and the deferral histogram.
tok/s counts the response tokens of the trained sequences per second. With ``--repeats R`` the policies run in R
interleaved rounds (a machine's drift falls on every policy alike) and each figure is the median over rounds, the
step time with its range. Records of each run go to --out/<preset>-<policy>[-r<round>].
"""

import argparse
import json
import statistics
from pathlib import Path

from oppo.core.config import POLICIES
from oppo.exec.config import (
    ROLLOUT_ENGINES,
    ExecConfig,
    ModelConfig,
    PPOConfig,
    RolloutConfig,
    TaskConfig,
    default_schedule,
)
from oppo.exec.train import train


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny-cpu")
    parser.add_argument("--policies", default="sync,inter,oppo")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--chunk", default="64", help="chunk size of streamed policies (or auto)")
    parser.add_argument("--lengths", default="alpaca_eval", help="trace of forced lengths ('': natural lengths)")
    parser.add_argument(
        "--lengths-model", default=None, help="the trace's model whose lengths to replay (alpaca_eval: alpaca-7b)"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--algo", default="ppo", help="ppo or grpo")
    parser.add_argument("--group-size", type=int, default=1)
    parser.add_argument("--data", help="a task with answers (with --reward-fn): prompts from this dataset")
    parser.add_argument("--reward-fn", help="the verifiable reward of --data (e.g. gsm8k)")
    parser.add_argument("--prompt-tokens", type=int, default=8, help="length of the synthetic prompts")
    parser.add_argument("--max-prompt-tokens", type=int, default=512, help="cap on a --data prompt's tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2, help="PPO epochs over each step's batch")
    parser.add_argument("--minibatches", type=int, default=2, help="minibatches per epoch")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds of every policy")
    parser.add_argument("--engine-memory", type=float, default=1.0, help="KV budget of a vLLM engine (GiB)")
    parser.add_argument("--engine-eager", action="store_true", help="vLLM without torch.compile")
    parser.add_argument("--out", default="runs/bench-exec")
    args = parser.parse_args(argv)
    for variant in args.policies.split(","):
        policy, _, engine = variant.partition("@")
        if policy not in POLICIES or engine not in ("", *ROLLOUT_ENGINES):
            parser.error(f"unknown policy {variant!r}: one of {', '.join(POLICIES)}, optionally @hf or @vllm")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    lengths = args.lengths or None
    if lengths == "alpaca_eval" and args.lengths_model is None:
        args.lengths_model = "alpaca-7b"
    task = TaskConfig(
        lengths=lengths,
        lengths_model=args.lengths_model if lengths else None,
        data=args.data,
        reward_fn=args.reward_fn,
        prompt_tokens=args.prompt_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
    )
    rounds: dict[str, list[dict]] = {}
    for r in range(args.repeats):
        for variant in args.policies.split(","):
            out = Path(args.out) / f"{args.preset}-{variant}" / (f"r{r}" if args.repeats > 1 else "")
            train(_config(args, task, variant), out)
            rounds.setdefault(variant, []).append(json.loads((out / "summary.json").read_text()) | {"run": out})
    report(rounds, args)


def _config(args, task: TaskConfig, variant: str) -> ExecConfig:
    policy, _, engine = variant.partition("@")
    schedule = default_schedule(
        policy=policy,
        batch=args.batch,
        max_new_tokens=args.max_new_tokens,
        chunk=args.chunk,
        check_tokens=8,
        delta_init=args.batch // 4,
        delta_max=args.batch // 4,
        window_tokens=args.max_new_tokens // 4,
        algo=args.algo,
        group_size=args.group_size,
    )
    model = ModelConfig(preset=args.preset, threads=args.threads)
    rollout = RolloutConfig(
        rollout_engine=engine or "hf", engine_memory=args.engine_memory, engine_eager=args.engine_eager
    )
    ppo = PPOConfig(epochs=args.epochs, minibatches=args.minibatches)
    return ExecConfig(
        schedule=schedule, model=model, ppo=ppo, steps=args.steps, seed=args.seed, task=task, rollout=rollout
    )


def report(rounds: dict[str, list[dict]], args) -> None:
    """The median over rounds of each figure; step time with its range, and the median of its rounds' ratios to sync
    on the same engine (n/a without one)."""
    mean_s = {v: [s["mean_step_s"] for s in runs] for v, runs in rounds.items()}
    median = {v: statistics.median(times) for v, times in mean_s.items()}
    traced = " ".join(filter(None, (args.lengths, args.lengths_model))) or "natural"
    print(
        f"\npreset {args.preset}, B={args.batch}, lengths {traced} (cap {args.max_new_tokens}), {args.steps} steps "
        f"each, median of {args.repeats} interleaved round(s)"
    )
    print(
        f"{'policy':<12} {'mean_s':>8} {'[min, max]':>16} {'p50_s':>8} {'vs sync':>8} {'tok/s':>8} {'deferrals':>10}"
        "  deferral hist (first round)"
    )
    for variant, runs in rounds.items():
        engine = variant.partition("@")[2] or "hf"
        base = next((v for v in (f"sync@{engine}", "sync" if engine == "hf" else "") if v in mean_s), None)
        # each round's ratio to its own sync run (interleaved: the drift between rounds cancels), then the median
        ratio = statistics.median(b / m for b, m in zip(mean_s[base], mean_s[variant])) if base else None
        tokens = statistics.median(s.get("decoded_tokens_per_s") or _tokens_per_s(s["run"]) for s in runs)
        p50 = statistics.median(s["p50_step_s"] for s in runs)
        deferrals = statistics.median(s["mean_deferrals"] for s in runs)
        hist = ", ".join(f"{k}: {v:.0%}" for k, v in runs[0]["deferral_hist"].items())
        spread = f"[{min(mean_s[variant]):.2f}, {max(mean_s[variant]):.2f}]"
        print(
            f"{variant:<12} {median[variant]:>8.3f} {spread:>16} {p50:>8.3f} "
            f"{f'{ratio:.2f}x' if ratio else 'n/a':>8} "
            f"{tokens:>8.0f} {deferrals:>10.2f}  {hist}"
        )
    print("\nseconds per step by role/phase (median over rounds):")
    keys = sorted({k for runs in rounds.values() for s in runs for k in s["phase_s_per_step"]})
    width = max(9, *(len(v) + 1 for v in rounds))
    print(f"{'':<22}" + "".join(f"{v:>{width}}" for v in rounds))
    for key in keys:
        cells = [statistics.median(s["phase_s_per_step"].get(key, 0.0) for s in runs) for runs in rounds.values()]
        print(f"{key:<22}" + "".join(f"{c:>{width}.3f}" for c in cells))


def _tokens_per_s(run: Path) -> float:
    """Response tokens of the trained sequences per second of step time."""
    import csv

    trained = sum(int(r["response_tokens"]) for r in csv.DictReader(open(run / "sequences.csv")))
    return trained / sum(float(r["step_s"]) for r in csv.DictReader(open(run / "steps.csv")))


if __name__ == "__main__":
    main()
