"""Imported at start-up by fault workers run under libfaketime only (``harness.faketime_env``
puts this directory first on their PYTHONPATH).

libfaketime 0.9.10 (Debian 12) intercepts clock_nanosleep() and fails the absolute
CLOCK_MONOTONIC sleep that ``time.sleep()`` uses on Linux with EINVAL, even with
FAKETIME_DONT_FAKE_MONOTONIC. ``select()`` with a relative timeout is not intercepted, so
sleep with it instead. (Lock and condition waits are unaffected.)
"""

from __future__ import annotations

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep
