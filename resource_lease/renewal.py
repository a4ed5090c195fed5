"""Renewal: the one renewal step and its failure policy, and the process's renewal thread.

Anything renewable (a ``Lease``; a ``ResourceHolder``'s current lease; through their leases a
lock, an election, a group membership) is renewed by ``renew_once``, which applies the one
failure policy:

- renewed: fine; a renewal that took longer than the renew interval is logged as a warning
  (the renewals are falling behind, and the next one may come too late);
- refused (``LeaseLost`` from ``renew()``): the grant is gone; ``renew()`` has recorded the
  loss itself (``Lease.renew`` marks the lease lost before it raises); stop;
- the database could not answer (``LeaseDatabaseError``): try again shortly while the local
  deadline has not passed; past it, ``mark_lost("could not renew before the local deadline:
  ...")`` and stop;
- anything else is a bug: logged with its traceback, ``mark_lost("renewal failed: ...")``,
  stop. A renewal never dies quietly.

What ``renew_once`` needs of the renewable is the ``Renewable`` protocol below; it knows
nothing else about it (this module imports no lease).

``Renewer`` is the background renewal of ``auto_renew`` leases: one daemon thread per
process. One thread (and one database connection) serves every renewable added to it,
woken by a timer heap, instead of a thread per lease. It holds them weakly, so a lease that
is garbage-collected stops being renewed and simply expires; it exits (closing its
connection) a second after it has nothing left to renew, and a forked child starts with none.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Protocol

from resource_lease.conf import lease_settings
from resource_lease.db.connections import Disconnected, close_connections
from resource_lease.exceptions import LeaseDatabaseError, LeaseLost

logger = logging.getLogger("resource_lease")

#: Seconds the renewal thread waits with nothing to renew before it exits.
IDLE_EXIT = 1.0


class Renewable(Protocol):
    """What ``renew_once`` needs of a renewable grant."""

    def renew(self) -> object:
        """Renew once, by the database. Raise ``LeaseLost`` when the grant is gone (having
        recorded the loss itself) or was given back, ``LeaseDatabaseError`` when the
        database could not answer."""

    def remaining(self) -> float:
        """Seconds the grant may still be trusted here: its local deadline, counted from when
        the grant or the last renewal was sent; 0 once it has passed."""

    def mark_lost(self, reason: str) -> None:
        """Take the policy's verdict that the grant is lost (``reason`` says why). Called at
        most once per ``renew_once``; a renewable that already knows it is lost ignores it."""


class BackgroundRenewable(Renewable, Protocol):
    """What the renewal thread (``Renewer``) needs: a ttl, which sets the first renewal at ttl
    x ``RENEW_FRACTION``, and one step that says when to come back."""

    ttl: float

    def renew_in_background(self) -> float | None:
        """One renewal (``renew_once``); seconds until the next, or None to stop."""


@dataclass(frozen=True)
class Step:
    """What one ``renew_once`` came to: renewed; not renewed but still trusted, to be tried
    again in ``retry_in`` seconds; or lost (neither), the renewable told."""

    renewed: bool
    retry_in: float | None = None

    @property
    def lost(self) -> bool:
        return not self.renewed and self.retry_in is None


RENEWED = Step(renewed=True)
LOST = Step(renewed=False)


def retry_delay(remaining: float) -> float:
    """The pause before retrying a renewal the database could not answer: a quarter of the
    trust left (so a few tries fit before the local deadline), between 50 ms and 1 s."""
    return max(0.05, min(1.0, remaining / 4))


def renew_once(target: Renewable, *, interval: float, prefix: str = "") -> Step:
    """Renew ``target`` once under the failure policy (see the module's docstring).

    ``interval`` is the renew interval (a renewal that took longer is warned about);
    ``prefix`` starts every log message (e.g. the holder's name).
    """
    started = time.monotonic()
    try:
        target.renew()
    except LeaseLost:
        return LOST
    except (LeaseDatabaseError, Disconnected) as exc:
        remaining = target.remaining()
        if remaining <= 0:
            target.mark_lost(f"could not renew before the local deadline: {exc}")
            return LOST
        logger.warning("%srenewing %r failed, retrying: %s", prefix, target, exc)
        return Step(renewed=False, retry_in=retry_delay(remaining))
    except Exception as exc:  # a bug must be loud, never a quietly dead renewal
        logger.exception("%srenewing %r failed unexpectedly", prefix, target)
        target.mark_lost(f"renewal failed: {exc!r}")
        return LOST
    took = time.monotonic() - started
    if took > interval:
        logger.warning("%srenewing %r took %.3fs, longer than the renew interval %.3fs", prefix, target, took, interval)
    return RENEWED


class Renewer:
    """The process's renewal thread: renews what was ``add``ed until it is ``discard``ed (a
    lease does so when it is released or lost) or garbage-collected."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, weakref.ref[BackgroundRenewable]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        # What is to be renewed; discard() takes it out, and its heap entry is dropped when due.
        self._renewing: weakref.WeakSet[BackgroundRenewable] = weakref.WeakSet()
        # What has an entry in the heap: one entry each, however often its renewal is
        # switched off and on again (leader_only renews only while its body runs).
        self._queued: weakref.WeakSet[BackgroundRenewable] = weakref.WeakSet()

    def add(self, renewable: BackgroundRenewable) -> None:
        """Renew ``renewable`` every ttl x ``RENEW_FRACTION`` from now on (until ``discard``)."""
        due = time.monotonic() + renewable.ttl * float(lease_settings.RENEW_FRACTION)
        with self._cond:
            self._renewing.add(renewable)
            if renewable not in self._queued:
                heapq.heappush(self._heap, (due, next(self._seq), weakref.ref(renewable)))
                self._queued.add(renewable)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="resource-lease-renewer", daemon=True)
                self._thread.start()
            self._cond.notify()

    def discard(self, renewable: BackgroundRenewable) -> None:
        """Stop renewing ``renewable`` (no-op if it was not renewed); the thread exits a second
        after it has nothing left to renew."""
        with self._cond:
            if renewable in self._renewing:
                self._renewing.discard(renewable)
                self._cond.notify()

    def renewing(self, renewable: BackgroundRenewable) -> bool:
        """Whether ``renewable`` is renewed in the background now."""
        with self._cond:
            return renewable in self._renewing

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _next_due(self) -> BackgroundRenewable | None:
        """Wait for the next renewable that is due; None when there is nothing left to renew."""
        idle_since: float | None = None
        with self._cond:
            while True:
                while self._heap:
                    renewable = self._heap[0][2]()
                    if renewable is not None and renewable in self._renewing:
                        break
                    heapq.heappop(self._heap)  # discarded (released, lost) or garbage-collected
                    if renewable is not None:
                        self._queued.discard(renewable)
                if not self._heap:
                    # Linger briefly before exiting: back-to-back leases (a Celery worker's
                    # tasks) then reuse the thread and its connection instead of paying
                    # for a new thread and a new connection each time.
                    if idle_since is None:
                        idle_since = time.monotonic()
                    idle_left = IDLE_EXIT - (time.monotonic() - idle_since)
                    if idle_left > 0:
                        self._cond.wait(idle_left)
                        continue
                    self._thread = None
                    return None
                idle_since = None
                delay = self._heap[0][0] - time.monotonic()
                if delay <= 0:
                    heapq.heappop(self._heap)
                    assert renewable is not None  # the loop above stops only at a live one
                    self._queued.discard(renewable)
                    return renewable
                del renewable
                self._cond.wait(delay)

    def _run(self) -> None:
        try:
            while (renewable := self._next_due()) is not None:
                next_in = renewable.renew_in_background() if self.renewing(renewable) else None
                if next_in is not None:
                    with self._cond:
                        # Still to be renewed, and not queued by add() meanwhile.
                        if renewable in self._renewing and renewable not in self._queued:
                            heapq.heappush(
                                self._heap,
                                (time.monotonic() + next_in, next(self._seq), weakref.ref(renewable)),
                            )
                            self._queued.add(renewable)
                del renewable
        except Exception:
            logger.exception("the lease renewal thread failed")
            with self._cond:
                self._thread = None
            raise
        finally:
            close_connections()


_renewer = Renewer()


def renewer() -> Renewer:
    return _renewer


def _after_fork_in_child() -> None:
    # Threads do not survive fork(): the child renews nothing its parent held
    # (docs/pitfalls.md#fork).
    global _renewer
    _renewer = Renewer()


os.register_at_fork(after_in_child=_after_fork_in_child)
