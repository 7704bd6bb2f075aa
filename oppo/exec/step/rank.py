"""One data-parallel rank of the actor group: the actor with its colocated scorer roles (reference, critic).

The driver keeps the scheduling core and deals each step's sequences to the ranks. A rank decodes the rows dealt
to it round by round, feeds their chunks to its own streamed scorers, scores its trained rows (old log-probs and
the colocated scorers' outputs) and takes its share of every minibatch step (:class:`.Learner`).
The same class runs in the driver process (:class:`LocalGroup`, one rank) and in Ray workers
(:class:`oppo.exec.distributed.placement.RayGroup`, N ranks joined by ``torch.distributed``).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from oppo.exec.compute import sharding
from oppo.exec.compute.rollout import make_rollout
from oppo.exec.compute.scoring import LocalScorer, score_once
from oppo.exec.compute.timing import Recorder
from oppo.exec.compute.update import Learner, weights_digest
from oppo.exec.config import ExecConfig
from oppo.exec.models.roles import Roles


class ActorRank:
    def __init__(self, config: ExecConfig, roles: Roles, recorder: Recorder, label: str, colocated: tuple[str, ...]):
        """``label``: this rank's device in the records; ``colocated``: the scorer roles it holds."""
        self.config, self.roles, self.rec, self.label = config, roles, recorder, label
        self.learner = Learner(config, roles, recorder, label)
        self.scorers = {
            role: LocalScorer.for_role(
                role, getattr(roles, role), roles.pad_id, recorder, label, config.ppo.temperature
            )
            for role in colocated
        }
        self.trained = trained_models(config, roles)
        self.sharded = sharding.is_sharded(roles.actor)
        self.gathered = False  # sharded models' weights gathered for this step's generation and scoring
        self.streamed: dict[str, LocalScorer] = {}
        self.rollout = make_rollout(config, roles.actor, roles.eos_id, roles.pad_id, recorder, label)
        self.unstreamed: dict[int, list[int]] = {}  # tokens decoded since the last streamed chunk

    @classmethod
    def joined(cls, config: ExecConfig, roles: Roles, recorder: Recorder, label: str, colocated: tuple[str, ...]):
        """A rank of a joined process group: rank 0's weights are taken (as DDP does at construction), and the
        trained models are sharded with ``config.shard``, before the optimizers see their parameters."""
        with torch.no_grad():
            for model in trained_models(config, roles):  # (the reference loads alike everywhere)
                for p in model.parameters():
                    dist.broadcast(p.data, src=0)
        if config.shard:
            for model in trained_models(config, roles):
                sharding.shard(model)
        return cls(config, roles, recorder, label, colocated)

    def begin(self, step: int, contexts: list[tuple], decoding: list[tuple], streamed: tuple[str, ...]) -> None:
        """Start a step. ``contexts``: (seq id, tokens, prompt length) of this rank's sequences in flight;
        ``decoding``: (seq id, token budget, sampling key, forced length or None, response tokens so far) of
        those that decode this step; ``streamed``: the scorer roles fed chunk by chunk."""
        if self.sharded:
            with self.rec.op(step, self.label, "actor", "sync", batch=len(self.trained)):  # a weight all-gather
                for model in self.trained:
                    sharding.gather(model)
            self.gathered = True
        self.streamed = {role: s for role, s in self.scorers.items() if role in streamed}
        for scorer in self.streamed.values():
            scorer.begin(step, contexts)
        self.unstreamed = {}
        tokens = {seq_id: context for seq_id, context, _ in contexts}
        self.rollout.begin(step, tokens, decoding)

    def decode(self, step: int, n: int) -> tuple[dict[int, int], dict[int, list[int]], dict[int, list[float]]]:
        """Up to ``n`` iterations (:meth:`Rollout.decode`); the new tokens wait for the next :meth:`stream`."""
        finished, new, behaviour = self.rollout.decode(step, n)
        for seq_id, tokens in new.items():
            self.unstreamed.setdefault(seq_id, []).extend(tokens)
        return finished, new, behaviour

    def halt(self, step: int) -> None:
        """The step's generation is over (:meth:`Rollout.halt`)."""
        self.rollout.halt()

    def stream(self, step: int) -> None:
        """Feed the tokens decoded since the last call to the streamed scorers."""
        for scorer in self.streamed.values():
            scorer.feed(step, self.unstreamed)
        self.unstreamed = {}

    def score(self, step: int, seqs: list[tuple]) -> dict[str, list[torch.Tensor]]:
        """Per role (``actor``: old log-probs, unless the engine's stand in for them; and each colocated scorer),
        the outputs of ``seqs`` (seq id, tokens, prompt length), on the CPU."""
        if not seqs:
            return {}
        ids = [seq_id for seq_id, _, _ in seqs]
        out = {
            role: (scorer.outputs(step, ids) if role in self.streamed else scorer.score(step, seqs)).get()
            for role, scorer in self.scorers.items()
        }
        if self.config.rollout.rollout_log_probs == "recompute":  # else the engine's log-probs stand in for them
            with self.rec.op(step, self.label, "actor", "score", batch=len(seqs), tokens=sum(len(s[1]) for s in seqs)):
                temperature = self.config.ppo.temperature
                out["actor"] = score_once(self.roles.actor, "logprob", seqs, self.roles.pad_id, temperature)
        return {role: [t.cpu() for t in outputs] for role, outputs in out.items()}

    def train(self, step: int, part: dict[str, torch.Tensor], totals: dict[str, float]) -> tuple[float, ...]:
        if self.gathered:  # the update gathers one layer at a time
            for model in self.trained:
                sharding.release(model)
            self.gathered = False
        losses = self.learner.train(step, part, totals)
        self.rollout.updated()
        return losses

    def end(self, carried: list[int]) -> None:
        for scorer in self.scorers.values():
            scorer.end(carried)
        self.rollout.end()

    def engine_stats(self):
        """The rollout engine's counts of the step (None: the hf loop has none)."""
        return self.rollout.engine_stats()

    def close(self) -> None:
        """Stop the rollout engine's process, if any."""
        self.rollout.close()

    def state(self, role: str) -> dict[str, torch.Tensor] | None:
        """A role's whole weights on the CPU (the trained critic, for a critic scoring in another process). Sharded
        weights are gathered (every rank takes part) and only rank 0 answers."""
        state = {k: sharding.full(v.detach()).cpu() for k, v in getattr(self.roles, role).state_dict().items()}
        return None if self.sharded and dist.get_rank() != 0 else state

    def digest(self) -> str:
        """A digest of what the ranks must agree on after a step (:func:`~oppo.exec.compute.update.weights_digest`): the
        trained weights (actor and, for PPO, critic) and their optimizers' replicated state; sharded, in place of
        the weights, this rank's check that its shards are what its last update left."""
        return weights_digest(*self.trained, optimizers=self.learner.optimizers, written=self.learner.written)


