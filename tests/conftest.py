"""Settings for every test process, and for the subprocesses and notebook kernels the tests start (inherited).

One thread per process: the tiny models gain nothing from a second one, and on a loaded machine a torch thread
pool spinning against other processes slows a run many-fold. Set before any test module imports torch."""

import os
import sys

import pytest

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


@pytest.fixture
def shared_ray():
    """A local Ray started once for the tests that run on one (a run that finds Ray started joins it and leaves it
    up): its start and stop, ~15 s here, are paid once, not per test. Stopped at the session's end, or by
    :func:`without_ray` before a test of how a run starts and stops its own. What a run does only when it starts
    Ray itself (the resource check, the workers' environment, pinning) is tested without it: the tests of
    tests/exec/test_rollout_workers.py that take :func:`without_ray` (a failed start, the pinned cores), and with
    ``-m slow`` test_placement.py's command-line runs."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        os.environ.setdefault("RAY_worker_niceness", "0")  # as a run's own start sets it: workers at full priority
        # address "local": a new cluster of this process's own, never one a `ray start` left on the machine
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    return ray


@pytest.fixture
def without_ray():
    """No Ray in this process before the test: it checks what a run that starts its own leaves behind."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    return ray


def pytest_sessionfinish(session, exitstatus):
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def pytest_collection_modifyitems(session, config, items):
    """The tests of Ray first: those that start their own (:func:`without_ray`), then those on the shared one, so
    that a test process starts the shared Ray once (nothing stops it after) and the longest tests are not left
    for the end, where one test process would run them while the other idles."""
    items.sort(key=_ray_first)


def _ray_first(item) -> int:
    fixtures = getattr(item, "fixturenames", ())
    return 0 if "without_ray" in fixtures else 1 if "shared_ray" in fixtures else 2
