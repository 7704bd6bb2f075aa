"""The parts of ``--policy async --rollout-workers N`` that live on a rollout worker or cross to it: the
:class:`RolloutWorker` Ray actor (its own copy of the actor and the frozen scorers, on one core or GPU), the weights
as they travel (:func:`shareable`, :func:`unshared`) and the per-token weight versions it reports
(:class:`TokenLag`, ``token_lag.csv``). The driver is :mod:`oppo.exec.distributed.async_pipeline`."""

from __future__ import annotations

import os
from typing import NamedTuple

import ray
import torch

from oppo.exec.compute.timing import Recorder
from oppo.exec.distributed.placement import _worker_device
from oppo.exec.models.roles import token_ids


class TokenLag(NamedTuple):
    """``token_lag.csv``: per trained sample, the weights versions that generated its tokens (the trainer's
    version at its update is ``step``; a token's lag is ``step`` minus its version)."""

    step: int
    seq_id: int
    first_version: int  # of the first token: the bounded one (policy_lag in sequences.csv = step - this)
    last_version: int
    switches: int  # weight switches inside this step's tokens of the sequence (in-flight updates)
    mean_lag: float  # over the sequence's tokens generated this step
    versions: str  # run-length per token in order, "version x tokens" joined by ";", e.g. "3x40;4x88"


def token_lag(step: int, seq_id: int, versions: list[int]) -> TokenLag:
    runs: list[list[int]] = []
    for v in versions:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    mean = sum(step - v for v in versions) / len(versions) if versions else 0.0
    first, last = (versions[0], versions[-1]) if versions else (step, step)
    return TokenLag(step, seq_id, first, last, max(len(runs) - 1, 0), mean, ";".join(f"{v}x{n}" for v, n in runs))


def shareable(state: dict[str, torch.Tensor]) -> dict:
    """Weights as Ray moves them cheaply: numpy arrays, which ``ray.put`` copies once into the object store and a
    worker reads in place (torch tensors are pickled: copied into the pickle, then out of it on the worker). On the
    small-cpu actor (100 MB), measured on this machine under load: 0.045 s to publish and 0.04 s to load, against
    0.24 s and 0.19 s for a clone of the tensors (the trainer's and the rollout's critical paths, every step).
    bfloat16, which numpy lacks, travels as its bits (int16)."""
    return {
        k: (v.view(torch.int16).numpy(), "bfloat16") if v.dtype == torch.bfloat16 else v.numpy()
        for k, v in state.items()
    }


def unshared(state: dict) -> dict[str, torch.Tensor]:
    """:func:`shareable`'s weights as tensors over the same (read-only, shared) memory: ``load_state_dict`` only
    copies from them."""
    import warnings

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns that the arrays are read-only: only read here
        for k, v in state.items():
            out[k] = torch.from_numpy(v[0]).view(torch.bfloat16) if isinstance(v, tuple) else torch.from_numpy(v)
    return out


