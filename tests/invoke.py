"""The two command lines run in the test process: ``python -m oppo.exec.train ARGS`` and ``python -m oppo.sim ARGS``
as :func:`oppo.cli.run_cli` runs them (the same parser, the same exit codes, the same one-line errors), without a
new interpreter. A new one costs ~8 s here before the command starts (importing torch and transformers); the tests
that need a real process (Ctrl-C, a killed worker, running from another directory, the installed entry points)
still start one.

Output is captured as a subprocess's would be (``returncode``, ``stdout``, ``stderr``). A bug (an exception that
is no user error) propagates with its traceback and fails the test; warnings go to the captured stderr, as in a
process. The process-wide state a run may change (torch threads and random state, the CPU cores this process may
use, the environment, the working directory) is put back after it. What one process cannot show (a stored config
re-run by another interpreter, with another hash seed) keeps a real process: tests/exec/test_train_cli.py."""

from __future__ import annotations

import contextlib
import io
import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

from oppo.cli import run_cli


def _main(module: str):
    if module == "oppo.exec.train":
        from oppo.exec.train import main
    elif module == "oppo.sim":
        from oppo.sim.cli import main
    else:
        raise ValueError(f"no command line {module!r}")
    return main


@contextlib.contextmanager
def process_state_kept():
    """Inside, a run may change torch's threads, the random states (torch's, numpy's and Python's: transformers'
    ``set_seed`` seeds all three), the environment and the cores this process may use; they are put back after it."""
    threads, rng, environ = torch.get_num_threads(), torch.get_rng_state(), dict(os.environ)
    np_rng, py_rng = np.random.get_state(), random.getstate()
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)
        os.environ.clear()
        os.environ.update(environ)
        if cores is not None:
            os.sched_setaffinity(0, cores)


def invoke(module: str, *args, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``python -m module *args`` in this process (``cwd``: run from there)."""
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(process_state_kept())
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(warnings.catch_warnings())
        # as an interpreter shows them (once per place, on stderr): pytest would otherwise collect them itself and a
        # test of "one line on stderr" would not see a stray warning
        warnings.simplefilter("default")
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: err.write(
            warnings.formatwarning(message, category, filename, lineno, line)
        )
        try:
            code = run_cli(_main(module), argv)
        except SystemExit as exit_:  # argparse: --help (0), a malformed option (2)
            code = 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1
    return subprocess.CompletedProcess([sys.executable, "-m", module, *argv], code, out.getvalue(), err.getvalue())


def train(*args, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    return invoke("oppo.exec.train", *args, cwd=cwd)


def sim(*args, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    return invoke("oppo.sim", *args, cwd=cwd)
