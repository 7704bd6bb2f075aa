"""Runs that outlive a session: ``--save-every N`` writes ``RUN_DIR/checkpoint/``, ``--resume RUN_DIR`` goes on.

A checkpoint holds what the next step depends on:

- ``actor/``, ``critic/``: the trained models (``save_pretrained``; the reference and reward model are frozen and
  load from the run's config as at its start);
- ``optimizers.pt``: the optimizers' states and torch's random state;
- ``state.pkl``: the scheduling core (buffer, controllers, the carried sequences), the executor's sequences (their
  tokens and behaviour log-probs), the records so far (steps, trained sequences, metrics, trace) and, for
  ``async``, the actor's recent versions, pickled.

KV caches are not saved: the decoder prefills every sequence it decodes at the start of each step anyway, and a
streamed scorer that lacks a carried sequence's cache prefills its tokens again (float64: within 1e-12 of the
cache it had). A checkpoint replaces the previous one only once it is complete (written beside it, then renamed),
so Ctrl-C or a crash at any moment leaves the last complete one.
"""

from __future__ import annotations

import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

CHECKPOINT = "checkpoint"
TRAINED = ("actor", "critic")
STATE_FORMAT = 2  # the layout of state.pkl's pickled objects; 2: the buffer keeps its sequences by column


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


def save(run_dir: Path, executor, log, recorder) -> None:
    """Write ``run_dir/checkpoint`` for the steps done so far."""
    rank = executor.group.rank
    tmp, final, old = run_dir / f"{CHECKPOINT}.tmp", run_dir / CHECKPOINT, run_dir / f"{CHECKPOINT}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for role in TRAINED:
        model = getattr(rank.roles, role)
        if model is not None:
            model.save_pretrained(tmp / role)
    optimizers = [opt.state_dict() for opt in rank.learner.optimizers]
    torch.save({"optimizers": optimizers, "torch_rng": torch.get_rng_state()}, tmp / "optimizers.pt")
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
    )
    with open(tmp / "state.pkl", "wb") as fh:
        pickle.dump(state, fh)
    if final.exists():  # the previous checkpoint stays whole until the new one has its name
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def latest(run_dir: Path) -> Path:
    """The run's last complete checkpoint (the previous one if a save was cut off between its two renames)."""
    for name in (CHECKPOINT, f"{CHECKPOINT}.old"):
        if (run_dir / name / "state.pkl").is_file():
            return run_dir / name
    raise FileNotFoundError(f"no checkpoint in {run_dir} (a run saves one with --save-every N)")


def restore(checkpoint: Path, executor, log, recorder) -> int:
    """Load ``checkpoint`` into a freshly built executor, run log and recorder; returns the steps done."""
    state = load_state(checkpoint / "state.pkl")
    rank = executor.group.rank
    with torch.no_grad():
        for role in TRAINED:
            model = getattr(rank.roles, role)
            if model is not None:
                saved = type(model).from_pretrained(checkpoint / role, dtype=rank.roles.dtype)
                model.load_state_dict(saved.state_dict())
    blob = torch.load(checkpoint / "optimizers.pt", weights_only=False)
    for optimizer, saved_state in zip(rank.learner.optimizers, blob["optimizers"], strict=True):
        optimizer.load_state_dict(saved_state)
    torch.set_rng_state(blob["torch_rng"])
    executor.scheduler, executor.data, executor.rank_of = state.scheduler, state.data, state.rank_of
    if executor.history is not None:  # async: generation goes on with the versions it had
        executor.history.versions.clear()
        executor.history.versions.extend(state.versions)
        executor.history.newest = len(state.steps)
    log.steps, log.trained, log.metrics = state.steps, state.trained, state.metrics
    recorder.rows = state.trace
    recorder.t0 -= state.elapsed_s  # the clock goes on from the save
    return len(state.steps)


def load_state(path: Path) -> Saved:
    """A checkpoint's ``state.pkl``; refused, naming it, where another version of oppo wrote it (its scheduler's
    internals are pickled as they were)."""
    try:
        with open(path, "rb") as fh:
            state = pickle.load(fh)
    except (AttributeError, TypeError, ImportError, pickle.UnpicklingError):
        state = None
    if not isinstance(state, Saved) or state.format != STATE_FORMAT:
        raise ValueError(f"{path} was written by another version of oppo: resume it with that one, or start again")
    return state
