"""What the fuzz tests of the readers of user input share (tests/sim/test_fuzz_*.py, tests/exec/test_fuzz_*.py).

The contract they check: a reader given bad input (a setup TOML, a log, a dataset row, a reward) either returns a
valid object or raises one of :data:`oppo.cli.USER_ERRORS` whose message is one line (what ``run_cli`` prints as
``error: ...`` with exit code 2); never another exception type (that would be a traceback), never a hang.

Each property runs a modest, derandomized number of examples in the default run (CI is deterministic and the
default run stays fast) and many more under ``-m slow``; ``--hypothesis-show-statistics`` prints how many were tried.
"""

from __future__ import annotations

import contextlib
import signal

from hypothesis import HealthCheck, settings

from oppo.cli import USER_ERRORS

HANG_S = 20.0  # one example over this is a hang: no reader takes a second on these small inputs


class Hang(BaseException):  # noqa: N818 -- not an Exception: a reader's ``except Exception`` must not swallow it
    """An example ran past :data:`HANG_S`."""


def fuzz_settings(examples: int) -> settings:
    """``examples`` derandomized examples, no example database (the run is the same everywhere), no deadline (a
    loaded machine makes timings flaky): :func:`within` fails a hang instead."""
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


@contextlib.contextmanager
def within(seconds: float = HANG_S):
    """Raise :class:`Hang` in the block once it has run ``seconds`` (SIGALRM: the main thread only)."""

    def ring(signum, frame):
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def outcome(call, *args, **kwargs):
    """``(call(*args, **kwargs), None)``, or ``(None, error)`` for a user error, whose message is checked to be one
    non-empty line; any other exception propagates (a test fails with its traceback), as does a :class:`Hang`."""
    with within():
        try:
            return call(*args, **kwargs), None
        except USER_ERRORS as err:
            assert_one_line(str(err))
            return None, err


def assert_one_line(message: str) -> None:
    lines = message.strip().splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"not one line: {message!r}"


def one_grpo_step(data, reward_fn, out, *extra) -> list:
    """The executor's options of one GRPO step of the tiny preset on ``data`` scored by ``reward_fn``."""
    head = ["--preset", "tiny-cpu", "--data", data, "--reward-fn", reward_fn, "--algo", "grpo", "--group-size", "2"]
    return [*head, "--steps", "1", *extra, "--out", out]
