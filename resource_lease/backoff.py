"""Waiting for a grant: one loop with jittered backoff for every primitive that waits.

``acquire()``, the threaded holder, named locks, semaphores, elections and barriers all wait
the same way: try, and while nothing is granted, sleep a randomised, growing pause (capped by
``RESOURCE_LEASE["BACKOFF_MAX"]``, 1 s by default) until the caller's timeout runs out.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from resource_lease.conf import lease_settings

T = TypeVar("T")


class Backoff:
    """Decorrelated jitter: waiters spread out instead of retrying in step."""

    def __init__(self, base: float | None = None, cap: float | None = None) -> None:
        self.base = float(lease_settings.BACKOFF_BASE if base is None else base)
        self.cap = float(lease_settings.BACKOFF_MAX if cap is None else cap)
        self._last = self.base

    def next(self) -> float:
        self._last = min(self.cap, random.uniform(self.base, self._last * 3))
        return self._last


def wait_for(
    attempt: Callable[[], T | None],
    *,
    timeout: float | None,
    sleep: Callable[[float], object] = time.sleep,
) -> T | None:
    """Call ``attempt`` until it returns something other than None, or ``timeout`` seconds
    (None: for ever; 0: one attempt) have passed; then None. Exceptions propagate at once.

    ``sleep(seconds)`` pauses between attempts; a waiter that must stop early passes one it
    can interrupt (``threading.Event.wait``) and raises from its next ``attempt``.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    backoff = Backoff()
    while True:
        result = attempt()
        if result is not None:
            return result
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return None
        pause = backoff.next()
        sleep(pause if deadline is None else min(pause, deadline - now))
