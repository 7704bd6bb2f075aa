"""Which roles a run loads and where they sit: the actor group's ranks hold the actor with its colocated scorers
(reference, critic), the driver the reward model; a role placed elsewhere (its own worker) is left out of both."""

from __future__ import annotations

import torch

from oppo.exec.compute.scoring import LocalScorer
from oppo.exec.compute.timing import Recorder
from oppo.exec.config import ExecConfig
from oppo.exec.models.roles import Roles
from oppo.exec.step.rank import ActorRank, LocalGroup


def device_name(device: torch.device) -> str:
    return "cpu0" if device.type == "cpu" else f"cuda:{device.index or 0}"


def local_parts(config: ExecConfig, roles: Roles, recorder: Recorder, remote: tuple[str, ...] = ()):
    """The actor group as one rank in this process, and the driver's scorers, leaving out the ``remote`` roles."""
    label = device_name(roles.device)
    rank = ActorRank(config, roles, recorder, label, rank_roles(config, remote))
    return LocalGroup(rank), driver_scorers(config, roles, recorder, label, remote)


def driver_scorers(config: ExecConfig, roles: Roles, recorder: Recorder, label: str, remote: tuple[str, ...] = ()):
    """The scorer roles the driver process holds (the reward model, unless it is a rule or ``remote``)."""
    return {
        role: LocalScorer.for_role(role, roles.reward, roles.pad_id, recorder, label)
        for role in driver_roles(config, remote)
    }


def run_roles(config: ExecConfig) -> tuple[str, ...]:
    """The models a run loads: the actor, its scorer roles (no critic under GRPO, no reward model with a rule)."""
    return ("actor", *scorer_roles(config))


def scorer_roles(config: ExecConfig) -> list[str]:
    """Scorer roles of a run: reference, the critic (PPO), and the reward model unless it is a rule."""
    names = ["reference"] + (["critic"] if config.schedule.algo == "ppo" else [])
    return names + (["reward"] if config.reward_model else [])


def rank_roles(config: ExecConfig, remote: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Scorer roles colocated with the actor on each rank: reference and critic, unless they run elsewhere."""
    return tuple(r for r in scorer_roles(config) if r in ("reference", "critic") and r not in remote)


def driver_roles(config: ExecConfig, remote: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Scorer roles in the driver process: the reward model, unless it runs elsewhere."""
    return tuple(r for r in scorer_roles(config) if r == "reward" and r not in remote)
