"""The process's keeper: one thread that runs every periodic job of the library.

The role of tooz's ``Heart``, kazoo's session and procrastinate's side-task monitor: a recipe
says *what* to keep (a lease, a work item's claim, a row to take again after loss, a watch
to poll) and the keeper keeps it. One daemon thread, one timer heap, one database connection
per alias serve the renewals of every ``auto_renew`` lease, lock, election, group membership,
barrier place and place in line, a worker's claims, the "take the row again" of elections
and groups, and every polling watch of the process.

A job is any object with a step method (``keep()`` by default; ``renew_in_background()``
for a renewable) that runs once and returns the seconds until its next run, or None to
stop. Jobs are held weakly (a lease nobody refers to any more stops being renewed and
lapses), except those scheduled with ``hold=True``: a watch, a kept election or group
membership runs until it is stopped, as a thread would, whether or not its handle is kept
(``held()`` lists them: a watch leaked by a long-running process shows there, and its start
is logged). A step that takes
long holds up every other job, so the keeper says so loudly: a step that took longer than
the interval it asked for, or longer than ``OVERRUN`` seconds, is logged as a warning
naming the job and how long it took (as tooz's Heart does when a beat overruns). A step
that raises is a bug: logged with its traceback, and the job is dropped.

Users' callbacks (``on_lost``, ``on_elected`` / ``on_revoked``, watch callbacks) never run
on the keeper's thread, where a slow one would stall every renewal of the process: the
keeper hands them to ``Callbacks``, at most ``CALLBACK_THREADS`` threads. Each owner (a
watch, an election, a group, a lease) is served by one of them, so its callbacks run in
order, one at a time, on one thread; a callback that blocks holds up only the owners that
share its thread, never a renewal.

The keeper's thread and the callback threads start on demand and end a second after they
have nothing left to do, closing their connections. A step runs inside the fork gate (a fork
waits for it to end; a callback's lease statements are inside it too, the user's own code
is not), and a forked child starts with a keeper of its own that keeps nothing of its
parent's (docs/pitfalls.md#fork).
"""

from __future__ import annotations

import atexit
import functools
import heapq
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from resource_lease.db.connections import close_connections
from resource_lease.exceptions import LeaseError
from resource_lease.forking import PerProcess, fork_gate

logger = logging.getLogger("resource_lease")

#: Seconds a keeper or callback thread waits with nothing to do before it exits.
IDLE_EXIT = 1.0
#: A step that holds the keeper longer than this is warned about, whatever its interval.
OVERRUN = 1.0
#: The most threads that run users' callbacks at once.
CALLBACK_THREADS = 4
#: Seconds a process that exits normally waits for the callbacks already queued (an
#: ``on_lost`` the keeper dispatched a moment before the main thread returned) to run.
EXIT_DRAIN = 5.0

#: Seconds between two looks of a process stopping at the threads still taking something.
SETTLE_POLL = 0.002

_RUNNING = -1  # the entry of a job whose step runs now


def start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """Start one of the library's daemon threads (the keeper's, a callback thread's)."""
    thread = threading.Thread(target=target, name=name[:60], daemon=True)
    thread.start()
    return thread


