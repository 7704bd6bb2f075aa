"""Experiment trackers: TensorBoard event files (``--tensorboard DIR``), an MLflow local file store (``--mlflow
DIR``) and Weights & Biases (``--wandb PROJECT``: offline, a run folder under the run's ``--out`` that ``wandb sync``
uploads, unless ``WANDB_MODE`` says otherwise). Off by default. What they show is the run's records:

- per step: the ``steps.csv`` columns (``steps/<column>``) and, for the executor, ``metrics.csv``
  (``metrics/<column>``), at the step's index. The executor logs each step as it closes (:class:`Live`: curves
  while a run of hours runs); the simulator, whose runs take seconds, logs its files once written;
- the ``summary.json`` scalars (``summary/<key>``, nested keys joined by ``/``) at the last step;
- the config (``config.json``, nested keys joined by ``.``) as parameters (MLflow, W&B) or a text entry
  (TensorBoard);
- the run's PNG plots as artifacts (MLflow), images (TensorBoard, W&B).

The tracker libraries are imported here only, lazily: the rest of oppo runs without them."""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import struct
import time
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

from oppo.records.io import write_json

INSTALL = "pip install 'oppo[track]'"
TRACKER_IDS = "trackers.json"  # in a run's folder: the MLflow and W&B run ids its trackers log to
MLFLOW_PARAMS_PER_CALL = 100  # MLflow's log_batch limits: 100 params, 1000 metrics per call
MLFLOW_METRICS_PER_CALL = 1000


@dataclass(frozen=True)
class Trackers:
    tensorboard: Path | None = None
    mlflow: Path | None = None
    wandb: str | None = None  # the W&B project

    @property
    def any(self) -> bool:
        return any(value is not None for value in (self.tensorboard, self.mlflow, self.wandb))


def add_tracking_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tracking (off by default)")
    group.add_argument("--tensorboard", metavar="DIR", help="also write TensorBoard event files to DIR")
    group.add_argument("--mlflow", metavar="DIR", help="also log the run to an MLflow local file store in DIR")
    group.add_argument(
        "--wandb",
        metavar="PROJECT",
        help="also log the run to Weights & Biases project PROJECT: offline into OUT/wandb (upload with wandb sync) "
        "unless WANDB_MODE says otherwise",
    )


def trackers_from(args: argparse.Namespace) -> Trackers:
    """The trackers asked for, checked installed before the run starts (a missing library is bad input)."""
    trackers = Trackers(
        Path(args.tensorboard) if args.tensorboard else None,
        Path(args.mlflow) if args.mlflow else None,
        getattr(args, "wandb", None) or None,
    )
    for flag in ("tensorboard", "mlflow", "wandb"):
        if getattr(trackers, flag) is not None:
            try:
                __import__(flag)
            except ImportError:
                raise ValueError(f"--{flag} needs the {flag} package: {INSTALL}") from None
    return trackers


def track_run(run_dir: str | Path, trackers: Trackers, backend: str) -> None:
    """Log the run in ``run_dir`` (its records already written) to each tracker asked for, all at once."""
    if not trackers.any:
        return
    run_dir = Path(run_dir)
    live = Live(trackers, run_dir, backend)
    for step, values in RunFiles.read(run_dir).by_step():
        live.step(step, values)
    live.close()


