"""The shape of a package's import graph: its modules (rooms of the top level), the longest chain of imports among
them (floors) and the imports between them (arrows), module by module and room by room.

    .venv/bin/python scripts/house.py oppo.sim oppo.exec

A room is a direct sub-package or module of the package; an arrow between rooms is any import from a module of
one into a module of the other. Imports inside functions count (they are imports all the same); a package's
``__init__`` is its face, not a module of its own.
"""

import argparse
import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules(package: str) -> dict[str, Path]:
    base = ROOT / package.replace(".", "/")
    found = {}
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``name`` imports."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            origin = (
                ".".join(package[: len(package) - node.level + 1] + [node.module or ""]) if node.level else node.module
            )
            candidates = [f"{origin}.{a.name}" for a in node.names] + [origin]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        out |= {next((c for c in candidates if c in known), None)} - {None, name}
    return out


def longest_chain(edges: dict[str, set[str]]) -> int:
    @functools.cache
    def depth(node: str) -> int:
        return 1 + max((depth(n) for n in edges[node]), default=0)

    return max(map(depth, edges), default=0)


def house(package: str) -> str:
    known = modules(package)
    inner = {m: p for m, p in known.items() if p.name != "__init__.py"}  # a package's face is not a room of its own
    edges = {m: imports(m, p, inner) for m, p in inner.items()}
    room = {m: ".".join(m.split(".")[: package.count(".") + 2]) for m in inner}
    rooms = {r: set() for r in room.values()}
    for m, targets in edges.items():
        rooms[room[m]] |= {room[t] for t in targets} - {room[m]}
    return (
        f"{package}: {len(inner)} modules, {longest_chain(edges)} floors, {sum(map(len, edges.values()))} arrows; "
        f"{len(rooms)} rooms at its top, {longest_chain(rooms)} floors, {sum(map(len, rooms.values()))} arrows"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("packages", nargs="+", help="dotted package names, e.g. oppo.sim")
    for package in parser.parse_args().packages:
        print(house(package))


if __name__ == "__main__":
    main()
