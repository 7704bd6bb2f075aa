"""The folder a ``sweep`` or a ``plan`` writes its table to, and ``--resume DIR``: the command's resolved options in
``DIR/command.json`` before its first simulation, each finished simulation in ``DIR/journal.jsonl``
(:mod:`oppo.sim.study.journal`); a resumed command reads both and simulates only what the journal lacks."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from oppo.data import read_config_json
from oppo.records.io import write_json
from oppo.records.provenance import provenance
from oppo.records.stored_config import with_provenance
from oppo.sim.study.journal import COMMAND, JOURNAL, Journal, digest

# --resume DIR: sweep and plan record their resolved options in DIR/command.json before their first simulation and
# each simulation's result in DIR/journal.jsonl as it comes back (oppo.sim.study.journal); --resume reads both and
# simulates only what the journal lacks. Options that change where the simulations run (or a plot sweep and plan do
# not draw) may differ from the interrupted command's; any other given must equal it.
RESUME_FORMAT = 1
FREE_ON_RESUME = ("workers", "ray_address", "timeline_steps")


def resume_arg(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument(
        "--resume",
        metavar="DIR",
        help=f"finish the table a killed or interrupted {command} began in DIR: its options are read from "
        "DIR/command.json, the simulations DIR/journal.jsonl holds are not run again, and the table is the one an "
        "uninterrupted run writes (other options: left out, or equal to the first run's; --workers and "
        "--ray-address may change)",
    )


@dataclasses.dataclass
class Table:
    """The folder a sweep or a plan writes, and with ``--resume`` the interrupted command's ``command.json``."""

    command: str
    folder: Path
    begun: dict | None = None  # None: a new table

    def journal(self, args: argparse.Namespace, inputs: dict) -> Journal:
        """The journal of the table's simulations. A new table writes its resolved options, the ``inputs``' digest
        (the setup, the trace's content, ...) and its provenance to ``command.json`` before its first simulation; a
        resumed one must find the same digest (an edited setup file or trace makes another table)."""
        folder, resume = self.folder, f"python -m oppo.sim {self.command} --resume {self.folder}"
        fingerprint = digest(inputs)
        if self.begun is None:

            def begin() -> None:
                options = {k: v for k, v in vars(args).items() if k not in ("command", "resume")}
                record = {"format": RESUME_FORMAT, "command": self.command, "options": options, "cwd": os.getcwd()}
                write_json(folder / COMMAND, record | {"inputs": fingerprint, "provenance": provenance()})

            return Journal(folder, fresh=True, begin=begin, resume=resume)
        if self.begun.get("inputs") != fingerprint:
            raise ValueError(
                f"--resume {folder}: the setup, the length trace or the stored run its options name changed since "
                f"the table began (their digest differs): a new --out makes the table of the files as they are now"
            )
        return Journal(folder, fresh=False, resume=resume)

    def resumed(self, journal: Journal) -> None:
        """With --resume: what was read back and what simulated (stderr, beside the table)."""
        if self.begun is not None:
            print(
                f"resumed {self.folder}: {journal.reused} simulations read back from {JOURNAL}, "
                f"{journal.simulated} simulated",
                file=sys.stderr,
            )

    def provenance_of(self, config: dict) -> dict:
        """``config`` with provenance: a resumed table's is the first command's, with this one under ``resumed``."""
        return with_provenance(config, self.folder / COMMAND if self.begun is not None else None)


def table_for(args: argparse.Namespace, command: str) -> Table:
    """The folder ``--out`` names, or with ``--resume DIR`` the interrupted command's: its stored options fill those
    left out of ``args``; one given beside ``--resume`` that differs from the stored one is refused (it would make
    another table), but for :data:`FREE_ON_RESUME`. The command runs in the directory where it began (its relative
    paths: a trace, a setup file)."""
    if args.resume is None:
        if args.out is None:
            raise ValueError(f"{command} needs --out DIR (or --resume DIR: finish the table a {command} began there)")
        return Table(command, Path(args.out))
    folder = Path(args.resume).resolve()
    where = f"--resume {args.resume}"
    if not (folder / COMMAND).is_file():
        raise ValueError(f"{where}: no table to finish there (no {COMMAND}: {command} writes it as it begins)")
    begun = read_config_json(folder / COMMAND, COMMAND)
    if begun.get("format") != RESUME_FORMAT or not isinstance(begun.get("options"), dict):
        raise ValueError(f"{where}: {COMMAND} of another format ({begun.get('format')!r}, this oppo reads 1)")
    if begun.get("command") != command:
        other = begun.get("command")
        raise ValueError(f"{where}: a {other} began there (python -m oppo.sim {other} {where} finishes it)")
    stored = {k: tuple(v) if isinstance(v, list) else v for k, v in begun["options"].items()}
    if args.out is not None and Path(args.out).resolve() != folder:
        raise ValueError(f"{where}: --out {args.out} is another folder (leave --out out)")
    left_out = ("command", "resume", "out", *FREE_ON_RESUME)
    changed = [
        f"--{k.replace('_', '-')} {_shown(v)} (began "
        + ("without it)" if stored.get(k) is None else f"with {_shown(stored.get(k))})")
        for k, v in vars(args).items()
        if k not in left_out and v is not None and _json(v) != _json(stored.get(k))
    ]
    if changed:
        raise ValueError(f"{where}: {'; '.join(changed)} would make another table; leave it out, or give a new --out")
    for k, v in stored.items():
        if k not in ("command", "resume") and getattr(args, k, None) is None:
            setattr(args, k, v)
    cwd = Path(begun.get("cwd") or os.getcwd())
    if cwd.is_dir() and cwd.resolve() != Path.cwd().resolve():
        os.chdir(cwd)
        print(f"resuming in {cwd}, where the table began (its relative paths are read from there)", file=sys.stderr)
    if Path(args.out).resolve() != folder:  # the folder was moved or renamed since
        args.out = str(folder)
    first, here = begun.get("provenance") or {}, provenance()
    if (first.get("oppo"), first.get("commit")) != (here["oppo"], here["commit"]):
        print(
            f"note: the table was begun by oppo {first.get('oppo')} ({first.get('commit')}), resumed by "
            f"{here['oppo']} ({here['commit']}): its results mix the two where they differ",
            file=sys.stderr,
        )
    return Table(command, folder, begun)


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple | list) else str(value)


def _json(value):
    """A value as command.json stores it (tuples as lists)."""
    return json.loads(json.dumps(value))
