"""The scheduling policies: what each one switches on in the core, registered here in the order ``--help`` lists.

A policy is a configuration of the one scheduling core (:mod:`oppo.core.scheduler`), not a copy of its loop: a
:class:`PolicySpec` names the core's switches it turns on, and code reads the switches, never the policy's name.
A new policy is one :func:`register_policy` call below (the backends may need more: a simulated device
placement, an executor's trainer).

>>> policy_spec("oppo").streaming, policy_spec("oppo").overcommit, policy_spec("oppo").adaptive_delta
(True, True, True)
>>> [p for p in POLICIES if policy_spec(p).overcommit]
['inter', 'oppo', 'april', 'tailbatch']
"""

from __future__ import annotations

from dataclasses import dataclass

from oppo.core.registry import Registry


@dataclass(frozen=True)
class PolicySpec:
    """One scheduling policy: its name, a one-line description and the core's switches it turns on."""

    name: str
    description: str
    streaming: bool = False  # scorers prefill chunk by chunk while the actor decodes (intra-step overlap)
    overcommit: bool = False  # B+Δ prompt groups in flight, train the first B complete (inter-step overlap)
    adaptive_delta: bool = False  # over-commit: Δ follows --delta-controller when --delta auto (else delta_max)
    aborts: bool = False  # over-commit: unfinished groups are aborted, regenerated alone in a long round of B
    truncated: bool = False  # T-PPO: each step generates at most window_tokens per sequence, trains the segments
    asynchronous: bool = False  # generation runs ahead of training by at most --staleness policy versions

    def __post_init__(self) -> None:
        if (self.adaptive_delta or self.aborts) and not self.overcommit:
            raise ValueError(f"policy {self.name!r}: adaptive_delta and aborts are over-commit's switches")


POLICY_SPECS: Registry[PolicySpec] = Registry("policy")


def register_policy(spec: PolicySpec) -> PolicySpec:
    POLICY_SPECS.add(spec.name, spec, spec.description)
    return spec


def policy_spec(name: str) -> PolicySpec:
    """The spec of a registered policy (``ValueError`` naming the registered ones otherwise)."""
    return POLICY_SPECS[name]


register_policy(PolicySpec("sync", "generate every sequence, then score and train: no overlap"))
register_policy(
    PolicySpec("intra", "stream chunks of each response to the scorers while the actor decodes", streaming=True)
)
register_policy(
    PolicySpec(
        "inter",
        "over-commit B+Δ prompts, train the first B finished, carry the rest",
        overcommit=True,
        adaptive_delta=True,
    )
)
register_policy(
    PolicySpec("oppo", "OPPO: intra and inter together", streaming=True, overcommit=True, adaptive_delta=True)
)
register_policy(
    PolicySpec("tppo", "T-PPO: at most window_tokens per sequence a step, trained as segments", truncated=True)
)
register_policy(
    PolicySpec("april", "APRIL partial rollout: a fixed Δ over-provisioned, the unfinished resume", overcommit=True)
)
register_policy(
    PolicySpec(
        "tailbatch",
        "RollPacker tail batching: a fixed Δ; the unfinished are aborted, rerun alone in a long round",
        overcommit=True,
        aborts=True,
    )
)
register_policy(
    PolicySpec("async", "generation runs ahead of training by at most --staleness versions", asynchronous=True)
)

POLICIES: tuple[str, ...] = POLICY_SPECS.names
