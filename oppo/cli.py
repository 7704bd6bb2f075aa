"""Command-line plumbing shared by ``python -m oppo.sim`` and ``python -m oppo.exec.train``."""

from __future__ import annotations

import sys
from collections.abc import Callable

# Errors that mean "bad input": a config value, a file, a trace. They end the command with exit code 2 and
# one line; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, KeyError)


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run ``main`` and turn user errors into ``error: <message>`` on stderr with exit code 2."""
    try:
        return main(argv) or 0
    except USER_ERRORS as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: records written so far are kept", file=sys.stderr)
        return 130
