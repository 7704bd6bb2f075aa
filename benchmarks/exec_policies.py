"""Step time of the executor's policies on one preset, with traced response lengths forced, in one run.

    python benchmarks/exec_policies.py --preset tiny-cpu --steps 30
    python benchmarks/exec_policies.py --preset small-cpu --steps 8 --batch 8
    python benchmarks/exec_policies.py --preset smollm2 --data data/add/train.jsonl --reward-fn gsm8k --algo grpo \
        --group-size 4 --batch 4 --max-new-tokens 48 --max-prompt-tokens 96 --lengths '' --policies sync,intra,oppo

Prints per policy: mean / p50 step time, ratio to sync, tokens decoded per second, the per-phase breakdown and
the deferral histogram. tok/s counts the response tokens of the trained sequences per second. Records of each
run go to --out/<preset>-<policy>.
"""

import argparse
import json
from pathlib import Path

from oppo.core.config import POLICIES
from oppo.exec.config import ExecConfig, ModelConfig, TaskConfig, default_schedule
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
    parser.add_argument("--lengths-model", default="alpaca-7b", help="AlpacaEval model whose lengths to replay")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--algo", default="ppo", help="ppo or grpo")
    parser.add_argument("--group-size", type=int, default=1)
    parser.add_argument("--data", help="a task with answers (with --reward-fn): prompts from this dataset")
    parser.add_argument("--reward-fn", help="the verifiable reward of --data (e.g. gsm8k)")
    parser.add_argument("--prompt-tokens", type=int, default=8, help="length of the synthetic prompts")
    parser.add_argument("--max-prompt-tokens", type=int, default=512, help="cap on a --data prompt's tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench-exec")
    args = parser.parse_args(argv)
    lengths = args.lengths or None
    task = TaskConfig(
        lengths=lengths,
        lengths_model=args.lengths_model if lengths else None,
        data=args.data,
        reward_fn=args.reward_fn,
        prompt_tokens=args.prompt_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
    )
    summaries = {}
    for policy in args.policies.split(","):
        assert policy in POLICIES, policy
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
        config = ExecConfig(schedule=schedule, model=model, steps=args.steps, seed=args.seed, task=task)
        out = Path(args.out) / f"{args.preset}-{policy}"
        train(config, out)
        summaries[policy] = json.loads((out / "summary.json").read_text())
    report(summaries, args)


def report(summaries: dict, args) -> None:
    base = summaries.get("sync", next(iter(summaries.values())))["mean_step_s"]
    print(
        f"\npreset {args.preset}, B={args.batch}, lengths {args.lengths_model if args.lengths else 'natural'} "
        f"(cap {args.max_new_tokens}), "
        f"{args.steps} steps each"
    )
    print(f"{'policy':<7} {'mean_s':>8} {'p50_s':>8} {'vs sync':>8} {'tok/s':>8} {'deferrals':>10}  deferral hist")
    for policy, s in summaries.items():
        tokens = s.get("decoded_tokens_per_s") or _tokens_per_s(Path(args.out) / f"{args.preset}-{policy}")
        hist = ", ".join(f"{k}: {v:.0%}" for k, v in s["deferral_hist"].items())
        print(
            f"{policy:<7} {s['mean_step_s']:>8.3f} {s['p50_step_s']:>8.3f} {base / s['mean_step_s']:>7.2f}x "
            f"{tokens:>8.0f} {s['mean_deferrals']:>10.2f}  {hist}"
        )
    print("\nseconds per step by role/phase:")
    keys = sorted({k for s in summaries.values() for k in s["phase_s_per_step"]})
    print(f"{'':<22}" + "".join(f"{p:>9}" for p in summaries))
    for key in keys:
        print(f"{key:<22}" + "".join(f"{s['phase_s_per_step'].get(key, 0):>9.3f}" for s in summaries.values()))


def _tokens_per_s(run: Path) -> float:
    """Response tokens of the trained sequences per second of step time."""
    import csv

    trained = sum(int(r["response_tokens"]) for r in csv.DictReader(open(run / "sequences.csv")))
    return trained / sum(float(r["step_s"]) for r in csv.DictReader(open(run / "steps.csv")))


if __name__ == "__main__":
    main()
