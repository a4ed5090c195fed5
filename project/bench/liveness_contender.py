"""One contender of each row of the liveness matrix, in one process: the program behind
tests/test_liveness.py and ``lease_bench --scenario liveness`` (project/bench/liveness.py).

    python -m project.bench.liveness_contender --index I --rows R1,R2,... --cycles K --hold H
        --out FILE --go PATH [--prefix P] [--timeout T] [--one-by-one] [--no-wakeups]

For each row (a primitive that waits: ``lock``, ``rwlock-write``, ``arwlock-mixed``, ...) one
thread (the asyncio rows: one task each on one event loop thread) takes that primitive K
times, holding it H seconds each time, with a timeout of T seconds. The row's other
contenders are other processes (the same program with another ``--index``), so every wake-up
a row depends on crosses processes, as it does between the servers of a farm: a release in
one process, the next grant in another.

Each grant is appended to FILE as one line ``row index asked granted released`` (times: the
system-wide CLOCK_MONOTONIC, in nanoseconds, comparable between the processes); a call that
failed writes ``row index error <exception>``. ``READY`` is printed once Django is set up and
the connections are open; the cycles start when the file ``--go`` exists, so that the
processes' start-up is no part of what the test measures. ``--one-by-one`` (the benchmark):
the rows run one after the other instead, each when the file ``PATH.<row>`` exists, so that
each is measured alone; ``ROW-DONE <row>`` is printed after each.

``--no-wakeups``: the negative control. The wake-up path of every primitive is cut in this
process: no waiter is woken by anything (``Waker.wake`` does nothing: neither a release in
this process, nor a NOTIFY, nor a hand-off's NOTIFY reaches it) and a waiter never looks at
its line sooner than ``LINE_POLL_MAX`` (the short looks with which waiters find their turn
where the database cannot push, MariaDB and SQLite). The test's check must then find every
row stalled.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

TTL = 60.0  # far above the test's deadline: no lease or place runs out during a run


def tell(line: str) -> None:
    """A line of the protocol with the test or the benchmark, on standard output."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()


def cut_wakeups() -> None:
    """The negative control (see the module's docstring)."""
    from resource_lease import doorbell
    from resource_lease.conf import lease_settings
    from resource_lease.line import steps, wakeups

    wakeups.Waker.wake = lambda self, *, turn=False, handed=None: None  # type: ignore[method-assign]

    # A barrier's members: no ring reaches them, they only look at their backoff's pace.
    @contextlib.contextmanager
    def deaf(self: doorbell.Doorbell) -> Iterator[Callable[[float], None]]:
        yield time.sleep

    doorbell.Doorbell.listening = deaf  # type: ignore[method-assign]
    steps._interval = lambda look, pushed: float(lease_settings.LINE_POLL_MAX)  # type: ignore[assignment]