class Live:
    """The trackers of one run, open while it runs: :meth:`step` logs a step's values as it closes, :meth:`close`
    the summary, the config and the plots from the run's files once written."""

    def __init__(
        self, trackers: Trackers, run_dir: Path, backend: str, resumed_at: int = 0, resumable: bool = False
    ) -> None:
        """``resumable``: the run may be resumed (the executor's): the MLflow and W&B run ids are kept in
        ``run_dir/trackers.json`` with the store and project they belong to. ``resumed_at``: a run resumed from a
        checkpoint after this many steps goes on in those runs where the store and project are the same (else in
        new ones); TensorBoard restarts its session at that step (every session opens with a START event, so the
        resumed one is a restart that drops what was logged from that step on)."""
        self.trackers, self.run_dir, self.backend = trackers, Path(run_dir), backend
        self.name = self.run_dir.resolve().name
        self.last_step = 0
        self.tensorboard = self.mlflow = self.wandb = None
        ids = _read_ids(self.run_dir) if resumed_at else {}
        if trackers.tensorboard is not None:
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self.tensorboard = EventFileWriter(str(trackers.tensorboard / self.name))
            start = SessionLog(status=SessionLog.START)
            self.tensorboard.add_event(Event(wall_time=time.time(), step=resumed_at, session_log=start))
        kept = {}
        if trackers.mlflow is not None:
            store = trackers.mlflow.resolve().as_uri()
            previous = ids.get("mlflow", {})
            self.mlflow = _mlflow_run(
                store, self.name, backend, previous.get("run") if previous.get("store") == store else None
            )
            kept["mlflow"] = {"store": store, "run": self.mlflow[1]}
        if trackers.wandb is not None:
            previous = ids.get("wandb", {})
            run_id = previous.get("run") if previous.get("project") == trackers.wandb else None
            self.wandb = _wandb_run(trackers.wandb, self.run_dir, self.name, backend, run_id)
            kept["wandb"] = {"project": trackers.wandb, "run": self.wandb.id}
        if resumable and kept:
            write_json(self.run_dir / TRACKER_IDS, kept)

    def step(self, step: int, values: dict[str, float]) -> None:
        """Log ``values`` (name -> number, True/False as 1/0, as read from the CSV files; non-finite numbers and
        anything else are left out) at ``step``."""
        values = {k: float(v) for k, v in values.items() if _is_number(v) or isinstance(v, bool)}
        self.last_step = max(self.last_step, step)
        if self.tensorboard is not None:
            from tensorboard.compat.proto.summary_pb2 import Summary

            for tag, value in values.items():
                self._tb_emit(step, Summary.Value(tag=tag, simple_value=value))
            self.tensorboard.flush()
        if self.mlflow is not None:
            from mlflow.entities import Metric

            client, run_id = self.mlflow
            stamp = int(time.time() * 1000)
            metrics = [Metric(tag, value, stamp, step) for tag, value in values.items()]
            for i in range(0, len(metrics), MLFLOW_METRICS_PER_CALL):
                client.log_batch(run_id, metrics=metrics[i : i + MLFLOW_METRICS_PER_CALL])
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def step_rows(self, step: int, **rows: Any) -> None:
        """Log a step's record rows (dataclasses or named tuples), each under its prefix: ``steps=``, ``metrics=``."""
        values = {}
        for prefix, row in rows.items():
            fields = asdict(row) if is_dataclass(row) else row._asdict()
            values |= {f"{prefix}/{k}": v for k, v in fields.items() if k != "step"}
        self.step(step, values)

    def close(self, code: int = 0) -> None:
        """The summary, the config and the plots, from the run's files; the trackers closed, with the run's exit
        ``code`` (not 0: MLflow's run is marked failed, W&B's exit code is it). A run that wrote no summary (stopped
        before its first step) closes them as they are."""
        run = RunFiles.read(self.run_dir) if (self.run_dir / "summary.json").is_file() else None
        final_step = max(self.last_step, run.final_step if run else 0)
        if self.tensorboard is not None:
            if run:
                _tensorboard_final(self, run, final_step)
            self.tensorboard.close()
        if self.mlflow is not None:
            if run:
                _mlflow_final(*self.mlflow, run, final_step)
            self.mlflow[0].set_terminated(self.mlflow[1], status="FINISHED" if run and not code else "FAILED")
        if self.wandb is not None:
            if run:
                _wandb_final(self.wandb, run)
            self.wandb.finish(exit_code=code or (0 if run else 1))

    def _tb_emit(self, step: int, value) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self.tensorboard.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[value])))


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

    def by_step(self) -> list[tuple[int, dict[str, float]]]:
        """The series as each step's values, in step order."""
        steps: dict[int, dict[str, float]] = {}
        for tag, points in self.series.items():
            for step, value in points:
                steps.setdefault(step, {})[tag] = value
        return sorted(steps.items())


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


