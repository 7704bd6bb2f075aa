"""Experiment trackers written without a server: TensorBoard event files (``--tensorboard DIR``) and an MLflow
local file store (``--mlflow DIR``). Off by default; both CLIs call :func:`track_run` once a run's files are
written, and it reads what it logs back from those files, so a tracker shows exactly the run's records:

- per step: the ``steps.csv`` columns (``steps/<column>``) and, for the executor, ``metrics.csv``
  (``metrics/<column>``), at the step's index;
- the ``summary.json`` scalars (``summary/<key>``, nested keys joined by ``/``) at the last step;
- the config (``config.json``, nested keys joined by ``.``) as parameters (MLflow) or a text entry (TensorBoard);
- the run's PNG plots as artifacts (MLflow) or images (TensorBoard).

The tracker libraries are imported here only, lazily: the rest of oppo runs without them."""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTALL = "pip install 'oppo[track]'"
MLFLOW_PARAMS_PER_CALL = 100  # MLflow's log_batch limits: 100 params, 1000 metrics per call
MLFLOW_METRICS_PER_CALL = 1000


@dataclass(frozen=True)
class Trackers:
    tensorboard: Path | None = None
    mlflow: Path | None = None


def add_tracking_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tracking (off by default)")
    group.add_argument("--tensorboard", metavar="DIR", help="also write TensorBoard event files to DIR")
    group.add_argument("--mlflow", metavar="DIR", help="also log the run to an MLflow local file store in DIR")


def trackers_from(args: argparse.Namespace) -> Trackers:
    """The trackers asked for, checked installed before the run starts (a missing library is bad input)."""
    trackers = Trackers(
        Path(args.tensorboard) if args.tensorboard else None, Path(args.mlflow) if args.mlflow else None
    )
    for flag, module in (("tensorboard", "tensorboard"), ("mlflow", "mlflow")):
        if getattr(trackers, flag) is not None:
            try:
                __import__(module)
            except ImportError:
                raise ValueError(f"--{flag} needs the {module} package: {INSTALL}") from None
    return trackers


def track_run(run_dir: str | Path, trackers: Trackers, backend: str) -> None:
    """Log the run in ``run_dir`` (its records already written) to each tracker asked for."""
    if trackers.tensorboard is None and trackers.mlflow is None:
        return
    run = RunFiles.read(Path(run_dir))
    if trackers.tensorboard is not None:
        write_tensorboard(run, trackers.tensorboard / run.name)
    if trackers.mlflow is not None:
        write_mlflow(run, trackers.mlflow, backend)


@dataclass
class RunFiles:
    """What a tracker shows of a run, read from its files."""

    name: str
    series: dict[str, list[tuple[int, float]]]  # metric name -> (step, value) in step order
    final: dict[str, float]  # summary scalars
    final_step: int
    config: dict[str, str]  # flattened config (provenance included)
    plots: list[Path]

    @classmethod
    def read(cls, run_dir: Path) -> RunFiles:
        series: dict[str, list[tuple[int, float]]] = {}
        for file, prefix in (("steps.csv", "steps"), ("metrics.csv", "metrics")):
            if (run_dir / file).exists():
                series |= _csv_series(run_dir / file, prefix)
        summary = json.loads((run_dir / "summary.json").read_text())
        summary.pop("config", None)
        config = json.loads((run_dir / "config.json").read_text())
        steps = [step for values in series.values() for step, _ in values]
        return cls(
            name=run_dir.resolve().name,
            series=series,
            final={f"summary/{k}": v for k, v in _flatten(summary, "/").items() if _is_number(v)},
            final_step=max(steps, default=0),
            config={k: json.dumps(v) if not isinstance(v, str) else v for k, v in _flatten(config, ".").items()},
            plots=sorted(run_dir.glob("*.png")),
        )


def _csv_series(path: Path, prefix: str) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            step = int(row.pop("step"))
            for name, text in row.items():
                value = _number(text)
                if value is not None:
                    series.setdefault(f"{prefix}/{name}", []).append((step, value))
    return series


def _number(text: str) -> float | None:
    """A CSV cell as a float (True/False as 1/0); None for text and empty cells."""
    if text in ("True", "False"):
        return float(text == "True")
    try:
        return float(text)
    except ValueError:
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _flatten(data: dict[str, Any], sep: str, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat |= _flatten(value, sep, name)
        else:
            flat[name] = value
    return flat


def write_tensorboard(run: RunFiles, logdir: Path) -> None:
    """One event file in ``logdir``: scalars, the config as text, the plots as images."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(logdir))
    now = time.time()

    def emit(step: int, value: Summary.Value) -> None:
        writer.add_event(Event(wall_time=now, step=step, summary=Summary(value=[value])))

    for tag, points in run.series.items():
        for step, value in points:
            emit(step, Summary.Value(tag=tag, simple_value=value))
    for tag, value in run.final.items():
        emit(run.final_step, Summary.Value(tag=tag, simple_value=value))
    text = "\n".join(f"    {k} = {v}" for k, v in sorted(run.config.items()))  # indented: markdown code block
    text_meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
    emit(0, Summary.Value(tag="config", metadata=text_meta, tensor=TensorProto(dtype=7, string_val=[text.encode()])))
    for png in run.plots:
        data = png.read_bytes()
        width, height = struct.unpack(">II", data[16:24])  # the PNG header's IHDR chunk
        image = Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=data)
        emit(run.final_step, Summary.Value(tag=f"plots/{png.stem}", image=image))
    writer.close()


def write_mlflow(run: RunFiles, store: Path, backend: str) -> None:
    """One MLflow run in experiment ``oppo`` of the local file store ``store``."""
    # MLflow 3 keeps the file store in maintenance mode and asks for this opt-in; a server or a database
    # backend would need more than a folder.
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    experiment = client.get_experiment_by_name("oppo")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("oppo")
    run_id = client.create_run(experiment_id, run_name=run.name, tags={"backend": backend}).info.run_id
    stamp = int(time.time() * 1000)
    params = [Param(k, v[:6000]) for k, v in run.config.items()]  # MLflow's limit on a param value's length
    metrics = [Metric(tag, value, stamp, step) for tag, points in run.series.items() for step, value in points]
    metrics += [Metric(tag, value, stamp, run.final_step) for tag, value in run.final.items()]
    for i in range(0, len(params), MLFLOW_PARAMS_PER_CALL):
        client.log_batch(run_id, params=params[i : i + MLFLOW_PARAMS_PER_CALL])
    for i in range(0, len(metrics), MLFLOW_METRICS_PER_CALL):
        client.log_batch(run_id, metrics=metrics[i : i + MLFLOW_METRICS_PER_CALL])
    for png in run.plots:
        client.log_artifact(run_id, str(png), artifact_path="plots")
    client.set_terminated(run_id)