def trained_roles(config: ExecConfig) -> tuple[str, ...]:
    """The roles a rank trains: the actor, and the critic under PPO (GRPO: the actor alone)."""
    return ("actor", "critic") if config.schedule.algo == "ppo" else ("actor",)


def trained_models(config: ExecConfig, roles: Roles) -> list[torch.nn.Module]:
    """The models a rank trains (:func:`trained_roles`)."""
    return [getattr(roles, role) for role in trained_roles(config)]


def join_group(backend: str, address: str, port: int, rank: int, world: int) -> None:
    """Join the run's process group (``backend``: gloo or nccl) through the TCP store at ``address:port``."""
    dist.init_process_group(
        backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world, timeout=timedelta(minutes=10)
    )


class LocalGroup:
    """The actor group as one rank in the driver process (no process group): calls run in place."""

    size = 1

    def __init__(self, rank: ActorRank) -> None:
        self.rank = rank
        self.labels = [rank.label]

    def call(self, method: str, args: list[tuple]) -> list:
        """``method`` on every rank with its own arguments (one tuple per rank); the ranks' results in order."""
        return [getattr(self.rank, method)(*args[0])]

    def send(self, method: str, args: list[tuple]) -> None:
        """``method`` on every rank without waiting for the results (here: run in place)."""
        self.call(method, args)

    def first(self, method: str, *args):
        """``method`` on rank 0 only (every rank holds the same weights)."""
        return getattr(self.rank, method)(*args)

    def collect(self) -> list:
        """Trace rows recorded elsewhere (none: this rank records on the driver's recorder)."""
        return []

    def close(self) -> None:
        """Stop what the rank started (a rollout engine's process)."""
        self.rank.close()
