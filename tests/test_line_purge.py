"""Expired places on a line nobody enters again are purged too (issue 37, point 10).

A line's expired places were dropped only by newcomers to that same line (``PURGE_LINE``,
every ``PURGE_EVERY`` seconds): a waiter killed on a line nobody asked for again left its row
for ever. Now a process entering any line also drops every line's expired places at most
every ``PURGE_ALL_EVERY`` seconds (``PURGE_LINES``). Negative control: that purge put off (the
old behaviour), the dead waiter's place stays.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest

from resource_lease import line, lock
from resource_lease.exceptions import LockHeld
from resource_lease.line import places
from resource_lease.models import Waiter
from resource_lease.recipes.locks import LOCK_KIND
from tests.line_waiting import Waiting, wait_for_places, waiting_fixture  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("purge_all", ["on", "off"])
def test_a_dead_waiters_place_on_a_line_nobody_enters_again_is_purged(
    purge_all: str, waiting: Callable[..., Waiting]
) -> None:
    held = lock("forgotten", ttl=300, timeout=0)
    gone = waiting("--what", "lock:forgotten", "--ttl", "1", "--hold", "0.1")
    wait_for_places(LOCK_KIND, "forgotten", 1)
    gone.kill(signal.SIGKILL)
    gone.proc.wait(timeout=60)
    time.sleep(1.5)  # its place has expired (ttl 1 s)
    assert Waiter.objects.filter(kind=LOCK_KIND, name="forgotten").exists()

    line.forget_lines()  # this process has purged nothing yet
    if purge_all == "off":
        places._purged_all["default"] = time.monotonic()  # as if just purged: the old behaviour
    other = lock("elsewhere", ttl=300, timeout=0)
    with pytest.raises(LockHeld):
        lock("elsewhere", ttl=5, timeout=0.2)  # waits in another line: its entry purges
    left = Waiter.objects.filter(kind=LOCK_KIND, name="forgotten").exists()
    assert left is (purge_all == "off")
    other.release()
    held.release()
