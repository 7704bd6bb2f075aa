"""Command-line plumbing shared by ``python -m oppo.sim`` and ``python -m oppo.exec.train``: options generated
from config dataclasses, and user errors turned into one line with exit code 2."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oppo.core.config import ScheduleConfig, schedule_from, to_dict

# Errors that mean "bad input": a config value, a file, a trace. They end the command with exit code 2 and
# one line; anything else is a bug and keeps its traceback (a KeyError included: an unknown name given by the
# user is reported where it is looked up, as a ValueError naming the choices).
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)
# A write the disk refused (full, a file-size limit, a quota): the command ends with exit code 1 and one line; every
# file is written beside its name and renamed once complete, so those written before stay whole.
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what it left behind said in one line: raised where the default line ("records written so far
    are kept") would not be the whole story (a sweep writes its table only once every simulation is done)."""


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run ``main`` and turn user errors into ``error: <message>`` on stderr with exit code 2, Ctrl-C into one
    line with exit code 130."""
    try:
        return main(argv) or 0
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if err.errno not in DISK_FULL:
            raise
        print(f"error: {disk_full(err)}; the files written before it are kept", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:
        said = str(err) if isinstance(err, Interrupted) else "records written so far are kept"
        print(f"interrupted: {said}", file=sys.stderr)
        return 130


def disk_full(err: OSError) -> str:
    """One line for a write the disk refused."""
    return f"writing {err.filename or 'a file'} failed: {err.strerror or err}"


def add_config_args(
    parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (), shown: dict[str, Any] | None = None
) -> None:
    """Add one ``--field-name`` option per field of ``cls``. Options left out parse to None (the config's own
    default applies); help shows the dataclass default, or ``shown[field]`` where the command uses another."""
    group = parser.add_argument_group(cls.__name__)
    hints = typing.get_type_hints(cls)
    shown = shown or {}
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        kind = hints[f.name]
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} (default: {_show(shown.get(f.name, f.default))})"
        if kind is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            metavar = f.name.upper()
            group.add_argument(flag, dest=f.name, type=_parser_for(kind), default=None, help=help_text, metavar=metavar)


def given_options(cls: type, args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of ``cls`` the user set on the command line (options left out parse to None)."""
    return {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if f.name not in skip and getattr(args, f.name, None) is not None
    }


def layered_schedule(
    given: dict[str, Any], stored: ScheduleConfig | None, defaults: Callable[..., ScheduleConfig]
) -> ScheduleConfig:
    """The schedule a command runs, in one order for both CLIs: the options ``given`` on its command line over the
    stored run's schedule (``--config``), whole, or, with none stored, over ``defaults`` (a setup's or preset's
    values by field name over the core's defaults: :meth:`oppo.sim.setup.presets.Setup.schedule`,
    :func:`oppo.exec.config.default_schedule`). Either way Δ bounds left to their defaults follow a smaller batch
    (:func:`~oppo.core.config.schedule_from`)."""
    if stored is None:
        return defaults(**given)
    return schedule_from(to_dict(stored), **given)


def _show(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple | list) else str(value)


def _parser_for(kind: Any):
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        return lambda text: tuple(item(part) for part in text.split(",") if part)
    if isinstance(kind, types.UnionType):  # e.g. str | None: parse as the first concrete type
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    return kind


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum`` (anything else is a usage error, exit 2, one line)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value

    return parse


def integers(minimum: int = 0) -> Callable[[str], list[int]]:
    """An argparse ``type``: comma-separated integers, each >= ``minimum`` ("1,2,4")."""
    one = at_least(minimum)

    def parse(text: str) -> list[int]:
        values = [one(part.strip()) for part in text.split(",") if part.strip()]
        if not values:
            raise argparse.ArgumentTypeError("no value given")
        return values

    return parse


def directory(text: str) -> Path:
    """An argparse ``type``: an existing directory."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    return path


def format_table(rows: list[dict]) -> str:
    cols = list(rows[0])
    cells = [[("-" if r[c] is None else str(r[c])) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