@ray.remote
class RolloutWorker:
    """A rollout worker of ``async``: its own copy of the actor on one device (one core or one GPU), generating
    the sequences it is dealt with the weights version it was last sent, timed on the driver's clock (``t0``)."""

    def __init__(self, config, t0: float, label: str, frozen: tuple[str, ...], core: int | None):
        """``config``: the run's :class:`~oppo.exec.config.ExecConfig` (its model, sampling and rollout engine);
        ``frozen``: the scorer roles that never change (reward model, reference) this worker scores its sequences
        with, as they finish, off the trainer's device; ``core``: the CPU core it runs on (None: where the OS puts
        it, as on a cluster's other node). With ``--rollout-engine vllm`` the worker owns an engine (its process
        inherits the worker's core) and pushes each version it is sent into it before generating with it."""
        from oppo.exec.compute.rollout import make_rollout
        from oppo.exec.models.roles import load_role

        model_config, ppo = config.model, config.ppo

        if not ray.get_gpu_ids():
            torch.set_num_threads(1)  # one core per worker
            if core is not None:  # that core alone: its own device, as the simulator's placement has it
                os.sched_setaffinity(0, {core})
        device, self.label = _worker_device(label)
        self.actor = load_role(model_config, "actor", device).requires_grad_(False)
        self.pad_id, eos_id, _ = token_ids(model_config)
        self.temperature = ppo.temperature  # ``ppo``: the run's PPOConfig, whose sampling settings this worker uses
        self.frozen = {role: load_role(model_config, role, device).requires_grad_(False) for role in frozen}
        self.rec = Recorder(t0)
        self.rollout = make_rollout(config, self.actor, eos_id, self.pad_id, self.rec, self.label)
        self.version: int | None = None
        self.step, self.tokens, self.decoding = -1, {}, []
        self.finished: dict[int, int] = {}  # seq id -> tokens it decoded this step, EOS included
        self.new: dict[int, list[int]] = {}  # seq id -> its tokens this step
        self.behaviour: dict[int, list[float]] = {}  # their log-probs under the weights that sampled them
        self.versions: dict[int, list[int]] = {}  # and those weights' versions

    def ready(self) -> tuple[str, int]:
        return self.label, os.getpid()

    def load_weights(self, step: int, version: int, state: dict) -> None:
        with self.rec.op(step, self.label, "actor", "sync", batch=1):
            self.actor.load_state_dict(unshared(state))
        self.rollout.updated()  # an engine takes them before it generates again
        self.version = version

    def start(self, step: int, tokens: dict[int, list[int]], decoding: list[tuple]) -> None:
        """Prefill ``decoding``'s rows ((seq id, budget, key, forced length, response tokens so far)) whose
        contexts are ``tokens[seq id]``."""
        self.step, self.tokens, self.decoding = step, tokens, decoding
        self.finished, self.new, self.behaviour, self.versions = {}, {}, {}, {}
        self.rollout.begin(step, tokens, decoding)

    def decode(self, n: int) -> bool:
        """Up to ``n`` tokens of every running row; whether any row still runs."""
        finished, new, behaviour = self.rollout.decode(self.step, n)
        for seq_id, tokens in new.items():
            self.new.setdefault(seq_id, []).extend(tokens)
            self.behaviour.setdefault(seq_id, []).extend(behaviour[seq_id])
            self.versions.setdefault(seq_id, []).extend([self.version] * len(tokens))
        self.finished |= {seq_id: len(self.new[seq_id]) for seq_id in finished}
        return self.rollout.running

    def switch(self, version: int, state: dict) -> None:
        """In-flight update: the rows still running go on under ``version``'s weights (their prefix re-prefilled,
        :meth:`Rollout.refill`)."""
        self.load_weights(self.step, version, state)
        self.rollout.refill(self.step)

    def finish(self):
        """Score this step's sequences with the frozen roles. Returns ({seq id: tokens decoded this step} of those
        that hit EOS, {seq id: new tokens}, {seq id: their behaviour log-probs}, {seq id: their versions}, the
        frozen roles' outputs ({role: {seq id: tensor}}), the trace rows recorded and the engine's counts since the
        last step (:class:`~oppo.exec.engines.vllm_engine.EngineStats`; None on the hf loop)."""
        from oppo.exec.compute.scoring import ROLE_KINDS, score_once

        self.rollout.end()
        # (seq id, prompt + response, prompt length); a row's context holds its prompt and `done` response tokens
        seqs = [(i, self.tokens[i] + self.new.get(i, []), len(self.tokens[i]) - done) for i, *_, done in self.decoding]
        scored = {}
        for role, model in self.frozen.items():
            length = sum(len(s[1]) for s in seqs)
            with self.rec.op(self.step, self.label, role, "score", batch=len(seqs), tokens=length):
                outputs = score_once(model, ROLE_KINDS[role], seqs, self.pad_id, self.temperature)
            scored[role] = {s[0]: t.cpu() for s, t in zip(seqs, outputs)}
        rows, self.rec.rows = self.rec.rows, []
        return self.finished, self.new, self.behaviour, self.versions, scored, rows, self.rollout.engine_stats()

    def close(self) -> None:
        """Stop the rollout engine's process, if any (before the worker is killed)."""
        self.rollout.close()

    def generate(self, step: int, tokens: dict[int, list[int]], decoding: list[tuple], n: int):
        """The whole step in one call (no in-flight updates): :meth:`start`, :meth:`decode` of ``n``,
        :meth:`finish`."""
        self.start(step, tokens, decoding)
        self.decode(n)
        return self.finish()
