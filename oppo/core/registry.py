"""Named variants of the core (scheduling policies, Δ controllers), each registered once, beside its definition.

A registry keeps its entries in registration order: that order is the one ``--help`` and error messages list.

>>> shapes = Registry("shape")
>>> shapes.add("square", 4, "four sides")
>>> shapes.add("triangle", 3, "three sides")
>>> shapes.names, shapes["triangle"]
(('square', 'triangle'), 3)
>>> shapes.described()
'square (four sides) or triangle (three sides)'
>>> shapes["circle"]
Traceback (most recent call last):
...
ValueError: unknown shape 'circle'; choose from square, triangle
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> entry, with a short description per name, in registration order; a name is registered once."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # what an entry is, for error messages: "policy", "delta_controller"
        self._entries: dict[str, T] = {}
        self._descriptions: dict[str, str] = {}

    def add(self, name: str, entry: T, description: str) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered already")
        self._entries[name] = entry
        self._descriptions[name] = description

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; choose from {', '.join(self._entries)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def described(self) -> str:
        """Every name with its description, for a help line: ``a (…), b (…) or c (…)``."""
        parts = [f"{name} ({self._descriptions[name]})" for name in self._entries]
        return " or ".join([", ".join(parts[:-1]), parts[-1]]) if len(parts) > 1 else "".join(parts)
