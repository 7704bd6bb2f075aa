"""Learning on a task with answers: held-out accuracy of GRPO variants (sync, oppo, async K) over seeds, before
training and every --eval-every steps, against samples trained and run seconds.

    python -m oppo.exec.tasks.arithmetic --out data/add
    python benchmarks/real_task_learning.py --data data/add/train.jsonl --val-data data/add/val.jsonl \\
        --variants sync,oppo,async1 --seeds 3 --steps 30 --out runs/real-task

Runs take hours on a CPU: each saves a checkpoint every --eval-every steps and a second invocation with the same
arguments resumes the unfinished ones and reuses the finished ones. Prints per variant the held-out accuracy before
training and after the last step (mean and range over seeds), each seed's rise, and the run seconds; writes
OUT/learning.csv (every step of every run) and OUT/accuracy.png (learning_plot's accuracy panels).
notebooks/real_task.ipynb draws the same.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oppo.exec.learning import accuracy_table, add_study_args, study_from, write_learning_csv  # noqa: E402
from oppo.exec.train import train  # noqa: E402
from oppo.records.plots import learning_plot  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_study_args(parser)
    parser.add_argument("--variants", default="sync,oppo,async1", help="sync, oppo, asyncK[-decoupled]")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default="runs/real-task")
    args = parser.parse_args(argv)
    study = study_from(args)
    out = Path(args.out)
    runs: dict[str, list[list[dict]]] = {}
    for seed in range(args.seeds):  # seeds outermost: a study cut short has every variant at its first seeds
        for variant in args.variants.split(","):
            runs.setdefault(variant, []).append(study.run(variant, seed, out / f"{variant}-s{seed}", train))
    write_learning_csv(out / "learning.csv", runs)
    title = f"{study.preset}, {study.steps} steps x {study.batch} prompts x {study.group_size}, {args.seeds} seeds"
    learning_plot(runs, out / "accuracy.png", title=title, measure="accuracy")
    print(f"\n{title}: held-out accuracy ({study.eval_prompts or 'all'} items, greedy)")
    print(f"{'variant':<18} {'start':>7} {'final':>7} {'[min, max]':>14}  rise per seed          seconds")
    for row in accuracy_table(runs):
        start, final = row["start"], row["final"]
        rises = ", ".join(f"{f - s:+.2f}" for s, f in zip(start, final))
        print(
            f"{row['variant']:<18} {statistics.fmean(start):>7.3f} {statistics.fmean(final):>7.3f} "
            f"[{min(final):.2f}, {max(final):.2f}]  {rises:<22} {statistics.fmean(row['seconds']):>7.0f}"
        )


if __name__ == "__main__":
    main()