def sync_rows(
    prefix: str, index: int, timeout: float, worker_poll: float
) -> dict[str, Callable[[], Callable[[], None]]]:
    """Each sync row: a function that takes the primitive and returns its release."""
    from resource_lease import (
        Dispenser,
        DoubleBarrier,
        Election,
        ResourceHolder,
        Worker,
        acquire,
        lock,
        rwlock,
        semaphore,
        synchronized,
    )

    def lease_of(take: Callable[[], Any]) -> Callable[[], Callable[[], None]]:
        def cycle() -> Callable[[], None]:
            lease = take()
            return lease.release  # type: ignore[no-any-return]

        return cycle

    class LiveHolder(ResourceHolder):
        kind = f"{prefix}holder"
        ttl = TTL

        def is_valid(self) -> bool:
            return True

    holder = LiveHolder(holder=f"live-holder-{index}")

    def holder_cycle() -> Callable[[], None]:
        holder.acquire(timeout=timeout)
        return lambda: (holder.close(), None)[1]

    election = Election(f"{prefix}election", ttl=TTL, holder=f"live-election-{index}")

    def election_cycle() -> Callable[[], None]:
        election.campaign(timeout=timeout)
        return lambda: (election.resign(), None)[1]

    held = threading.Event()
    let_go = threading.Event()

    @synchronized(f"{prefix}synchronized", ttl=TTL, timeout=timeout)
    def critical() -> None:
        held.set()
        let_go.wait()

    def synchronized_cycle() -> Callable[[], None]:
        held.clear()
        let_go.clear()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                critical()
            except BaseException as exc:  # noqa: BLE001 - reported by the row
                failed.append(exc)
                held.set()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        held.wait()
        if failed:
            raise failed[0]

        def release() -> None:
            let_go.set()
            thread.join()

        return release

    barrier = DoubleBarrier(f"{prefix}barrier", 3, ttl=TTL, member=f"member-{index}")

    def barrier_cycle() -> Callable[[], None]:
        barrier.enter(timeout=timeout)
        return lambda: barrier.leave(timeout=timeout)

    class LiveWorker(Worker):
        dispenser = f"{prefix}dispenser"
        batch = 1

        def do_work(self, key: str, payload: Any) -> bool:
            return True

    # Each contender's worker takes only the items the previous contender puts: each item
    # crosses processes. Its fallback look is ``--worker-poll`` (the test raises it).
    worker = LiveWorker(name=f"worker-{index}", pattern=f"w{index}-.*", ttl=TTL, poll=worker_poll)
    queue = Dispenser(f"{prefix}dispenser", ttl=TTL)
    put_count = [0]

    def worker_cycle() -> Callable[[], None]:
        if not put_count[0]:
            threading.Thread(target=worker.run, name="live-worker", daemon=True).start()
        put_count[0] += 1
        key = f"w{(index + 1) % 3}-{index}-{put_count[0]}"
        queue.put([key])
        while not queue.finished([key]):  # the test's look, not the worker's
            time.sleep(0.01)
        return lambda: None

    reader = index % 2 == 0  # the mixed rows: even contenders read, odd ones write
    rw = rwlock(f"{prefix}rwlock-mixed")
    return {
        "acquire": lease_of(lambda: acquire(f"{prefix}acquire", ttl=TTL, timeout=timeout)),
        "lock": lease_of(lambda: lock(f"{prefix}lock", ttl=TTL, timeout=timeout)),
        "semaphore": lease_of(lambda: semaphore(f"{prefix}semaphore", 2, ttl=TTL, timeout=timeout)),
        "rwlock-write": lease_of(lambda: rwlock(f"{prefix}rwlock-write").write(ttl=TTL, timeout=timeout)),
        "rwlock-mixed": lease_of(
            lambda: (rw.read if reader else rw.write)(ttl=TTL, timeout=timeout)  # type: ignore[operator]
        ),
        "holder": holder_cycle,
        "election": election_cycle,
        "synchronized": synchronized_cycle,
        "barrier": barrier_cycle,
        "worker": worker_cycle,
    }


def async_rows(
    prefix: str, index: int, timeout: float
) -> dict[str, Callable[[], Awaitable[Callable[[], Awaitable[Any]]]]]:
    """Each asyncio row: a coroutine function that takes the primitive and returns its release."""
    from resource_lease import Election, aacquire, alock, arwlock, asemaphore, synchronized

    def lease_of(take: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Callable[[], Awaitable[Any]]]]:
        async def cycle() -> Callable[[], Awaitable[Any]]:
            lease = await take()
            return lease.arelease  # type: ignore[no-any-return]

        return cycle

    election = Election(f"{prefix}aelection", ttl=TTL, holder=f"live-aelection-{index}")

    async def election_cycle() -> Callable[[], Awaitable[Any]]:
        await election.acampaign(timeout=timeout)

        async def resign() -> None:
            await asyncio.to_thread(election.resign)

        return resign

    async def synchronized_cycle() -> Callable[[], Awaitable[Any]]:
        held = asyncio.Event()
        let_go = asyncio.Event()

        @synchronized(f"{prefix}asynchronized", ttl=TTL, timeout=timeout)
        async def critical() -> None:
            held.set()
            await let_go.wait()

        task = asyncio.ensure_future(critical())
        waiter = asyncio.ensure_future(held.wait())
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            waiter.cancel()
            task.result()  # raises what it raised

        async def release() -> None:
            let_go.set()
            await task

        return release

    reader = index % 2 == 0
    return {
        "aacquire": lease_of(lambda: aacquire(f"{prefix}aacquire", ttl=TTL, timeout=timeout)),
        "alock": lease_of(lambda: alock(f"{prefix}alock", ttl=TTL, timeout=timeout)),
        "asemaphore": lease_of(lambda: asemaphore(f"{prefix}asemaphore", 2, ttl=TTL, timeout=timeout)),
        "arwlock-write": lease_of(lambda: arwlock(f"{prefix}arwlock-write").write(ttl=TTL, timeout=timeout)),
        "arwlock-mixed": lease_of(
            lambda: (arwlock(f"{prefix}arwlock-mixed").read if reader else arwlock(f"{prefix}arwlock-mixed").write)(
                ttl=TTL, timeout=timeout
            )
        ),
        "aelection": election_cycle,
        "asynchronized": synchronized_cycle,
    }


