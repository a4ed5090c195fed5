"""Grants of a short ttl in tests that are about a short ttl (expiry, the local deadline).

A grant whose answer comes back after its lease's local deadline is never handed out: the
engine gives the row back and ``acquire()`` answers as if nothing were free
(docs/pitfalls.md#late-answers). At a ttl of 0.2-0.3 s that happens when a statement takes a
few hundred milliseconds, as in CI's first minute, when six test runs start at once and make
their databases. ``acquire_short`` asks again then, so such a test tests what it is about.
"""

from __future__ import annotations

import time
from typing import Any

from resource_lease import Lease, NoResourceAvailable, acquire

#: Seconds to keep asking: far more than any stall seen, far less than a test's timeout.
PATIENCE = 30.0


def acquire_short(kind: str, ttl: float, **kwargs: Any) -> Lease:
    """``acquire(kind, ttl=ttl, timeout=0, **kwargs)`` on a pool the test knows to be free,
    asked again while the grant came back too late to be handed out."""
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            return acquire(kind, ttl=ttl, **kwargs)
        except NoResourceAvailable:
            if time.monotonic() > deadline:
                raise
