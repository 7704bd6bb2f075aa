"""Runs that outlive a session: ``--save-every N`` writes ``RUN_DIR/checkpoint/``, ``--resume RUN_DIR`` goes on.

A checkpoint holds what the next step depends on, as data (nothing in it is unpickled, nothing names code):

- ``actor/``, ``critic/``: the trained models (``save_pretrained``: safetensors and config.json; the reference
  and reward model are frozen and load from the run's config as at its start);
- ``state.json`` and ``arrays.safetensors``: the scheduling core (buffer, controllers, the carried sequences), the
  executor's sequences (their tokens and behaviour log-probs), the records so far (steps, trained sequences,
  metrics, trace), the optimizers' states, torch's random state and, for ``async``, the actor's recent versions
  (:mod:`oppo.exec.step.state_codec`: JSON for the structure, safetensors for the arrays);
- ``manifest.json``, written last: the format, the oppo that wrote it and each file's sha256.

KV caches are not saved: the decoder prefills every sequence it decodes at the start of each step anyway, and a
streamed scorer that lacks a carried sequence's cache prefills its tokens again (float64: within 1e-12 of the
cache it had). A checkpoint is written beside the previous one, each file flushed to disk, and replaces it by two
renames; ``--resume`` takes the newest whose manifest verifies (``checkpoint``, else ``checkpoint.old`` left by a
save cut between its renames), naming what it skipped, so a kill at any instant leaves one to go on from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from oppo import __version__
from oppo.data import file_sha256
from oppo.exec.step.state_codec import decode, encode
from oppo.records.io import fsync_path

CHECKPOINT = "checkpoint"
TRAINED = ("actor", "critic")
MANIFEST, STATE, ARRAYS = "manifest.json", "state.json", "arrays.safetensors"
# The layout of a checkpoint: 1-3 pickled the state (state.pkl, optimizers.pt; never read now: unpickling runs
# code); 4: state.json, arrays.safetensors and manifest.json.
STATE_FORMAT = 4


@dataclass
class Saved:
    scheduler: object
    data: dict
    rank_of: dict
    steps: list
    trained: list
    metrics: list
    trace: list
    elapsed_s: float  # the run's clock at the save: a resumed run's records go on from there
    versions: list | None = None  # async: the actor's recent versions (state dicts), oldest first
    format: int = 1  # STATE_FORMAT when saved (a state.pkl written before the field existed reads 1)
    written_by: str | None = None  # "oppo VERSION (commit C)" that saved it; None before format 3
    held_out_start: dict | None = None  # --eval-every: the held-out scores before any update


def save(run_dir: Path, executor, log, recorder) -> None:
    """Write ``run_dir/checkpoint`` for the steps done so far."""
    tmp, final, old = run_dir / f"{CHECKPOINT}.tmp", run_dir / CHECKPOINT, run_dir / f"{CHECKPOINT}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with _io_errors_as_os_errors(tmp):
            _write_checkpoint(tmp, executor, log, recorder)
    except BaseException:  # a full disk, Ctrl-C: the half-written folder goes, the last complete one stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():  # the previous checkpoint stays whole until the new one has its name
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    fsync_path(run_dir)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def _io_errors_as_os_errors(folder: Path) -> Iterator[None]:
    """safetensors' writer (Rust; also under ``save_pretrained``) reports a full disk as its own error: raise it as
    the ``OSError`` it is, so that a full disk ends the run in one line like any other write."""
    try:
        yield
    except SafetensorError as err:
        code = re.search(r"os error (\d+)", str(err))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(folder)) from err


def _write_checkpoint(tmp: Path, executor, log, recorder) -> None:
    rank = executor.group.rank
    for role in TRAINED:
        model = getattr(rank.roles, role)
        if model is not None:
            model.save_pretrained(tmp / role)
    state = Saved(
        executor.scheduler,
        executor.data,
        executor.rank_of,
        log.steps,
        log.trained,
        log.metrics,
        recorder.rows,
        recorder.now(),
        None if executor.history is None else list(executor.history.versions),
        STATE_FORMAT,
        _this_oppo(),
        log.held_out_start,
    )
    optimizers = [opt.state_dict() for opt in rank.learner.optimizers]
    data, arrays = encode({"saved": state, "optimizers": optimizers, "torch_rng": torch.get_rng_state()})
    save_file(arrays, tmp / ARRAYS)
    _write(tmp / STATE, json.dumps(data, separators=(",", ":")).encode())
    files = sorted(str(f.relative_to(tmp)) for f in tmp.rglob("*") if f.is_file())
    manifest = {
        "format": STATE_FORMAT,
        "oppo": __version__,
        "written_by": state.written_by,
        "files": {f: file_sha256(tmp / f) for f in files},
    }
    for path in [*(tmp / f for f in files), *(d for d in tmp.rglob("*") if d.is_dir())]:
        fsync_path(path)
    _write(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
    fsync_path(tmp)


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def latest(run_dir: Path, say: bool = True) -> Path:
    """The run's newest checkpoint whose manifest verifies (``checkpoint``, else ``checkpoint.old``, which a save
    cut between its two renames leaves); each one skipped is named on stderr (``say``) with why, and none is one
    line."""
    skipped = []
    for name in (CHECKPOINT, f"{CHECKPOINT}.old"):
        folder = run_dir / name
        if not folder.is_dir():
            continue
        problem = verify(folder)
        if problem is None:
            for line in skipped if say else ():
                print(f"note: skipped {line}", file=sys.stderr)
            return folder
        skipped.append(f"{folder}: {problem}")
    if skipped:
        raise ValueError("no checkpoint to resume from: " + "; ".join(skipped))
    raise FileNotFoundError(f"no checkpoint in {run_dir} (a run saves one with --save-every N)")


def verify(folder: Path) -> str | None:
    """Why ``folder`` is no checkpoint this oppo resumes from (None: its manifest holds and every file matches)."""
    if (folder / "state.pkl").exists() and not (folder / MANIFEST).exists():
        return (
            f"written by {_writer_from_config(folder.parent / 'config.json')} as a pickle (state format 3 or "
            f"earlier), which this oppo does not open (unpickling runs code): resume it with that version, or "
            "start again"
        )
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files, found = manifest["files"], manifest["format"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        return f"no readable manifest ({type(err).__name__}: {err})"
    if found != STATE_FORMAT:
        return f"written by {manifest.get('written_by')} in state format {found}; this oppo reads {STATE_FORMAT}"
    if not isinstance(files, dict) or not {STATE, ARRAYS} <= set(files):
        return "its manifest lists no state"
    for name, digest in files.items():
        path = folder / name
        if not path.resolve().is_relative_to(folder.resolve()) or not path.is_file():
            return f"{name} is missing"
        if file_sha256(path) != digest:
            return f"{name} does not match its manifest (cut short or changed)"
    return None


def load_state(folder: Path) -> dict:
    """A verified checkpoint's state: ``{"saved": Saved, "optimizers": [...], "torch_rng": tensor}``."""
    try:
        data = json.loads((folder / STATE).read_text())
        state = decode(data, load_file(folder / ARRAYS))
    except (OSError, ValueError, TypeError, RuntimeError) as err:  # RuntimeError: a device this machine lacks
        raise ValueError(f"{folder}: unreadable checkpoint state ({type(err).__name__}: {err})") from None
    if not isinstance(state, dict) or not isinstance(state.get("saved"), Saved):
        raise ValueError(f"{folder}: unreadable checkpoint state (not a run's state)")
    return state


