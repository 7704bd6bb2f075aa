"""One-command validation on a CUDA machine: GPU tests, then the executor on real architectures, measured and
predicted by the simulator calibrated on the ``sync`` run.

    python benchmarks/gpu_validate.py --out runs/gpu [--models qwen2.5-0.5b,qwen2.5-1.5b] [--steps 5]

1. ``pytest -m gpu`` (bf16 autocast, CUDA synchronisation in timing, the CUDA scoring path);
2. per model shape (Qwen2.5-0.5B and -1.5B configs, random weights, saved and loaded through ``from_pretrained``):
   ``sync``, ``intra``, ``inter``, ``oppo`` in bf16 with AlpacaEval lengths forced, the actor as ``--dp`` ranks
   (default: one per GPU present; with more than one, ranks are Ray workers joined by NCCL);
3. the simulator calibrated on each ``sync`` trace predicts the other policies (``oppo.fidelity``);
4. one table: measured vs predicted step time, decode tokens/s, MFU of decode and of the actor update;
5. the real model (preset ``smollm2``, SmolLM2-135M-Instruct) in bfloat16: GRPO ``sync`` and ``oppo`` on the
   arithmetic task (written into OUT/data), ``--real-steps`` steps at the study's sizes times ``--real-scale``
   prompts, generating on each of ``--real-engines`` (the hf loop, and vLLM where it is installed: the engine
   sleeping between generations); its step times and greedy held-out accuracy before and after (``--real-steps
   0`` skips it).

Without CUDA it exits with code 2 and one line. Sized to finish within 10 minutes on one H100.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from oppo.catalog.shapes import HF_SHAPES
from oppo.cli import run_cli

POLICIES = ("sync", "intra", "inter", "oppo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory (checkpoints, runs, gpu_validate.json)")
    parser.add_argument(
        "--models", default="qwen2.5-0.5b,qwen2.5-1.5b", help="comma-separated shapes of oppo.catalog.shapes"
    )
    parser.add_argument("--steps", type=int, default=5, help="steps per policy (default: 5)")
    parser.add_argument("--batch", type=int, default=32, help="B (default: 32)")
    parser.add_argument("--max-new-tokens", type=int, default=192, help="response cap (default: 192)")
    parser.add_argument("--chunk", default="64", help="streamed chunk size (default: 64)")
    parser.add_argument(
        "--dp", type=int, default=0, help="data-parallel actor ranks, one GPU each (default: 0, every GPU present)"
    )
    parser.add_argument("--skip-tests", action="store_true", help="do not run pytest -m gpu first")
    parser.add_argument(
        "--real-steps", type=int, default=6, help="GRPO steps of the real model (smollm2) per policy (0: none)"
    )
    parser.add_argument(
        "--real-scale", type=int, default=8, help="prompts a step, times the CPU study's 2 (default: 8, 16 prompts)"
    )
    parser.add_argument(
        "--real-engines",
        default=None,
        help="rollout engines of the real model's runs, comma-separated (default: hf, and vllm where installed)",
    )
    return parser


def check_args(args: argparse.Namespace) -> list[str]:
    """The model shapes to run; bad values raise ValueError (exit 2, one line)."""
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in HF_SHAPES]
    if unknown or not models:
        raise ValueError(f"unknown model shape(s) {unknown or 'none'}; choose from {', '.join(HF_SHAPES)}")
    if min(args.steps, args.batch, args.max_new_tokens) < 1:
        raise ValueError("--steps, --batch and --max-new-tokens must be >= 1")
    if args.dp < 0:
        raise ValueError(f"--dp must be >= 0 (0: every GPU present), got {args.dp}")
    if args.real_steps < 0 or args.real_scale < 1:
        raise ValueError("--real-steps must be >= 0 and --real-scale >= 1")
    args.real_engines = real_engines(args.real_engines)
    return models


def real_engines(given: str | None) -> tuple[str, ...]:
    """The rollout engines the real model runs on: the given ones, else hf and vLLM where it is installed."""
    from oppo.exec.config import ROLLOUT_ENGINES
    from oppo.exec.engines.vllm_engine import MISSING, version

    if given is None:
        return ("hf", "vllm") if version() else ("hf",)
    engines = tuple(e for e in given.split(",") if e)
    unknown = [e for e in engines if e not in ROLLOUT_ENGINES]
    if unknown or not engines:
        raise ValueError(f"unknown rollout engine(s) {unknown or 'none'}; choose from {', '.join(ROLLOUT_ENGINES)}")
    if "vllm" in engines and version() is None:
        raise ValueError(MISSING)
    return engines


def require_cuda(dp: int) -> int:
    """The ranks to run (``dp``, or every GPU present for 0); no CUDA, or too few GPUs, is an error."""
    import torch

    if not torch.cuda.is_available():
        raise ValueError("gpu_validate needs CUDA: torch.cuda.is_available() is False on this machine")
    gpus = torch.cuda.device_count()
    if dp > gpus:
        raise ValueError(f"--dp {dp} needs {dp} GPUs; this machine has {gpus}")
    return dp or gpus


def run_policies(model: str, args: argparse.Namespace, out: Path) -> dict[str, Path]:
    from oppo.exec.config import ExecConfig, ModelConfig, TaskConfig, default_schedule
    from oppo.exec.models.random_checkpoints import random_checkpoints
    from oppo.exec.train import train

    paths = random_checkpoints(model, out / "checkpoints" / model)
    runs = {}
    for policy in POLICIES:
        schedule = default_schedule(
            policy=policy,
            batch=args.batch,
            max_new_tokens=args.max_new_tokens,
            chunk=args.chunk,
            delta=str(max(1, args.batch // 4)),
            check_tokens=16,
        )
        config = ExecConfig(
            schedule=schedule,
            steps=args.steps,
            dp=args.dp,
            model=ModelConfig(
                preset="hf", actor=str(paths["actor"]), reward=str(paths["reward"]), device="cuda", dtype="bfloat16"
            ),
            task=TaskConfig(lengths="alpaca_eval", lengths_model="alpaca-7b", prompt_tokens=64),
        )
        runs[policy] = out / model / policy
        train(config, runs[policy])
    return runs


def run_real_model(
    args: argparse.Namespace, out: Path, preset: str = "smollm2", device: str = "cuda", dtype: str = "bfloat16"
) -> list[dict]:
    """GRPO ``sync`` and ``oppo`` of SmolLM2 in bfloat16 on CUDA, on the arithmetic task: a row per policy (the
    other arguments: a smoke test's tiny model on a CPU)."""
    import dataclasses

    import numpy as np

    from oppo.exec.learning import TaskStudy, read_run
    from oppo.exec.tasks import arithmetic
    from oppo.exec.train import train

    (out / "data").mkdir(parents=True, exist_ok=True)
    files = arithmetic.write(out / "data", train=2000, val=200, seed=0)
    data, val = str(files["train"]), str(files["val"])
    steps, batch = args.real_steps, 2 * args.real_scale
    study = TaskStudy(data, val, preset=preset, steps=steps, batch=batch, eval_every=steps, eval_prompts=100)
    rows = []
    engines = getattr(args, "real_engines", None) or ("hf",)
    for engine, policy in ((e, p) for e in engines for p in ("sync", "oppo")):
        config = study.config(policy, seed=0)
        model = dataclasses.replace(config.model, device=device, dtype=dtype, threads=0)
        rollout = dataclasses.replace(config.rollout, rollout_engine=engine)
        run = out / preset / (policy if engine == "hf" else f"{policy}@{engine}")
        train(dataclasses.replace(config, model=model, rollout=rollout, save_every=0), run)
        steps = read_run(run)
        times = np.diff([0.0] + [s["end_s"] for s in steps])[1:]  # the first step warms up
        rows.append(
            {
                "model": f"{preset} ({dtype}, GRPO)",
                "engine": engine,
                "policy": policy,
                "median_step_s": round(float(np.median(times)), 3) if len(times) else None,
                "held_out_before": (steps[0]["start"] or {}).get("held_out_rule_score"),
                "held_out_after": steps[-1]["held_out_rule_score"],
            }
        )
    return rows


def table(model: str, runs: dict[str, Path], report: dict) -> list[dict]:
    rows = []
    for policy, run in runs.items():
        summary = json.loads((run / "summary.json").read_text())
        stages, r = summary["stages"], report[policy]
        decode, train = stages.get("actor/decode", {}), stages.get("actor/train_actor", {})
        rows.append(
            {
                "model": model,
                "policy": policy,
                "measured_s": round(r["measured_step_s"], 3),
                "predicted_s": round(r["predicted_step_s"], 3),
                "step_err": f"{r['median_step_err']:.1%}",
                "decode_tok_s": round(decode.get("tokens_per_s", 0.0)),
                "mfu_decode": _percent(decode),
                "mfu_train": _percent(train),
            }
        )
    return rows


def _percent(stage: dict) -> str | None:
    return None if stage.get("mfu") is None else f"{stage['mfu']:.2%}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    models = check_args(args)
    args.dp = require_cuda(args.dp)
    from oppo.catalog.lengths import load_lengths
    from oppo.cli import format_table
    from oppo.fidelity import fidelity

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tests = "skipped"
    if not args.skip_tests:
        res = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"],
            capture_output=True,
            text=True,
        )
        tests = (res.stdout.strip().splitlines() or ["(no output)"])[-1]
    lengths = load_lengths("alpaca_eval", model="alpaca-7b")
    rows = []
    for model in models:
        runs = run_policies(model, args, out)
        report = fidelity(runs, lengths, out / model / "profile.json")
        rows += table(model, runs, report)
    real = run_real_model(args, out) if args.real_steps else []
    print(f"pytest -m gpu: {tests}; actor ranks: {args.dp}")
    print(format_table(rows))
    if real:
        print(format_table(real))
    print(f"({time.perf_counter() - start:.0f} s)")
    (out / "gpu_validate.json").write_text(
        json.dumps({"pytest_gpu": tests, "dp": args.dp, "rows": rows, "real_model": real}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
