"""Where tasks run: in this process, a local process pool, or Ray (a local instance or a cluster).

Every backend runs the same `run_task` on the same `Task`s and yields `Outcome`s as they
finish, so results do not depend on the backend; only the order of arrival does.
Workers return values and never write files: on a cluster they may not share a disk.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Literal

from orcasim.config import ScenarioError, is_whole_number
from orcasim.sweeps.spec import Task
from orcasim.sweeps.task import Outcome, run_task

Backend = Literal["local", "ray"]
RAY_POLL_S = 0.25
# How long a named Ray head has to accept a connection before the run is refused: given an
# address where nothing listens, ray.init retries for minutes, printing warnings.
RAY_CONNECT_TIMEOUT_S = 5.0


# A module-level function from a job to its outcome; it must turn its own errors into a
# failed outcome (a worker that dies is reported through `failed`).
Runner = Callable[[Any], Any]


def default_workers() -> int:
    """The local backend's workers when none are given: one per CPU."""
    return os.cpu_count() or 1


def check_backend(backend: str, workers: int | None, address: str | None = None) -> None:
    if backend not in ("local", "ray"):
        # Named as the command line writes them, as --address is: 'workers = 0' named no option.
        raise ScenarioError(f"--backend = {backend!r}: expected 'local' or 'ray'")
    # From Python, a float or a string raised TypeError from the pool ('2' < 1, range(1.5)).
    if workers is not None and not is_whole_number(workers):
        raise ScenarioError(f"--workers = {workers!r}: expected a whole number, at least 1")
    if workers is not None and workers < 1:
        raise ScenarioError(f"--workers = {workers}: expected at least 1")
    if backend == "ray" and address is not None:
        check_ray_address(address)


def check_ray_address(address: str) -> None:
    """A Ray cluster's address (`host:port` of its head, or `ray://host:port` for Ray
    Client) must answer before the run starts; `auto` and `local` are Ray's own to resolve
    (a missing `auto` cluster fails at once)."""
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    expected = ("expected the host:port of a running Ray head (as `ray start --head` prints "
                "it), auto, or no --address for a local instance")
    if not host or not port.isdigit():
        raise ScenarioError(f"--address = {address!r}: {expected}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), RAY_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ScenarioError(f"--address = {address!r}: nothing answers at {host}:{port} "
                            f"({reason}); {expected}") from None


def execute(
    tasks: Sequence[Task], backend: Backend = "local", workers: int | None = None,
    address: str | None = None,
) -> Iterator[Outcome]:
    """Run `tasks` and yield each Outcome as soon as it is done."""
    yield from execute_jobs(tasks, run_task, Outcome.failed, backend, workers, address)


def execute_jobs(
    jobs: Sequence[Any], run: Runner, failed: Callable[[Any, BaseException], Any],
    backend: Backend = "local", workers: int | None = None, address: str | None = None,
) -> Iterator[Any]:
    """Run `run(job)` for every job on `backend` and yield each result as soon as it is
    done; `failed(job, error)` stands in for a job whose worker died."""
    check_backend(backend, workers, address)
    if not jobs:
        return
    match backend:
        case "local":
            yield from _local(jobs, run, failed, workers or default_workers())
        case "ray":
            yield from _ray(jobs, run, failed, workers, address)


def _local(tasks: Sequence[Any], run: Runner, failed: Callable[[Any, BaseException], Any],
           workers: int) -> Iterator[Any]:
    if workers == 1 or len(tasks) == 1:
        for task in tasks:  # no pool: easier to debug, and no start-up cost
            yield run(task)
        return
    # A worker that dies (out of memory, a crash) breaks the whole pool, and every task
    # still in it failed with it: one point killed by the OOM killer failed the other 5 of
    # 8, queued ones that never ran (a tester's finding). Only the tasks in flight then
    # can be the cause: each runs again alone, so that the one that kills its worker fails
    # by itself; the rest go on in a fresh pool.
    pending = list(tasks)
    while pending:
        suspects, pending = yield from _pool(pending, run, failed, workers)
        for task in suspects:
            alone, _ = yield from _pool([task], run, failed, 1)
            for dead in alone:
                yield failed(dead, BrokenProcessPool(WORKER_DIED))


# Why a task's worker died, as far as the parent can tell. A script that starts a sweep
# without the guard has every worker import it again and die (a tester's finding: 27 of 27
# points of notebook 02 pasted into a script).
WORKER_DIED = ("its worker died while it ran (out of memory, or a crash; in a script, a sweep "
               "started outside `if __name__ == \"__main__\":` kills every worker it spawns)")