def restore(checkpoint: Path, executor, log, recorder) -> int:
    """Load ``checkpoint`` into a freshly built executor, run log and recorder; returns the steps done."""
    blob = load_state(checkpoint)
    state = blob["saved"]
    scheduler = state.scheduler
    if type(scheduler) is not type(executor.scheduler) or scheduler.config != executor.scheduler.config:
        raise ValueError(f"{checkpoint}: its scheduler is not this run's (its config differs from config.json's)")
    rank = executor.group.rank
    with torch.no_grad():
        for role in TRAINED:
            model = getattr(rank.roles, role)
            if model is not None:
                saved = type(model).from_pretrained(checkpoint / role, dtype=rank.roles.dtype, use_safetensors=True)
                model.load_state_dict(saved.state_dict())
    rank.rollout.updated()  # a rollout engine loaded the starting weights: it takes the restored ones first
    for optimizer, saved_state in zip(rank.learner.optimizers, blob["optimizers"], strict=True):
        optimizer.load_state_dict(saved_state)
    torch.set_rng_state(blob["torch_rng"])
    executor.scheduler, executor.data, executor.rank_of = state.scheduler, state.data, state.rank_of
    if executor.history is not None:  # async: generation goes on with the versions it had
        executor.history.versions.clear()
        executor.history.versions.extend(state.versions)
        executor.history.newest = len(state.steps)
    log.steps, log.trained, log.metrics = state.steps, state.trained, state.metrics
    log.held_out_start = state.held_out_start
    recorder.rows = state.trace
    recorder.t0 -= state.elapsed_s  # the clock goes on from the save
    return len(state.steps)


def _this_oppo() -> str:
    from oppo.records.provenance import provenance

    here = provenance()
    return f"oppo {here['oppo']} (commit {here['commit'] or 'unknown'})"


def _writer_from_config(config_json: Path) -> str:
    from oppo.data import read_config_json

    try:
        origin = read_config_json(config_json, "config").get("provenance", {})
    except (OSError, ValueError):
        return "oppo of unknown version"
    last = (origin.get("resumed") or [origin])[-1]
    return f"oppo {last.get('oppo', '?')} (commit {last.get('commit') or 'unknown'})"
