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
# The layout of state.pkl's pickled objects (classes are pickled by module path): 2: the buffer keeps its sequences
# by column; 3: the core's classes live in oppo.core, the records' in oppo.records.schema.
STATE_FORMAT = 3
# Where the executor's modules went when it was split into rooms (tasks/, models/, step/, ...): a state.pkl saved
# before names its classes by the old paths (oppo.exec.snapshot.Saved, oppo.exec.runner.SeqData), read through this map;
# the layout is unchanged, so STATE_FORMAT is too.
MOVED_MODULES = {
    "oppo.exec.task": "oppo.exec.tasks.synthetic",
    "oppo.exec.datasets": "oppo.exec.tasks.datasets",
    "oppo.exec.rewards": "oppo.exec.tasks.rewards",
    "oppo.exec.verifiable": "oppo.exec.tasks.verifiable",
    "oppo.exec.arithmetic": "oppo.exec.tasks.arithmetic",
    "oppo.exec.models": "oppo.exec.models.roles",
    "oppo.exec.tiny": "oppo.exec.models.tiny",
    "oppo.exec.pretrained": "oppo.exec.models.pretrained",
    "oppo.exec.checkpoints": "oppo.exec.models.random_checkpoints",
    "oppo.exec.generation": "oppo.exec.engines.hf",
    "oppo.exec.ppo": "oppo.exec.algos.ppo",
    "oppo.exec.rollout": "oppo.exec.compute.rollout",
    "oppo.exec.scoring": "oppo.exec.compute.scoring",
    "oppo.exec.update": "oppo.exec.compute.update",
    "oppo.exec.sharding": "oppo.exec.compute.sharding",
    "oppo.exec.timing": "oppo.exec.compute.timing",
    "oppo.exec.runner": "oppo.exec.step.runner",
    "oppo.exec.rank": "oppo.exec.step.rank",
    "oppo.exec.parts": "oppo.exec.step.parts",
    "oppo.exec.evaluation": "oppo.exec.step.evaluation",
    "oppo.exec.snapshot": "oppo.exec.step.snapshot",
    "oppo.exec.placement": "oppo.exec.distributed.placement",
    "oppo.exec.async_pipeline": "oppo.exec.distributed.async_pipeline",
    "oppo.exec.rollout_worker": "oppo.exec.distributed.rollout_worker",
    "oppo.exec.trl_baseline": "oppo.exec.baselines.trl_ppo",
    "oppo.exec.trl_grpo": "oppo.exec.baselines.trl_grpo",
}


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
        _this_oppo(),
        log.held_out_start,
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
    log.held_out_start = state.held_out_start
    recorder.rows = state.trace
    recorder.t0 -= state.elapsed_s  # the clock goes on from the save
    return len(state.steps)


def load_state(path: Path) -> Saved:
    """A checkpoint's ``state.pkl``; refused in one line naming its format and the oppo that wrote it, where that
    is not this one's (its scheduler's internals are pickled as they were, under the module paths of then)."""
    problem = None
    try:
        with open(path, "rb") as fh:
            state = _StateUnpickler(fh).load()
    except Exception as err:  # noqa: BLE001 - a damaged pickle raises almost anything (ValueError, KeyError, ...)
        state, problem = None, f"{type(err).__name__}: {err}"
    if isinstance(state, Saved) and state.format == STATE_FORMAT:
        return state
    found, writer = _format_and_writer(path)
    if found in ("unknown", str(STATE_FORMAT)):  # not another layout: a damaged file or a library that moved
        raise ValueError(f"{path}: unreadable checkpoint ({problem or 'not a checkpoint'})")
    raise ValueError(
        f"{path} was written by another version of oppo ({writer}, state format {found}; this one reads format "
        f"{STATE_FORMAT}): resume it with that version, or start again"
    )


def _this_oppo() -> str:
    from oppo.records.provenance import provenance

    here = provenance()
    return f"oppo {here['oppo']} (commit {here['commit'] or 'unknown'})"


class _Unknown:
    """Stands for a class a checkpoint names that this oppo lacks (moved or gone): read, never used."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __setstate__(self, state) -> None:
        pass


class _StateUnpickler(pickle.Unpickler):
    """Reads a class a state names by its path of then (:data:`MOVED_MODULES`) from where it lives now."""

    def find_class(self, module: str, name: str):
        return super().find_class(MOVED_MODULES.get(module, module), name)


class _TolerantUnpickler(_StateUnpickler):
    def find_class(self, module: str, name: str):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return _Unknown


def _format_and_writer(path: Path) -> tuple[str, str]:
    """The state format a ``state.pkl`` records and the oppo that wrote it (its own note, else the provenance the
    run's ``config.json`` holds: the last process that resumed it, or the one that started it)."""
    try:
        with open(path, "rb") as fh:
            state = _TolerantUnpickler(fh).load()
    except Exception:  # noqa: BLE001 - any unreadable file is one we cannot name a writer for
        return "unknown", ""
    if not isinstance(state, Saved):
        return "unknown", ""
    fields = vars(state)
    if fields.get("written_by"):
        return str(fields.get("format", 1)), fields["written_by"]
    return str(fields.get("format", 1)), _writer_from_config(path.parent.parent / "config.json")


def _writer_from_config(config_json: Path) -> str:
    from oppo.data import read_config_json

    try:
        origin = read_config_json(config_json, "config").get("provenance", {})
    except (OSError, ValueError):
        return "oppo of unknown version"
    last = (origin.get("resumed") or [origin])[-1]
    return f"oppo {last.get('oppo', '?')} (commit {last.get('commit') or 'unknown'})"
