"""PostgreSQL tells a release's turn to the waiter it may serve, on its process's own channel
(``resource_lease.wakeups``), rather than waking every listening process: with real processes
whose looks are slowed to two minutes, so that only a NOTIFY can serve them within the test's
patience. The negative control (``--herd``: releases that wake the whole line, as before) is
caught by the same count of wake-ups."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable

import pytest
from django.db import connection

from resource_lease import acquire, lock
from resource_lease.line import wakeups
from resource_lease.models import Resource
from resource_lease.recipes.locks import LOCK_KIND
from tests.conftest import worker_env
from tests.line_waiting import Waiting, wait_for_places, waiting_fixture  # noqa: F401 (the fixture)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="turns are told by NOTIFY: PostgreSQL only (elsewhere waiters look)"
    ),
]


def slow_looks() -> dict[str, str]:
    """The children's environment: looks so rare that a waiter served within the test's
    patience was told."""
    return worker_env(RESOURCE_LEASE_LINE_POLL_MAX="120", RESOURCE_LEASE_LINE_POLL="120")


def chain_of_turns(waiting: Callable[..., Waiting], *flags: str, count: str = "wakes") -> list[int]:
    """Four processes wait in line for a lock this test holds, each releasing at once when
    served; the wake-ups each had when it was served (``count``: ``wakes``, those its waiter
    collected; ``delivered``, every one that reached its process), in the order of service."""
    held = lock("turns", ttl=300, timeout=0)
    waiters = []
    for n in range(4):
        waiters.append(waiting("--what", "lock:turns", "--once", "--heard", *flags, env=slow_looks()))
        waiters[-1].next("entered")
        wait_for_places(LOCK_KIND, "turns", n + 1)
    held.release()
    served = [w.next("granted") for w in waiters]
    assert [s["granted"] for s in served] == sorted(s["granted"] for s in served), "served out of order"
    return [s[count] for s in served]


def test_a_release_wakes_only_the_waiter_whose_turn_it_is(waiting: Callable[..., Waiting]) -> None:
    wakes = chain_of_turns(waiting)
    # Each waiter was woken once, by its own turn: the releases before it woke nobody else.
    assert wakes == [1, 1, 1, 1]


def test_a_release_reaches_only_the_process_whose_turn_it_is(waiting: Callable[..., Waiting]) -> None:
    # The same, counted as delivered to each process (the negative control's count below).
    assert chain_of_turns(waiting, count="delivered") == [1, 1, 1, 1]


def test_releases_that_wake_the_whole_line_are_caught(waiting: Callable[..., Waiting]) -> None:
    delivered = chain_of_turns(waiting, "--herd", count="delivered")
    # The first release was ours (it tells turns); each of the children's woke all behind it,
    # and a waiter learns that the row is free only from a release's NOTIFY (its looks are two
    # minutes apart): so before it was served the third had the first's and the second's, and
    # the fourth also the third's. Counted as delivered to the process, not as its waiter
    # collected them: one that comes while the waiter looks or tries is not collected.
    assert delivered[2] >= 2 and delivered[3] >= 3, delivered


def test_a_freed_row_is_told_to_the_first_waiter_its_data_matches(waiting: Callable[..., Waiting]) -> None:
    for name in "ab":
        Resource.objects.create(kind="turns-where", name=name, data={"c": name})
    a = acquire("turns-where", where={"c": "a"}, ttl=300)
    b = acquire("turns-where", where={"c": "b"}, ttl=300)
    for_a = waiting(
        "--what", "pool:turns-where", "--once", "--heard", "--where", json.dumps({"c": "a"}), env=slow_looks()
    )
    for_a.next("entered")
    for_b = waiting(
        "--what", "pool:turns-where", "--once", "--heard", "--where", json.dumps({"c": "b"}), env=slow_looks()
    )
    for_b.next("entered")
    wait_for_places("turns-where", "", 2)
    b.release()
    served = for_b.next("granted")
    assert served["row"] == b.resource.pk and served["wakes"] == 1
    a.release()
    assert for_a.next("granted")["wakes"] == 1


def test_a_turn_its_waiter_no_longer_wants_is_passed_on(waiting: Callable[..., Waiting]) -> None:
    Resource.objects.create(kind="turns-pass", name="only")
    held = acquire("turns-pass", ttl=300)
    behind = waiting("--what", "pool:turns-pass", "--once", "--heard", env=slow_looks())
    behind.next("entered")
    wait_for_places("turns-pass", "", 1)
    # The waiter's first look has returned (once, it ran after the update below: it found the
    # row free and was served without a wake-up, on a loaded machine).
    assert not behind.next("looked")["free"]
    # The row comes free without a release (nothing is told), and the waiter looked already:
    # it would look again in two minutes.
    Resource.objects.filter(pk=held.resource.pk).update(busy_before=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    # A turn reaches this process for a place none of its waiters has (its waiter was served
    # meanwhile): passed on, it reaches the waiter first in line now.
    wakeups._on_turn("default")(json.dumps([0, "turns-pass", ""]))
    assert behind.next("granted")["wakes"] == 1