class Log:
    def __init__(self, path: Path) -> None:
        self._file = path.open("a", buffering=1)
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()


def run_sync(row: str, cycle: Callable[[], Callable[[], None]], args: argparse.Namespace, log: Log) -> None:
    from django.db import connections

    try:
        for _ in range(args.cycles):
            asked = time.monotonic_ns()
            try:
                release = cycle()
            except Exception as exc:  # noqa: BLE001 - the test reads it
                log.write(f"{row} {args.index} error {type(exc).__name__}: {str(exc)[:300]!r}")
                return
            granted = time.monotonic_ns()
            time.sleep(args.hold)
            released = time.monotonic_ns()
            release()
            log.write(f"{row} {args.index} {asked} {granted} {released}")
    finally:
        connections.close_all()


async def run_async(
    row: str, cycle: Callable[[], Awaitable[Callable[[], Awaitable[Any]]]], args: argparse.Namespace, log: Log
) -> None:
    for _ in range(args.cycles):
        asked = time.monotonic_ns()
        try:
            release = await cycle()
        except Exception as exc:  # noqa: BLE001 - the test reads it
            log.write(f"{row} {args.index} error {type(exc).__name__}: {str(exc)[:300]!r}")
            return
        granted = time.monotonic_ns()
        await asyncio.sleep(args.hold)
        released = time.monotonic_ns()
        await release()
        log.write(f"{row} {args.index} {asked} {granted} {released}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--rows", required=True)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--hold", type=float, default=0.02)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--prefix", default="live-")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--go", type=Path, required=True)
    parser.add_argument("--worker-poll", type=float, default=1.0)
    parser.add_argument("--one-by-one", action="store_true")
    parser.add_argument("--no-wakeups", action="store_true")
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's view of a stall
    setup()
    if args.no_wakeups:
        cut_wakeups()
    from django.db import connection

    connection.ensure_connection()
    wanted = args.rows.split(",")
    sync = sync_rows(args.prefix, args.index, args.timeout, args.worker_poll)
    asynchronous = async_rows(args.prefix, args.index, args.timeout)
    unknown = [row for row in wanted if row not in sync and row not in asynchronous]
    if unknown:
        sys.stderr.write(f"unknown rows: {unknown}\n")
        return 2
    log = Log(args.out)
    tell("READY")
    if args.one_by_one:
        for row in wanted:
            go = args.go.with_name(f"{args.go.name}.{row}")
            while not go.exists():
                time.sleep(0.005)
            if row in sync:
                run_sync(row, sync[row], args, log)
            else:
                asyncio.run(run_async(row, asynchronous[row], args, log))
            tell(f"ROW-DONE {row}")
        os._exit(0)
    while not args.go.exists():
        time.sleep(0.01)
    threads = [
        threading.Thread(target=run_sync, args=(row, sync[row], args, log), name=row, daemon=True)
        for row in wanted
        if row in sync
    ]
    coroutines = [run_async(row, asynchronous[row], args, log) for row in wanted if row in asynchronous]

    async def all_async() -> None:
        await asyncio.gather(*coroutines)

    for thread in threads:
        thread.start()
    if coroutines:
        asyncio.run(all_async())
    for thread in threads:
        thread.join()
    tell("DONE")
    sys.stdout.flush()
    os._exit(0)  # the test kills what stalls; a finished contender needs no orderly exit


if __name__ == "__main__":
    sys.exit(main())
