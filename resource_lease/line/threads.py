"""The thread driver of a wait in line (``wait_in_line``), and ``Wait``: a checked call that
waits in a line, run in a thread (``Wait.run``) or awaited (``line.aio.arun``)."""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, runtime_checkable

from resource_lease import metrics
from resource_lease.db.line import ARRIVING
from resource_lease.exceptions import DatabaseUnavailable
from resource_lease.line.counters import stats
from resource_lease.line.granting import Grantor, Make, grantor, newcomer
from resource_lease.line.places import Line, marked_now
from resource_lease.line.steps import Attempt, Call, ClaimHanded, Pause, Waiting
from resource_lease.line.wakeups import Waker

T = TypeVar("T")
P = ParamSpec("P")


@runtime_checkable
class Grant(Protocol):
    """What a wait in line grants (a ``Lease``, an rwlock's ``ReadLease``): given back if it
    came too late (``in_time``) or to a caller cancelled meanwhile (``line.aio``)."""

    def given_back_late(self, *, after: str) -> bool: ...

    def release(self) -> bool: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


def wait_in_line(wait: Wait[T], waker: Waker | None = None, *, queued: Callable[[], None] | None = None) -> T | None:
    """Call ``wait.attempt(grant)`` until it grants (returns something other than None) or
    ``wait.timeout`` seconds (None: for ever; 0: one attempt as a newcomer) have passed; then
    None (``conclude`` is the caller's: ``Wait.run``).

    ``grant`` grants the attempt's asks as the caller's turn in its line (a newcomer first,
    then its place: ``granting.grantor``). ``waker``: pass one to be able to interrupt the wait
    (``waker.wake()``; the next ``attempt`` then raises). A release may hand the caller's place
    its row where the database can; the line takes that grant (``line.handoff``) and
    ``wait.handed`` makes the caller's grant of the row. Exceptions propagate at once, and the
    place is left on the way out.

    A grant that is past its local deadline once the place has been left (a hung node held
    that statement up) is given back, and the wait goes on while its timeout lasts
    (``in_time``).

    A caller pays for the line only when there is one: its first attempt (``arrive``) runs
    without the ``Waker``, the steps and their driver; only when it grants nothing (or could
    not connect: the driver asks again while the timeout lasts) does the caller take a place,
    and ``queued`` (the wait's measure: ``metrics.WaitMeasure.queued``) is told so.
    """
    timeout = wait.timeout
    deadline = None if timeout is None else time.monotonic() + timeout
    first = arrive(wait)
    if not isinstance(first, First):
        return first
    if timeout == 0:
        return None
    arrived = first is First.REFUSED
    while True:
        timeout = left(deadline)
        if timeout is not None and timeout <= 0.0:
            return None
        if queued is not None:
            queued()
        grant = _wait_once(wait, timeout=timeout, waker=waker, arrived=arrived)
        arrived = False
        if grant is None or in_time(grant) is not None:
            return grant


class First(enum.Enum):
    """How a wait's first attempt (``arrive``) ended when it gave its caller nothing."""

    #: It granted nothing: the line's steps start at taking a place (``Waiting(arrived=True)``).
    REFUSED = "refused"
    #: It was not made (every row of the line was marked by this process's own waiters a
    #: moment ago: it would be refused), it could not connect (nothing was sent), or its grant
    #: came too late and was given back: the line's steps start from their first attempt.
    SKIPPED = "skipped"


def arrive(wait: Wait[T]) -> T | First:
    """The first attempt of ``wait``, as its caller arrives (a newcomer for ``timeout=0``:
    a statement that could not connect then raises at once), without the line's machinery;
    its grant if it came in time (``in_time``), else how it ended. Both drivers (this
    module's, ``line.aio``) make it before they build anything else."""
    if wait.timeout == 0:
        grant = wait.attempt(newcomer(wait.line.alias, wait.make))
    elif marked_now(wait.line):
        return First.SKIPPED
    else:
        try:
            grant = wait.attempt(grantor(wait.line, ARRIVING, wait.make))
        except DatabaseUnavailable:
            return First.SKIPPED  # nothing was sent: the driver asks again, with its pauses
    if grant is None:
        return First.REFUSED
    stats.at_once += 1
    return First.SKIPPED if in_time(grant) is None else grant


def in_time(grant: T) -> T | None:
    """``grant`` if it may still go to its caller once its wait has ended, else None: one
    past its local deadline by then is given back (``Lease.given_back_late``)."""
    late = grant.given_back_late(after="the grant, with leaving the line after it,")  # type: ignore[attr-defined]
    return None if late else grant