def _tensorboard_final(live: Live, run: RunFiles, step: int) -> None:
    """The summary scalars, the config as text and the plots as images."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto

    for tag, value in run.final.items():
        live._tb_emit(step, Summary.Value(tag=tag, simple_value=value))
    text = "\n".join(f"    {k} = {v}" for k, v in sorted(run.config.items()))  # indented: markdown code block
    text_meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
    config = TensorProto(dtype=7, string_val=[text.encode()])
    live._tb_emit(0, Summary.Value(tag="config", metadata=text_meta, tensor=config))
    for png in run.plots:
        data = png.read_bytes()
        width, height = struct.unpack(">II", data[16:24])  # the PNG header's IHDR chunk
        image = Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=data)
        live._tb_emit(step, Summary.Value(tag=f"plots/{png.stem}", image=image))


def _read_ids(run_dir: Path) -> dict[str, str]:
    path = run_dir / TRACKER_IDS
    return json.loads(path.read_text()) if path.is_file() else {}


def _mlflow_run(store: str, name: str, backend: str, run_id: str | None = None):
    """(client, run id) of a new MLflow run in experiment ``oppo`` of the local file store at URI ``store``, or of
    run ``run_id`` there, open again where it still exists (a resumed run: its steps done again are logged again,
    MLflow keeps both)."""
    # MLflow 3 keeps the file store in maintenance mode and asks for this opt-in; a server or a database
    # backend would need more than a folder.
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    if run_id is not None:
        try:
            client.update_run(run_id, status="RUNNING")
            return client, run_id
        except MlflowException:  # deleted since: a new run
            pass
    experiment = client.get_experiment_by_name("oppo")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("oppo")
    return client, client.create_run(experiment_id, run_name=name, tags={"backend": backend}).info.run_id


def _mlflow_final(client, run_id: str, run: RunFiles, step: int) -> None:
    from mlflow.entities import Metric, Param

    stamp = int(time.time() * 1000)
    # MLflow's limit on a param value's length; a resumed run's params stay those logged first (MLflow keeps a param
    # once: --steps and the provenance may have changed)
    logged = client.get_run(run_id).data.params
    params = [Param(k, v[:6000]) for k, v in run.config.items() if k not in logged]
    for i in range(0, len(params), MLFLOW_PARAMS_PER_CALL):
        client.log_batch(run_id, params=params[i : i + MLFLOW_PARAMS_PER_CALL])
    client.log_batch(run_id, metrics=[Metric(tag, value, stamp, step) for tag, value in run.final.items()])
    for png in run.plots:
        client.log_artifact(run_id, str(png), artifact_path="plots")


def _wandb_run(project: str, run_dir: Path, name: str, backend: str, run_id: str | None = None):
    """A W&B run writing under ``run_dir/wandb``: offline unless ``WANDB_MODE`` is set (``online`` uploads as it
    goes); ``run_id``: go on with that run (a resumed run; W&B keeps the first logging of a step done again)."""
    import wandb

    run_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_SILENT", "true")  # its banners would interleave with the progress bar
    mode = os.environ.get("WANDB_MODE", "offline")
    resume = {"id": run_id, "resume": "allow"} if run_id else {}
    return wandb.init(
        project=project, name=name, dir=str(run_dir), mode=mode, tags=[backend], reinit="create_new", **resume
    )


def _wandb_final(wb, run: RunFiles) -> None:
    import wandb

    wb.config.update(run.config, allow_val_change=True)
    wb.summary.update(run.final)
    if run.plots:
        wb.log({f"plots/{png.stem}": wandb.Image(str(png)) for png in run.plots}, commit=True)
