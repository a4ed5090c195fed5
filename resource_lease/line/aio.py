"""The asyncio driver of the line: the same waits for Django's async views and consumers, never
blocking the loop.

Every entry point's async twin (``aacquire`` beside ``acquire`` in ``lease.py``, ``alock``
and ``asemaphore`` beside ``lock`` and ``semaphore``, ``arwlock`` beside ``rwlock``) builds the
same checked ``Wait`` as its sync twin and awaits it here (``Acquiring``): a coroutine
(``await`` it, or hand it to ``asyncio.create_task``) and an async context manager::

    lease = await aacquire("proxy", ttl=30, timeout=5)
    async with alock("rebuild", ttl=60, timeout=5) as lease:
        ...

How it works, following Django's own way of running database work from async code
(asgiref's ``sync_to_async``): every statement runs in a worker thread
(``thread_sensitive=False``: the engine's connections are its own, one per thread, and a grant
must not queue behind the view's ORM work on the one thread-sensitive thread), and only the
waiting happens on the event loop. A waiter takes the same decisions as a thread waiting in
line (``line.Waiting.steps``): its place in the database, its turn in each grant statement;
its pauses are ``asyncio`` waits woken by the same wake-ups (a release in this process, the
release's NOTIFY on PostgreSQL, its looks elsewhere). A cancelled waiter leaves the line at
once; a grant that came back while it was being cancelled is given back.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Generator
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from resource_lease import metrics
from resource_lease.exceptions import DatabaseUnavailable, LeaseError
from resource_lease.line.granting import grantor
from resource_lease.line.steps import Attempt, Call, ClaimHanded, Pause, Waiting
from resource_lease.line.threads import First, Grant, Wait, arrive, in_time, left
from resource_lease.line.wakeups import Handed, Waker
from resource_lease.offload import in_thread

logger = logging.getLogger("resource_lease")

T = TypeVar("T")
P = ParamSpec("P")


class AsyncWaker(Waker):
    """A ``Waker`` whose waiter is a coroutine: a wake-up from any thread sets an
    ``asyncio.Event`` on the waiter's loop."""

    def __init__(self) -> None:
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def wake(self, *, turn: bool = False, handed: Handed | None = None) -> None:
        super().wake(turn=turn, handed=handed)
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass

    async def await_wake(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for a wake-up; the wake-ups since the last wait."""
        self._event.clear()
        woken = self.wait(0)
        if woken or timeout <= 0:
            return woken
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            pass
        return self.wait(0)


async def _granting(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a thread, a grant possibly among what it returns; if the caller is
    cancelled meanwhile, the call is let finish, and the grant that comes back anyway is given
    back before the cancellation goes on (a lease nobody holds would otherwise block others
    for its ttl)."""
    task = asyncio.ensure_future(in_thread(fn, *args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        try:
            late = await asyncio.shield(task)
        except Exception:  # noqa: BLE001 - the attempt failed: nothing to give back
            late = None
        if isinstance(late, Grant):
            try:
                await asyncio.shield(in_thread(late.release))
            except LeaseError as exc:  # it expires by itself
                logger.warning("giving back %r after a cancellation failed: %s", late, exc)
        raise


async def arun(wait: Wait[T]) -> T:
    """Wait in line without blocking the event loop (see the module's docstring); the answer
    of ``wait.conclude``, as ``wait.run()`` gives it in a thread (a grant past its deadline
    once the line is left is given back and the wait goes on: ``line.in_time``).

    A caller pays for the line only when there is one, as in a thread: its first attempt
    (``threads.arrive``), and the conclusion of the grant it made (or of a one-attempt call),
    take one worker-thread hop; the ``AsyncWaker`` and the steps are built only once it has
    granted nothing."""
    deadline = None if wait.timeout is None else time.monotonic() + wait.timeout
    with metrics.waiting(wait.line.kind, using=wait.line.alias, holder=wait.holder) as measured:
        first = await _granting(_at_once, wait, measured)
        if not isinstance(first, First):
            return first  # type: ignore[no-any-return]
        waker = AsyncWaker()
        arrived = first is First.REFUSED
        while (timeout := left(deadline)) is None or timeout > 0.0:
            grant = await _await_once(wait, waker, timeout, measured, arrived=arrived)
            arrived = False
            if grant is None:
                break
            answer = await _granting(_finish_in_time, wait, grant, measured)
            if answer is not None:
                return answer  # type: ignore[no-any-return]
        return await _granting(wait.finish, None, measured)  # type: ignore[no-any-return]


def _at_once(wait: Wait[T], measured: metrics.WaitMeasure) -> T | First:
    """In a worker thread: the wait's first attempt; its answer at once if it granted, or if
    it was the only one (``timeout=0``: the refusal raises), else how it ended."""
    first = arrive(wait)
    if not isinstance(first, First):
        return wait.finish(first, measured)
    return wait.finish(None, measured) if wait.timeout == 0 else first


def _finish_in_time(wait: Wait[T], grant: T, measured: metrics.WaitMeasure) -> T | None:
    """In a worker thread: the answer for ``grant`` if it came in time (``in_time``), else
    None (it was given back: the wait goes on)."""
    grant_in_time = in_time(grant)
    return None if grant_in_time is None else wait.finish(grant_in_time, measured)


async def _await_once(
    wait: Wait[T], waker: AsyncWaker, timeout: float | None, measured: metrics.WaitMeasure, *, arrived: bool
) -> T | None:
    measured.queued()  # its first attempt granted nothing, or was not made: the caller waits
    waiting = Waiting(wait, timeout=timeout, waker=waker, arrived=arrived)
    steps = waiting.steps()
    try:
        try:
            step = next(steps)
            while True:
                try:
                    if isinstance(step, Attempt):
                        value = await _granting(wait.attempt, grantor(wait.line, step.turn, wait.make))
                    elif isinstance(step, ClaimHanded):
                        value = await _granting(waiting.claim, step)
                    elif isinstance(step, Call):
                        # Cancelled meanwhile, the call still ends before the cleanup below
                        # (a place it took is then ours to leave).
                        value = await _granting(step.run)
                    else:
                        value = await waker.await_wake(step.seconds)
                except DatabaseUnavailable as exc:
                    pause = waiting.unavailable(exc)  # as a thread's wait (line._wait_once)
                    if pause is None:
                        raise
                    await waker.await_wake(pause)
                    continue
                if not isinstance(step, Pause):
                    waiting.answered()
                step = steps.send(value)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            measured.outcome = "timeout"  # given up, not an error
            raise
    finally:
        steps.close()
        # Leave the line at once, even when cancelled (shielded: the place must go).
        await asyncio.shield(in_thread(waiting.cleanup))


class Acquiring(Coroutine[Any, Any, T]):
    """A grant being asked for: ``await`` it for the lease, ``async with`` it to release the
    lease on the way out, or hand it to ``asyncio.create_task`` / ``ensure_future`` (it is a
    coroutine). The arguments are checked in a worker thread, like every statement (a
    semaphore creates its slot rows there)."""

    def __init__(self, build: Callable[[], Wait[T]]) -> None:
        self._build = build
        self._lease: T | None = None
        self._coroutine: Coroutine[Any, Any, T] | None = None

    async def _get(self) -> T:
        wait = await in_thread(self._build)
        return await arun(wait)

    def _started(self) -> Coroutine[Any, Any, T]:
        # One coroutine for every way of running it as one (await, a task), made on first use,
        # so an Acquiring only entered with ``async with`` leaves no coroutine never awaited.
        if self._coroutine is None:
            self._coroutine = self._get()
        return self._coroutine

    def __await__(self) -> Generator[Any, None, T]:
        return self._started().__await__()

    def send(self, value: Any) -> Any:
        return self._started().send(value)

    def throw(self, *args: Any) -> Any:
        return self._started().throw(*args)

    def close(self) -> None:
        if self._coroutine is not None:
            self._coroutine.close()

    async def __aenter__(self) -> T:
        self._lease = await self._get()
        return self._lease

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        lease, self._lease = self._lease, None
        if isinstance(lease, Grant):
            await lease.__aexit__(exc_type, exc, tb)


def awaits(build: Callable[P, Wait[T]], name: str) -> Callable[P, Acquiring[T]]:
    """The async twin ``name`` of an entry point, from the one function that checks its
    arguments and builds its wait (``aacquire = awaits(acquiring, "aacquire")``): the same
    signature, awaited (its arguments are checked in a worker thread, like every statement)."""

    @functools.wraps(build)
    def twin(*args: P.args, **kwargs: P.kwargs) -> Acquiring[T]:
        return Acquiring(functools.partial(build, *args, **kwargs))

    twin.__name__ = twin.__qualname__ = name
    return twin


__all__ = ["Acquiring", "AsyncWaker", "arun", "awaits"]