class Keeper:
    """The process's scheduler of periodic work (see the module's docstring)."""

    def __init__(self) -> None:
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        # Its own condition on the same lock: who waits for a step to end (``finish``) must
        # never take a notify() meant for the keeper's thread.
        self._step_ended = threading.Condition(lock)
        self._running: Any = None  # the job whose step runs now
        self._heap: list[tuple[float, int, weakref.ref[Any]]] = []
        self._seq = itertools.count()
        # Each scheduled job: (its step method's name, the seq of its live heap entry, or
        # _RUNNING while its step runs). Stale heap entries (a job cancelled, woken or
        # collected) are dropped when they come up.
        self._jobs: weakref.WeakKeyDictionary[Any, tuple[str, int]] = weakref.WeakKeyDictionary()
        self._woken: weakref.WeakSet[Any] = weakref.WeakSet()  # woken while its step ran
        # The jobs that run until they are cancelled or stop, referred to or not (``hold``).
        self._held: dict[int, Any] = {}
        self._thread: threading.Thread | None = None
        # Until when (monotonic) the keeper's thread sleeps in its condition wait, while it
        # does; None while it runs (it looks at the heap, under the lock, before it waits
        # again). A new job wakes it only if due before then, and a cancel only if it would
        # otherwise sleep on past its idle exit: a lone lease's grant and release then cost
        # no thread switch (issue 39: two wake-ups of this thread per uncontended cycle).
        self._sleeping_until: float | None = None
        self.callbacks = Callbacks()
        #: Set once the process gives back everything it holds (``resource_lease.shutdown``):
        #: from then on it is refused new grants and new places in line.
        self.stopping = threading.Event()
        # The threads taking a grant or a place in line now (``taking``), by ident: the depth
        # of their nesting. A dict, not a lock: one set and one delete on every grant.
        self._taking: dict[int, int] = {}

    # -- jobs ---------------------------------------------------------------------------

    def schedule(self, job: Any, delay: float, *, step: str = "keep", hold: bool = False) -> None:
        """Run ``job.<step>()`` in ``delay`` seconds, then as often as it asks (until it
        returns None, ``cancel(job)``, or the job is garbage-collected). ``hold``: the keeper
        keeps the job alive itself until then, whoever else refers to it."""
        with self._cond:
            if hold:
                self._held[id(job)] = job
            current = self._jobs.get(job)
            if current is not None and current[1] == _RUNNING:
                self._jobs[job] = (step, _RUNNING)  # rescheduled when its step returns
                return
            self._push(job, step, time.monotonic() + max(0.0, delay))

    def cancel(self, job: Any) -> None:
        """Stop running ``job`` (no-op if it is not scheduled); a step running now finishes."""
        with self._cond:
            self._held.pop(id(job), None)
            if self._jobs.pop(job, None) is not None and not self._jobs:
                # Its heap entry is dropped when it comes up. With nothing left to keep, the
                # keeper's thread is woken only if it would otherwise sleep on past its idle
                # exit (for the due time of a job that is gone): so it exits about a second
                # from now and closes its connection, and a lone lease released within a
                # second of its grant costs no thread switch.
                until = self._sleeping_until
                if until is not None and until > time.monotonic() + IDLE_EXIT:
                    self._cond.notify()

    def finish(self, job: Any, timeout: float | None = None) -> bool:
        """Wait until no step of ``job`` runs (after ``cancel``: the one running now has
        ended, so it sends no more statements); at once on the keeper's thread. Whether it
        has ended within ``timeout`` seconds."""
        if self.on_keeper_thread():
            return True
        with self._step_ended:
            return self._step_ended.wait_for(lambda: self._running is not job, timeout)

    def wake(self, job: Any) -> None:
        """Run ``job``'s next step now (a notification arrived; a callback finished)."""
        with self._cond:
            current = self._jobs.get(job)
            if current is None:
                return
            if current[1] == _RUNNING:
                self._woken.add(job)
            else:
                self._push(job, current[0], time.monotonic())

    def held(self) -> list[Any]:
        """The jobs kept until they are stopped (``schedule(..., hold=True)``): the process's
        running watches, kept elections and group memberships."""
        with self._cond:
            return list(self._held.values())

    def scheduled(self, job: Any) -> bool:
        """Whether ``job`` is kept now."""
        with self._cond:
            return job in self._jobs

    def refuse_when_stopping(self, what: str) -> None:
        """Raise ``LeaseError`` if the process is giving back what it holds (``stopping``)."""
        if self.stopping.is_set():
            raise LeaseError(f"this process is shutting down (it gave back what it held): no new {what}")

    def taking(self, what: str) -> Taking:
        """A context manager around taking ``what`` (a grant, a place in line): from its
        statement until what it took is registered as held (``_track``, the keeper's jobs).
        Refused (``LeaseError``) once the process is stopping; a process that starts stopping
        meanwhile waits for it to end (``settle``), so it never gives back what it holds
        while a thread has taken something it has not yet registered."""
        return Taking(self, what)

    def settle(self, timeout: float, *, besides: Iterable[int] = ()) -> bool:
        """Wait up to ``timeout`` seconds until no thread but the calling one (and those in
        ``besides``: the main thread a signal handler interrupted, which cannot go on until
        the handler returns) is inside ``taking``; whether that happened (if not, it is
        logged: what those threads take stays held until its ttl)."""
        skip = {threading.get_ident(), *besides}
        deadline = time.monotonic() + timeout
        while others := [ident for ident in list(self._taking) if ident not in skip]:
            if time.monotonic() >= deadline:
                logger.warning(
                    "shutting down: %d thread(s) still taking a grant or a place in line after %gs; "
                    "what they take stays held until its ttl",
                    len(others),
                    timeout,
                )
                return False
            time.sleep(SETTLE_POLL)
        return True

    def jobs(self) -> list[Any]:
        """The jobs kept now (what a process shutting down gives back: ``shutdown``)."""
        with self._cond:
            return list(self._jobs.keys())

    @property
    def thread(self) -> threading.Thread | None:
        """The keeper's thread while it runs; None when it has exited (nothing to keep)."""
        return self._thread

    def on_keeper_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def _push(self, job: Any, step: str, due: float) -> None:
        seq = next(self._seq)
        self._jobs[job] = (step, seq)
        heapq.heappush(self._heap, (due, seq, weakref.ref(job)))
        if self._thread is None:
            self._thread = start_thread(self._run, "resource-lease-keeper")
        elif self._sleeping_until is not None and due < self._sleeping_until:
            # Due before the keeper's thread wakes up. Else it need not wake (each place in
            # line and renewed lease would cost two thread switches): it finds the job when
            # it next looks at the heap, before it is due.
            self._cond.notify()

    # -- the thread ---------------------------------------------------------------------

    def _next_due(self) -> tuple[Any, str] | None:
        """Wait for the next job that is due; None when there is nothing left to keep."""
        idle_since: float | None = None
        with self._cond:
            while True:
                while self._heap:
                    due, seq, ref = self._heap[0]
                    job = ref()
                    entry = self._jobs.get(job) if job is not None else None
                    if entry is not None and entry[1] == seq:
                        break
                    heapq.heappop(self._heap)  # cancelled, woken (a newer entry) or collected
                else:
                    # Linger briefly before exiting: back-to-back leases (a Celery worker's
                    # tasks) then reuse the thread and its connection.
                    if idle_since is None:
                        idle_since = time.monotonic()
                    idle_left = IDLE_EXIT - (time.monotonic() - idle_since)
                    if idle_left > 0:
                        self._sleep(idle_left)
                        continue
                    self._thread = None
                    return None
                idle_since = None
                delay = due - time.monotonic()
                if delay <= 0:
                    heapq.heappop(self._heap)
                    step = entry[0]
                    self._jobs[job] = (step, _RUNNING)
                    self._woken.discard(job)
                    self._running = job
                    return job, step
                del job
                self._sleep(delay)

    def _sleep(self, seconds: float) -> None:
        """Wait (the lock held, ``_cond``) up to ``seconds`` for a notify; ``_push`` and
        ``cancel`` read until when."""
        self._sleeping_until = time.monotonic() + seconds
        try:
            self._cond.wait(seconds)
        finally:
            self._sleeping_until = None

    def _run(self) -> None:
        try:
            while (due := self._next_due()) is not None:
                job, step = due
                self._run_step(job, step)
                del job, due
        except BaseException:
            logger.exception("the resource_lease keeper thread failed")
            with self._cond:
                self._thread = None
            raise
        finally:
            close_connections()

    def _run_step(self, job: Any, step: str) -> None:
        started = time.monotonic()
        try:
            # Inside the fork gate: a fork waits for the step to end, so a child never
            # inherits a lock or a database call of the step half done (docs/pitfalls.md#fork).
            with fork_gate.inside():
                next_in = getattr(job, step)()
        except Exception:  # a bug must be loud, never a job that quietly stops
            logger.exception("keeper: %r.%s() failed; it is no longer kept", job, step)
            next_in = None
        took = time.monotonic() - started
        if took > OVERRUN or (next_in is not None and took > next_in > 0):
            asked = "" if next_in is None else f" (it asked to run again in {next_in:.3f}s)"
            logger.warning(
                "keeper: %r.%s() took %.3fs%s; the process's other periodic work waited for it",
                job,
                step,
                took,
                asked,
            )
        with self._cond:
            self._running = None
            self._step_ended.notify_all()
            entry = self._jobs.get(job)
            if entry is None or entry[1] != _RUNNING:
                return  # cancelled meanwhile, or scheduled anew by schedule()
            if next_in is None:
                del self._jobs[job]
                self._held.pop(id(job), None)
                return
            if job in self._woken:
                next_in = 0.0
            self._push(job, entry[0], time.monotonic() + next_in)


