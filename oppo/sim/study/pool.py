"""Simulations spread over local processes (``--workers N``) or a Ray cluster (``--ray-address ADDR``).

:func:`evaluate` maps a module-level function over items and returns the results in the items' order, whoever
ran them: a simulation is deterministic for its config and seed, so the rows of a sweep, a comparison or a plan do
not depend on where or in which order they were computed. A progress bar counts evaluations done and time left.
This is the one simulator module that imports Ray (lazily, when an address is given)."""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from oppo.cli import Interrupted

CONNECT_TIMEOUT_S = 5.0  # an unreachable cluster is reported within this, not after Ray's own minute of retries


@dataclass(frozen=True)
class Pool:
    workers: int = 1  # local processes (1: in this process)
    ray_address: str | None = None  # "auto" or "host:port": Ray tasks on that cluster instead

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")


IN_PROCESS = Pool()


def add_pool_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("where the simulations run (same rows whichever)")
    group.add_argument("--workers", type=int, help="local worker processes (default: 1, this process)")
    group.add_argument(
        "--ray-address", metavar="ADDR", help="run the simulations as Ray tasks on this cluster ('auto' or host:port)"
    )


def pool_from(args: argparse.Namespace) -> Pool:
    return Pool(1 if args.workers is None else args.workers, args.ray_address)  # None: left out


def evaluate(
    fn: Callable[[Any], Any],
    items: Sequence[Any],
    pool: Pool = IN_PROCESS,
    desc: str = "sims",
    done: Callable[[int, Any], None] | None = None,
) -> list:
    """``[fn(item) for item in items]``, computed where ``pool`` says, in the items' order. ``done(i, result)`` is
    called in this thread as each result comes back, in the order they finish (a journal of finished simulations:
    :mod:`oppo.sim.study.journal`). Ctrl-C cancels what is queued and stops what runs (worker processes are ended),
    raising :class:`~oppo.cli.Interrupted`."""
    finished = _Count()  # results computed (the bar counts nothing when it is disabled: no terminal)
    with tqdm(total=len(items), desc=desc, unit="sim", disable=None, leave=False) as bar:
        progress = finished.then(bar.update)
        try:
            if pool.ray_address:
                return _on_ray(fn, items, pool.ray_address, progress, done or _ignore)
            if pool.workers == 1 or len(items) < 2:
                results = []
                for i, item in enumerate(items):
                    results.append(fn(item))
                    progress()
                    if done is not None:
                        done(i, results[-1])
                return results
            return _on_processes(fn, items, min(pool.workers, len(items)), progress, done or _ignore)
        except KeyboardInterrupt:
            done = finished.n
            raise Interrupted(
                f"{done} of {len(items)} simulations had finished, the other {len(items) - done} were cancelled; "
                "nothing written (the command writes its files once all are done)"
            ) from None


def _ignore(i: int, result: Any) -> None:
    pass


class _Count:
    """How many results have been computed; ``then(f)``: a callback that counts one and calls ``f``."""

    def __init__(self) -> None:
        self.n = 0

    def then(self, also: Callable[[], Any]) -> Callable[[], None]:
        def one() -> None:
            self.n += 1
            also()

        return one


