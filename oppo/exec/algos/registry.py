"""Registries of the RL variants, as verl's ``core_algos`` keeps them (``@register_adv_est("grpo")``): each variant is
a function decorated with its name and its peers' names (verl's, TRL's) where a mapping exists, in the module of its
family. The name is what ``--help``, the config's check and the peers' mappings read, so a new variant is one entry.

Torch-free: :mod:`oppo.exec.config` reads the names of the families it checks (KL estimators, loss aggregations)
without importing torch.

>>> kinds = Registry("kind", verl="verl_kind")
>>> @kinds.register("plain", verl="plain_kind")
... def plain(x):
...     '''x as it is.'''
...     return x
>>> kinds.names, kinds["plain"].fn(3), kinds["plain"].verl
(('plain',), 3, 'plain_kind')
>>> kinds["fancy"]
Traceback (most recent call last):
ValueError: unknown kind 'fancy'; choose from plain
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oppo.core.registry import Registry as NamedRegistry


@dataclass(frozen=True)
class Variant:
    """One registered variant: its name, its function and the names verl and TRL give it (None: no counterpart)."""

    name: str
    fn: Callable[..., Any]
    verl: str | None = None
    trl: str | None = None

    @property
    def summary(self) -> str:
        """The first paragraph of the function's docstring, on one line."""
        doc = inspect.getdoc(self.fn) or ""
        return " ".join(doc.split("\n\n")[0].split())


class Registry(NamedRegistry[Variant]):
    """The variants of one family by name, in the order they were registered (the core's registry, its entries
    variants with their peers' names). ``verl`` and ``trl``: the peers' options that take the variants' peer names
    (documentation)."""

    def __init__(self, family: str, verl: str = "", trl: str = "") -> None:
        super().__init__(family)
        self.family, self.verl, self.trl = family, verl, trl

    def register(self, name: str, *, verl: str | None = None, trl: str | None = None):
        """A decorator adding the function under ``name``; the function is returned unchanged."""

        def add(fn: Callable[..., Any]) -> Callable[..., Any]:
            variant = Variant(name, fn, verl, trl)
            self.add(name, variant, variant.summary)
            return fn

        return add

    def variants(self) -> list[Variant]:
        """Every variant, in registration order."""
        return [self[name] for name in self.names]

    def listed(self) -> str:
        """The names as a sentence lists them: ``a, b or c``."""
        *rest, last = self.names
        return f"{', '.join(rest)} or {last}" if rest else last

    def markdown(self) -> str:
        """The family as a Markdown table: name, what it computes (the docstring's summary), verl's and TRL's names
        (docs/executor.md holds one per family)."""
        peer = lambda name: f"`{name}`" if name else "none"  # noqa: E731
        rows = [f"| name | what it computes | verl {self.verl} | TRL {self.trl} |", "|---|---|---|---|"]
        rows += [f"| `{v.name}` | {v.summary} | {peer(v.verl)} | {peer(v.trl)} |" for v in self.variants()]
        return "\n".join(rows)