def _pool(tasks: Sequence[Any], run: Runner, failed: Callable[[Any, BaseException], Any],
          workers: int) -> Generator[Any, None, tuple[list[Any], list[Any]]]:
    """Run `tasks` in a process pool, yielding each result, until they are done or a worker
    dies; then return the tasks in flight when it died and those never submitted. At most
    `workers` tasks are in flight at a time, so that those are few."""
    # spawn, not fork: the parent may hold threads (the progress bar), and fork copies locks.
    # Workers ignore Ctrl-C: the parent alone decides, so a second press cannot leave a pool
    # half shut down and waiting on workers that died mid-task.
    ctx = multiprocessing.get_context("spawn")
    workers = min(workers, len(tasks))
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                               initializer=_start_worker, initargs=(os.getpid(),))
    queue = list(reversed(tasks))
    in_flight: dict[Future[Any], Any] = {}
    suspects: list[Any] = []

    def top_up() -> None:
        while queue and len(in_flight) < workers and not suspects:
            try:
                with _interrupts_blocked():  # a submit may start a worker
                    in_flight[pool.submit(run, queue[-1])] = queue[-1]
            except BrokenProcessPool:  # broken since the last wait: its futures tell by whom
                return
            queue.pop()

    try:
        top_up()
        while in_flight:
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            results = []
            for future in done:
                task = in_flight.pop(future)
                try:
                    results.append(future.result())
                except BrokenProcessPool:
                    suspects.append(task)
                except Exception as e:  # noqa: BLE001 - the task could not be sent or returned
                    results.append(failed(task, e))
            top_up()  # before the caller writes what is done: the workers stay busy
            yield from results
    except BaseException:
        # Ctrl-C, SIGTERM or a caller that stopped early: drop the queued tasks and stop the
        # running ones now, without waiting; finished ones are already written, so --resume
        # starts from there. A second Ctrl-C meanwhile must not cut this short.
        with _interrupts_deferred():
            pool.shutdown(wait=False, cancel_futures=True)
            for child in multiprocessing.active_children():
                child.terminate()
        raise
    pool.shutdown(wait=True)
    return suspects, list(reversed(queue))


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Ignore Ctrl-C meanwhile (in the main thread; elsewhere signals cannot be set)."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _interrupts_blocked() -> Iterator[None]:
    """Hold Ctrl-C back meanwhile: a worker started now inherits the blocked signal, so one
    still importing (before `_start_worker`) cannot die of it with a traceback; this
    process takes it when the block ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _start_worker(parent_pid: int) -> None:
    """A worker's start: Ctrl-C is the parent's to act on (a pending one, held back while the
    worker started, is dropped with it), and the worker exits when the parent is gone.
    A parent killed outright (SIGKILL, out of memory) left its idle workers waiting forever,
    holding its stdout and stderr, so a caller reading them (a pipe, CI) hung (a tester's
    finding). Polled, not PR_SET_PDEATHSIG, which is Linux's alone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()


PARENT_POLL_S = 0.5


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)  # orphaned: reparented to init or a subreaper


@contextlib.contextmanager
def joined(backend: Backend, workers: int | None = None,
           address: str | None = None) -> Generator[None, None, None]:
    """The backend ready for the whole run: Ray joined (or started) before a run writes its
    folder, so that a cluster that is not there leaves nothing behind. `--address auto`
    with no cluster running failed after the folder held its plan, and the same command
    then needed --resume or --force (a tester's note). Nothing to do for the local pool."""
    if backend != "ray":
        yield
        return
    ray = _import_ray()
    if ray.is_initialized():  # the caller's own instance: theirs to shut down
        yield
        return
    _init_ray(ray, workers, address)
    try:
        yield
    finally:
        ray.shutdown()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ScenarioError(
            "--backend ray needs Ray: pip install 'orcasim[cluster]'"
        ) from None
    return ray


def _init_ray(ray: Any, workers: int | None, address: str | None) -> None:
    """With no address Ray starts a local instance; with one it joins that cluster."""
    try:
        ray.init(address=address, num_cpus=None if address else (workers or default_workers()),
                 include_dashboard=False, log_to_driver=False)
    except ConnectionError as e:  # `auto` with no cluster to find (named ones are checked first)
        raise ScenarioError(f"--address = {address!r}: {' '.join(str(e).split())}; expected a "
                            "running cluster (`ray start --head` on this machine, or "
                            "RAY_ADDRESS), or no --address for a local instance") from None


def _ray(tasks: Sequence[Any], run: Runner, failed: Callable[[Any, BaseException], Any],
         workers: int | None, address: str | None) -> Iterator[Any]:
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        _init_ray(ray, workers, address)
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run)
        # At most `workers` in flight: on a cluster joined with --address (where Ray's own
        # CPU count, not ours, sets how many run at once) --workers was read by nothing.
        queued = iter(tasks)
        limit = workers or len(tasks)
        pending = {remote.remote(t): t for t in itertools.islice(queued, limit)}
        while pending:
            # Collect whatever finished in the last moment: one wait per task would be
            # quadratic in the number of tasks.
            refs = list(pending)
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=RAY_POLL_S)
            for ref in done:
                task = pending.pop(ref)
                for following in itertools.islice(queued, 1):
                    pending[remote.remote(following)] = following
                try:
                    yield ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a worker or node died
                    yield failed(task, e)
    finally:
        if started:
            ray.shutdown()
