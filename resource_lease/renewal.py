"""The background renewal of ``auto_renew`` leases: one daemon thread per process.

One thread (and one database connection) serves every auto-renewed lease of the process,
woken by a timer heap, instead of a thread per lease. It holds leases weakly, so a lease
that is garbage-collected stops being renewed and simply expires; it exits (closing its
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
from typing import TYPE_CHECKING

from resource_lease.conf import lease_settings
from resource_lease.db.connections import close_connections

if TYPE_CHECKING:
    from resource_lease.lease import Lease

logger = logging.getLogger("resource_lease")

#: Seconds the renewal thread waits with nothing to renew before it exits.
IDLE_EXIT = 1.0


class Renewer:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, weakref.ref[Lease]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        # Leases with an entry in the heap: one entry per lease, however often its renewal
        # is switched off and on again (leader_only renews only while its body runs).
        self._queued: weakref.WeakSet[Lease] = weakref.WeakSet()

    def add(self, lease: Lease) -> None:
        due = time.monotonic() + lease.ttl * float(lease_settings.RENEW_FRACTION)
        with self._cond:
            if lease not in self._queued:
                heapq.heappush(self._heap, (due, next(self._seq), weakref.ref(lease)))
                self._queued.add(lease)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="resource-lease-renewer", daemon=True)
                self._thread.start()
            self._cond.notify()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _next_due(self) -> Lease | None:
        """Wait for the next lease that is due; None when there is nothing left to renew."""
        idle_since: float | None = None
        with self._cond:
            while True:
                while self._heap:
                    lease = self._heap[0][2]()
                    if lease is not None and lease._auto_renew:
                        break
                    heapq.heappop(self._heap)  # released, lost or garbage-collected
                    if lease is not None:
                        self._queued.discard(lease)
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
                    assert lease is not None  # the loop above stops only at a live lease
                    self._queued.discard(lease)
                    return lease
                del lease
                self._cond.wait(delay)

    def _run(self) -> None:
        try:
            while (lease := self._next_due()) is not None:
                next_in = lease._renew_in_background()
                if next_in is not None:
                    with self._cond:
                        if lease not in self._queued:  # add() may have queued it meanwhile
                            heapq.heappush(
                                self._heap, (time.monotonic() + next_in, next(self._seq), weakref.ref(lease))
                            )
                            self._queued.add(lease)
                del lease
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