class _Lane:
    """One callback thread and its queue."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.queue: deque[tuple[Any, Callable[..., Any], tuple[Any, ...]]] = deque()
        self.thread: threading.Thread | None = None
        self.running: Any = None  # the owner whose callback runs now
        self.owners = 0  # owners pinned to this lane


class Callbacks:
    """At most ``CALLBACK_THREADS`` threads that run users' callbacks off the keeper.

    An owner that calls back often (a watch, a started election, a joined group) is
    ``pin``ned to one thread for its life, so its callbacks run on one thread, in order,
    never two at once; a one-off owner (a lease's ``on_lost``) goes to the least busy one.
    """

    def __init__(self, limit: int = CALLBACK_THREADS) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._lanes = [_Lane(i) for i in range(limit)]
        self._pinned: weakref.WeakKeyDictionary[Any, _Lane] = weakref.WeakKeyDictionary()
        self._one_offs = 0  # callbacks of unpinned owners (a lease's on_lost) not yet run

    def pin(self, owner: Any) -> None:
        """Serve every callback of ``owner`` on one thread until ``unpin``."""
        with self._cond:
            if owner not in self._pinned:
                lane = min(self._lanes, key=lambda lane: (lane.owners, len(lane.queue), lane.index))
                lane.owners += 1
                self._pinned[owner] = lane

    def unpin(self, owner: Any) -> None:
        """Drop ``owner``'s queued callbacks and wait for one that runs now (unless called
        from it): no callback of ``owner`` starts after this returns."""
        with self._cond:
            lane = self._pinned.pop(owner, None)
            if lane is None:
                return
            lane.owners -= 1
            lane.queue = deque(item for item in lane.queue if item[0] is not owner)
            while lane.running is owner and threading.current_thread() is not lane.thread:
                self._cond.wait()
            self._cond.notify_all()

    def call(self, owner: Any, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on ``owner``'s callback thread; an exception is logged."""
        with self._cond:
            lane = self._pinned.get(owner)
            if lane is None:
                lane = min(self._lanes, key=lambda lane: (lane.running is not None, len(lane.queue), lane.index))
                self._one_offs += 1
                fn = functools.partial(self._one_off, fn)
            lane.queue.append((owner, fn, args))
            if lane.thread is None:
                lane.thread = start_thread(lambda: self._serve(lane), f"resource-lease-callbacks-{lane.index}")
            self._cond.notify_all()

    def _one_off(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        finally:
            with self._cond:
                self._one_offs -= 1
                self._cond.notify_all()

    @contextmanager
    def expecting(self) -> Iterator[None]:
        """Count, for ``drain``, as a one-off callback about to be queued (a loss between
        setting ``lost_event``, which may let the main thread return at once, and queueing
        its ``on_lost``)."""
        with self._cond:
            self._one_offs += 1
        try:
            yield
        finally:
            with self._cond:
                self._one_offs -= 1
                self._cond.notify_all()

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until the one-off callbacks (those of owners not
        pinned: a lease's ``on_lost``) queued so far have run; whether they have. The
        callbacks run on daemon threads, which an exiting interpreter stops wherever they
        are; a pinned owner's (a watch's, an election's) may run as long as it lives."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._one_offs:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _serve(self, lane: _Lane) -> None:
        try:
            idle_since: float | None = None
            while True:
                with self._cond:
                    if not lane.queue:
                        if idle_since is None:
                            idle_since = time.monotonic()
                        idle_left = IDLE_EXIT - (time.monotonic() - idle_since)
                        if idle_left > 0 or lane.owners:
                            self._cond.wait(idle_left if idle_left > 0 else IDLE_EXIT)
                            continue
                        lane.thread = None
                        return
                    idle_since = None
                    owner, fn, args = lane.queue.popleft()
                    lane.running = owner
                try:
                    fn(*args)
                except Exception:
                    logger.exception("a callback of %r raised: %r", owner, fn)
                finally:
                    with self._cond:
                        lane.running = None
                        self._cond.notify_all()
                del owner, fn, args
        finally:
            close_connections()


def dispatch(owner: Any, fn: Callable[..., Any], *args: Any) -> None:
    """Call a user's ``fn(*args)``: on a callback thread when the keeper is the caller (it
    must not wait for user code), else at once in the calling thread (a ``check()`` that
    finds a lease lost calls ``on_lost`` before it raises). An exception is logged."""
    current = keeper()
    if current.on_keeper_thread():
        current.callbacks.call(owner, fn, *args)
        return
    try:
        fn(*args)
    except Exception:
        logger.exception("a callback of %r raised: %r", owner, fn)


#: This process's keeper (a forked child gets its own, keeping nothing its parent kept).
class Taking:
    """``Keeper.taking``: the calling thread is counted before it looks at ``stopping``, and a
    process that stops sets ``stopping`` before it looks at the count, so one of the two
    always sees the other (the thread is refused, or the process waits for it)."""

    __slots__ = ("_keeper", "_what", "_ident")

    def __init__(self, keeper: Keeper, what: str) -> None:
        self._keeper = keeper
        self._what = what

    def __enter__(self) -> None:
        ident = self._ident = threading.get_ident()
        taking = self._keeper._taking
        taking[ident] = taking.get(ident, 0) + 1
        if self._keeper.stopping.is_set():
            self.__exit__(None, None, None)
            self._keeper.refuse_when_stopping(self._what)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        taking = self._keeper._taking
        depth = taking[self._ident] - 1
        if depth:
            taking[self._ident] = depth
        else:
            del taking[self._ident]


keeper = PerProcess(Keeper)


def _drain_at_exit() -> None:
    """A normal exit lets the one-off callbacks already queued run first (``EXIT_DRAIN``): a
    lease lost a moment before the main thread returned still gets its ``on_lost``."""
    if not keeper().callbacks.drain(EXIT_DRAIN):
        logger.warning("exiting with on_lost callbacks not yet run after %gs", EXIT_DRAIN)


atexit.register(_drain_at_exit)

__all__ = [
    "CALLBACK_THREADS",
    "EXIT_DRAIN",
    "IDLE_EXIT",
    "OVERRUN",
    "Callbacks",
    "Keeper",
    "dispatch",
    "keeper",
    "start_thread",
]
