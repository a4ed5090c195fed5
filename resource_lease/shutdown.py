"""Shutting down: give back everything this process holds, on SIGTERM and at exit.

systemd, Kubernetes and ``kill`` stop a process with SIGTERM, whose default action runs no
``finally``: without a handler every lease, lock and place in line the process held would
stay taken for its whole ttl. ``install_sigterm_handler()`` (from the main thread, once)
makes SIGTERM give back, in this order:

1. every ``ResourceHolder`` of the process (terminated: its thread stopped, its lease
   released; ``holder.registry``),
2. every lease still held (``acquire``, ``lock``, ``semaphore``, an rwlock's read or write,
   an election's or a group's row: every grant made through ``line.granting.grant``),
3. every place in line (``line.Place``: the waiters' places, kept by the keeper),

then exit with status 143 (``SystemExit``, so ``finally`` blocks run), or, where the
application had installed a SIGTERM handler before, call that handler instead (it decides
whether and how to exit). From the moment the giving back starts, this process is refused
new grants (``LeaseError``), so a thread does not take again what was just given back.

It also gives back what is still held at a normal interpreter exit (``atexit``: the end of
the main module, ``sys.exit``, Ctrl-C), after the non-daemon threads have ended: a daemon
thread's lease, or one the program never released, is freed at once instead of at its ttl.

``give_back_all()`` does the same without the signal. A forked child gives back only what
it acquired itself (the parent's leases are refused to it, as ever).
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from resource_lease import lease as leases
from resource_lease.keeper import keeper
from resource_lease.line import Place, leaving
from resource_lease.validation import check_seconds

logger = logging.getLogger("resource_lease")

#: What else gives back on shutdown before the plain leases, registered by the layers above
#: this one (``holder.registry`` terminates the ``ResourceHolder``s): each returns how many.
_first: list[Callable[[float | None], int]] = []


def give_back_first(hook: Callable[[float | None], int]) -> None:
    """Run ``hook(timeout)`` first when the process gives back what it holds (a layer above
    this module: the holders, whose threads would otherwise take a resource again)."""
    if hook not in _first:
        _first.append(hook)


@dataclass(frozen=True)
class GivenBack:
    """What ``give_back_all`` gave back: holders terminated, leases released, places left."""

    holders: int = 0
    leases: int = 0
    places: int = 0

    def __str__(self) -> str:
        return f"{self.holders} holder(s), {self.leases} lease(s), {self.places} place(s) in line"


def give_back_all(timeout: float | None = 10.0) -> GivenBack:
    """Give back every holder's lease, every lease still held and every place in line of
    this process, now; refuse it new grants from now on. Errors are logged, never raised
    (each thing not given back expires by itself at its ttl). ``timeout``: seconds each
    holder's thread is waited for."""
    return _give_back_all(timeout)


#: The most seconds the giving back waits for the threads taking a grant or a place in line
#: now to register it (``Keeper.settle``): a statement under way, a few milliseconds.
SETTLE_WAIT = 5.0


def _give_back_all(timeout: float | None, *, interrupted: int | None = None) -> GivenBack:
    """``give_back_all``; ``interrupted``: the thread a signal handler interrupted (it takes
    nothing until the handler returns, so it is not waited for)."""
    keeper().stopping.set()
    holders = 0
    for hook in list(_first):
        try:
            holders += hook(timeout)
        except Exception:
            logger.exception("giving back on shutdown: %r failed", hook)
    # A thread whose grant or place the database has made but the process has not yet
    # registered would be missed below: wait until it has (a grant made meanwhile is then
    # given back by its own thread, which sees ``stopping``: lease.lease_from_row).
    keeper().settle(SETTLE_WAIT, besides=() if interrupted is None else (interrupted,))
    released = leases.give_back_granted()
    places = 0
    for place in [job for job in keeper().jobs() if isinstance(job, Place)]:
        places += leaving.leave_at_exit(place)
    given = GivenBack(holders, released, places)
    if holders or released or places:
        logger.info("gave back %s", given)
    return given


def within(call: Callable[[], object], seconds: float, name: str, *, daemon: bool) -> bool:
    """Run ``call`` on a thread of its own and wait at most ``seconds`` for it; whether it
    ended. For work a signal handler starts (this module's, ``contrib.beat``'s close): the
    handler runs on the main thread wherever the signal found it, possibly inside a lock the
    work needs, so on that thread the work could wait for ever."""
    worker = threading.Thread(target=call, name=name, daemon=daemon)
    worker.start()
    worker.join(seconds)
    return not worker.is_alive()


class _Handler:
    """The SIGTERM handler ``install_sigterm_handler`` installs (one per process)."""

    def __init__(self, timeout: float, previous: Any) -> None:
        self.timeout = timeout
        self.previous = previous

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        # Not a daemon, so if it has to wait for the main thread to unwind, the interpreter
        # still lets it finish before exiting.
        timeout, interrupted = self.timeout, threading.get_ident()
        within(
            lambda: _give_back_all(timeout, interrupted=interrupted), timeout, "resource-lease-sigterm", daemon=False
        )
        if callable(self.previous):
            self.previous(signum, frame)
            return
        raise SystemExit(128 + signum)


_installed: _Handler | None = None
_lock = threading.Lock()


def install_sigterm_handler(timeout: float = 15.0) -> None:
    """On SIGTERM, give back every lease, lock, semaphore and rwlock grant, every place in
    line and every ``ResourceHolder``'s lease of this process (``give_back_all``), then exit
    with status 143 (``SystemExit``, so ``finally`` blocks run); at a normal interpreter exit,
    give back what is still held. ``timeout``: the most seconds SIGTERM waits for the giving
    back. Call it from the main thread; calling it again only changes the timeout.

    A SIGTERM handler installed before (by the application, a framework) is never replaced
    silently: it is called after the giving back, instead of exiting (it decides), and a
    warning says so. A handler installed after this one replaces it (Python keeps one); the
    exit hook still gives back what is held once the process exits normally.
    """
    global _installed
    wait = check_seconds(timeout, "timeout")
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("install_sigterm_handler() must be called from the main thread (Python's signal rule)")
    with _lock:
        current = signal.getsignal(signal.SIGTERM)
        installed = _installed
        if isinstance(current, _Handler) and current is installed:
            current.timeout = wait
            return
        if callable(current):
            logger.warning(
                "install_sigterm_handler(): a SIGTERM handler was installed before (%r); on SIGTERM this "
                "process gives back what it holds, then calls it instead of exiting",
                current,
            )
        first = installed is None
        _installed = _Handler(wait, current)
        signal.signal(signal.SIGTERM, _installed)
        if first:
            atexit.register(_at_exit)


def _at_exit() -> None:
    give_back_all(_installed.timeout if _installed is not None else 10.0)


__all__ = ["GivenBack", "give_back_all", "give_back_first", "install_sigterm_handler"]