def _on_processes(fn, items, workers: int, progress: Callable[[], None], done: Callable[[int, Any], None]) -> list:
    # forkserver: workers start from a clean interpreter (no inherited threads or open plots), once each. They
    # ignore SIGINT: a Ctrl-C reaches the whole process group, and this process alone decides, ending them all.
    context = multiprocessing.get_context("forkserver" if os.name == "posix" else "spawn")
    executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_start, initargs=(os.getpid(),))
    try:
        # submit() takes the pool's locks and spawns workers: a Ctrl-C raised in there can leave a lock held or a
        # worker unregistered, and the pool's thread, which the interpreter joins at exit, waiting on it forever
        with _sigint_deferred():
            futures = [executor.submit(fn, item) for item in items]
            for future in futures:  # counted when a result came back, not when cancelled or broken
                future.add_done_callback(lambda f: None if f.cancelled() or f.exception() else progress())
        index = {future: i for i, future in enumerate(futures)}
        for future in as_completed(futures):  # a simulation's error is raised as soon as it comes back
            done(index[future], future.result())
        results = [future.result() for future in futures]  # in order: the items' rows whichever finished first
    except BaseException:  # Ctrl-C, or a simulation's error: cancel what is queued, stop what runs
        workers_left = list(executor._processes.values())  # no public handle on them before 3.14; stable since 3.8
        # the queue's feeder thread may be blocked writing calls into a pipe the workers ended below no longer read;
        # the pool's thread, which the interpreter joins at exit, would wait on it forever (CPython 3.11 unblocks it
        # on Windows alone, gh-107219): it is a daemon thread, let it go
        executor._call_queue.cancel_join_thread()
        executor.shutdown(wait=False, cancel_futures=True)
        for process in workers_left:
            process.terminate()
        for process in workers_left:
            process.join(timeout=5)
            if process.is_alive():  # deaf to SIGTERM: the manager thread must not wait on it at exit
                process.kill()
        # the pool's thread closes its wake-up pipe as it ends; the interpreter's exit hook writes to that pipe
        # unlocked (CPython 3.11), and a close between its check and its write printed an EBADF traceback after the
        # one-line message: let the thread end first (bounded: the workers are gone, it has nothing to wait on)
        manager = executor._executor_manager_thread
        if manager is not None:
            manager.join(timeout=5)
        raise
    executor.shutdown()
    return results  # a worker that dies mid-task (killed, out of memory) raises BrokenProcessPool: no hang


def _worker_start(leader: int) -> None:
    """A worker ignores SIGINT (see :func:`_on_processes`) and ends once the process that started the pool is gone:
    killed (SIGKILL: no handler of its runs), it leaves no worker waiting on a queue nobody writes, nor simulating
    for nobody (a killed sweep's ``--resume`` would share the cores with them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_end_with, args=(leader,), daemon=True, name="oppo-leader-watch").start()


def _end_with(leader: int) -> None:
    """Wait for process ``leader`` to end, then end this one."""
    if hasattr(os, "pidfd_open"):  # Linux: readable once the process has ended
        try:
            fd = os.pidfd_open(leader)
        except OSError:  # already gone, or pidfds unavailable (an old kernel, a sandbox)
            fd = None
            if not _alive(leader):
                os._exit(1)
        if fd is not None:
            select.select([fd], [], [])
            os._exit(1)
    while _alive(leader):  # elsewhere: look twice a second
        time.sleep(0.5)
    os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone (PermissionError: another user's process took its pid)
        return False
    return True


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """A Ctrl-C within the block is raised (as KeyboardInterrupt) once the block is done, not in the middle of it.
    Where Ctrl-C does not raise KeyboardInterrupt (SIGINT ignored, as in a background job, or handled by the caller)
    nothing changes."""
    main = threading.current_thread() is threading.main_thread()  # signals reach the main thread alone
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _on_ray(fn, items, address: str, progress: Callable[[], None], done: Callable[[int, Any], None]) -> list:
    import ray

    check_reachable(address)
    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except ConnectionError as err:
            raise ValueError(f"--ray-address {address}: no Ray cluster there ({err})") from None
    try:
        task = ray.remote(num_cpus=1)(fn)
        refs = [task.remote(item) for item in items]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        try:
            while pending:
                finished, pending = ray.wait(pending, num_returns=1)
                for ref in finished:
                    progress()
                    done(index[ref], ray.get(ref))
        except KeyboardInterrupt:
            for ref in pending:  # queued ones never start, running ones are stopped (on a cluster we did not start)
                ray.cancel(ref, force=True)
            raise
        return ray.get(refs)
    finally:
        if started_here:
            ray.shutdown()


def check_reachable(address: str) -> None:
    """A ``host:port`` address must accept a connection within :data:`CONNECT_TIMEOUT_S` (``auto`` is Ray's)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--ray-address {address!r}: expected 'auto' or host:port")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise ValueError(f"--ray-address {address}: cannot connect ({err})") from None