def left(deadline: float | None) -> float | None:
    """Seconds to ``deadline`` (None: no deadline)."""
    return None if deadline is None else deadline - time.monotonic()


def _wait_once(wait: Wait[T], *, timeout: float | None, waker: Waker | None, arrived: bool) -> T | None:
    waiting = Waiting(wait, timeout=timeout, waker=Waker() if waker is None else waker, arrived=arrived)
    steps = waiting.steps()
    try:
        step = next(steps)
        while True:
            try:
                if isinstance(step, Attempt):
                    value: Any = wait.attempt(grantor(wait.line, step.turn, wait.make))
                elif isinstance(step, ClaimHanded):
                    value = waiting.claim(step)
                elif isinstance(step, Call):
                    value = step.run()
                else:
                    value = waiting.waker.wait(step.seconds)
            except DatabaseUnavailable as exc:
                pause = waiting.unavailable(exc)
                if pause is None:
                    raise
                waiting.waker.wait(pause)
                continue  # the same step again: it never reached the database
            if not isinstance(step, Pause):
                waiting.answered()
            step = steps.send(value)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        steps.close()
        waiting.cleanup()


def runs(build: Callable[P, Wait[T]], name: str) -> Callable[P, T]:
    """The entry point ``name``, from the one function that checks its arguments and builds
    its wait (``acquire = runs(acquiring, "acquire")``): the same signature and docstring,
    run in this thread."""

    def entry(*args: P.args, **kwargs: P.kwargs) -> T:
        return build(*args, **kwargs).run()

    # Tracebacks, and the error for a call made on an event loop (which names the outermost
    # frame of this library), say ``acquire``, not ``runs.<locals>.entry``.
    entry.__code__ = entry.__code__.replace(co_name=name, co_qualname=name)
    functools.update_wrapper(entry, build)
    entry.__name__ = entry.__qualname__ = name
    return entry


@dataclass(frozen=True)
class Wait(Generic[T]):
    """A checked call that waits in a line for a grant: ``acquire()``, ``lock()``,
    ``semaphore()`` build one (``lease.acquiring``, ``recipes.locks.locking``, ...) and ``run()``
    it; ``resource_lease.aio`` awaits the same one without blocking the event loop.

    ``attempt(grant)`` is one attempt: it grants its asks (``db.line.Ask``) with ``grant``,
    which the line gives it (a ``granting.Grantor``: as the caller's turn), and its grant is
    made by ``make``; ``conclude(grant)``
    turns the outcome of the wait (a grant, or None when the timeout ran out) into the
    answer: announce and renew a grant, or raise the refusal (it may read the database, and
    try once more if what it would name was let go meanwhile)."""

    line: Line
    attempt: Callable[[Grantor[T]], T | None]
    conclude: Callable[[T | None], T]
    timeout: float | None
    holder: str
    ttl: float
    #: How the caller makes its grant of a granted row (``lease.making``).
    make: Make[T]
    priority: int = 0
    where: str | None = None
    #: What the grant is for (``acquire(target=...)``): rows cooling down for it do not serve
    #: it. '' for none.
    target: str = ""
    #: Seconds: a waiter first in its line tries its grant at least this often, whatever its
    #: looks say (0: only when they say a row is free, or it is told). A session's wait for its
    #: bound resource: a try finds out whether that resource can still serve it.
    retry_every: float = 0.0
    #: A reader of an rwlock (``wait_in_line``'s ``shared``).
    shared: bool = False
    #: How the caller makes its grant of a row a release handed to its place in its own
    #: statement, where the database can (PostgreSQL): the line takes the grant
    #: (``line.handoff``), and nobody else sees it. None: the place takes no hand-off (a grant
    #: with a lock delay, which the hand-off does not write; a reader of an rwlock).
    handed: Make[T] | None = None

    def run(self, waker: Waker | None = None) -> T:
        """Wait in this thread; the answer of ``conclude``. The wait is measured
        (``metrics.waiting``: its time and outcome, and the grant's ``waited``)."""
        with metrics.waiting(self.line.kind, using=self.line.alias, holder=self.holder) as measured:
            return self.finish(wait_in_line(self, waker, queued=measured.queued), measured)

    def finish(self, grant: T | None, measured: metrics.WaitMeasure) -> T:
        """``conclude`` the wait, the grant's time recorded before it is announced."""
        if grant is not None:
            measured.granted(grant)  # type: ignore[arg-type]
        answer = self.conclude(grant)
        if answer is not grant:
            measured.granted(answer)  # type: ignore[arg-type]  # a late attempt's grant
        return answer
