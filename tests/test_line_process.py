"""The line of waiters within one process: woken at once by a release here, leaving the line
at once on timeout or close, places kept by the background renewal, and what operators see
(inspect_pool, the admin)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import Client, override_settings

from resource_lease import acquire, line, lock
from resource_lease.conf import lease_settings
from resource_lease.db.connections import close_connections
from resource_lease.exceptions import LockHeld, NoResourceAvailable
from resource_lease.lease import Lease
from resource_lease.models import Resource, Waiter
from tests.holder_helpers import Holder

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = 60.0


class Asking(threading.Thread):
    """``call()`` on a thread of this process; ``result`` or ``error`` when it returns."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            self.error = exc
        finally:
            close_connections()  # the thread's own engine connection ends with it

    def outcome(self) -> Any:
        self.join(WAIT)
        assert not self.is_alive(), "the call never returned"
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture
def asking() -> Iterator[Callable[[Callable[[], Any]], Asking]]:
    started: list[Asking] = []

    def start(call: Callable[[], Any]) -> Asking:
        thread = Asking(call)
        started.append(thread)
        thread.start()
        return thread

    yield start
    for thread in started:
        thread.join(WAIT)


def in_line(kind: str, name: str = "", n: int = 1) -> None:
    deadline = threading.Event()
    for _ in range(3000):
        if Waiter.objects.live().filter(kind=kind, name=name).count() >= n:
            return
        deadline.wait(0.02)
    raise AssertionError(f"nobody took a place in line {kind}:{name}")


@override_settings(RESOURCE_LEASE={"LINE_POLL": 60.0, "LINE_POLL_MAX": 60.0})
def test_a_release_in_this_process_wakes_its_waiters_at_once(
    make_pool: Callable[..., Any], asking: Callable[..., Asking]
) -> None:
    """Looks are a minute apart here, so only the in-process wake-up can serve the waiter."""
    make_pool("woken", 1)
    held = acquire("woken", ttl=30)
    looks = line.stats.looks
    waiter = asking(lambda: acquire("woken", ttl=30, timeout=WAIT))
    in_line("woken")
    assert held.release()
    got: Lease = waiter.outcome()
    assert got.resource.pk == held.resource.pk
    assert line.stats.looks - looks <= 2  # its first look, and none of the minute-apart ones
    got.release()


def test_a_place_that_waits_out_the_lock_wait_is_taken_again_rather_than_raised(
    make_pool: Callable[..., Any], asking: Callable[..., Asking]
) -> None:
    """Regression (CI, a Galera node under load): taking a place in line (its MARK_LINE
    updates the kind's rows) waited out LOCK_WAIT_TIMEOUT behind another transaction's row
    lock, and acquire() raised LockWaitTimeout while its own timeout had 15 s to go. Like a
    grant that waits it out (rolled back, nothing written), the place is tried again until the
    caller's timeout decides."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no row locks: an open write transaction holds up every statement")
    (row,) = make_pool("line-lock-wait", 1)
    with override_settings(RESOURCE_LEASE={"LOCK_WAIT_TIMEOUT": 1, "TRANSIENT_RETRIES": 0}):
        close_connections()  # new engine sessions pick up the short lock wait
        held = acquire("line-lock-wait", ttl=30)
        waits = line.stats.enter_lock_waits
        with transaction.atomic():
            Resource.objects.select_for_update().filter(pk=row.pk).get()
            waiter = asking(lambda: acquire("line-lock-wait", ttl=30, timeout=20))
            time.sleep(2.5)  # its place waits out the 1 s lock wait twice meanwhile
            assert waiter.is_alive(), f"the waiter gave up while the row was locked: {waiter.error!r}"
        assert held.release()
        got: Lease = waiter.outcome()
        assert got.resource.pk == row.pk
        assert line.stats.enter_lock_waits - waits >= 1, "the place never waited for the row lock"
        got.release()
        close_connections()


def test_a_waiter_that_gives_up_leaves_the_line_at_once(make_pool: Callable[..., Any]) -> None:
    make_pool("given-up", 1)
    held = acquire("given-up", ttl=30)
    with pytest.raises(NoResourceAvailable):
        acquire("given-up", ttl=30, timeout=0.3)
    assert not Waiter.objects.filter(kind="given-up").exists()
    with pytest.raises(LockHeld):
        with lock("given-up-lock", ttl=30):
            lock("given-up-lock", ttl=30, timeout=0.3)
    assert not Waiter.objects.filter(name="given-up-lock").exists()
    held.release()


def test_a_place_is_kept_by_the_background_renewal_past_its_ttl(
    make_pool: Callable[..., Any], asking: Callable[..., Asking]
) -> None:
    make_pool("kept", 1)
    held = acquire("kept", ttl=30)
    renewals = line.stats.renewals
    waiter = asking(lambda: acquire("kept", ttl=1.0, timeout=WAIT))
    in_line("kept")
    first = Waiter.objects.get(kind="kept")
    threading.Event().wait(2.5)  # over twice the place's ttl
    assert line.stats.renewals - renewals >= 2
    again = Waiter.objects.get(kind="kept")
    assert again.pk == first.pk and again.expires_at > first.expires_at  # the same place, kept
    with pytest.raises(NoResourceAvailable):  # and still in force: a newcomer is refused
        assert held.release()
        acquire("kept", ttl=30, timeout=0)
    waiter.outcome().release()


def test_closing_a_holder_ends_its_wait_in_line_at_once(
    make_pool: Callable[..., Any], holders: Callable[..., Any], asking: Callable[..., Asking]
) -> None:
    make_pool("closing", 1)
    held = acquire("closing", ttl=30)
    holder = holders(Holder, kind="closing", ttl=30)
    waiter = asking(lambda: holder.acquire(timeout=None))
    in_line("closing")
    holder.close()
    with pytest.raises(NoResourceAvailable, match="closed"):
        waiter.outcome()
    assert not Waiter.objects.filter(kind="closing").exists()
    held.release()


def test_operators_see_who_waits_in_which_place(
    make_pool: Callable[..., Any], asking: Callable[..., Asking], admin_client: Client
) -> None:
    Resource.objects.create(kind="seen", name="seen-0", data={"region": "eu"})
    held = acquire("seen", ttl=30)
    first = asking(lambda: acquire("seen", ttl=30, timeout=WAIT, holder="first-waiter"))
    in_line("seen")
    second = asking(lambda: acquire("seen", ttl=30, timeout=WAIT, holder="urgent", priority=5, where={"region": "eu"}))
    in_line("seen", n=2)

    out = StringIO()
    call_command("inspect_pool", "--kind", "seen", "--json", stdout=out)
    waiting = json.loads(out.getvalue())["waiting"]["seen"]
    assert [(w["place"], w["holder"], w["priority"], w["where"]) for w in waiting] == [
        (1, "urgent", 5, {"region": "eu"}),
        (2, "first-waiter", 0, None),
    ]
    assert all(w["waited"] >= 0 and w["since"].endswith("Z") for w in waiting)
    out = StringIO()
    call_command("inspect_pool", "--kind", "seen", stdout=out)
    assert "Waiting for seen: 2 in line" in out.getvalue()
    assert "1. urgent, waiting" in out.getvalue() and 'where {"region": "eu"}' in out.getvalue()

    page = admin_client.get("/admin/resource_lease/waiter/").content.decode()
    assert "urgent" in page and "first-waiter" in page and "region" in page
    overview = admin_client.get("/admin/resource_lease/pooloverview/").content.decode()
    assert "callers waiting in this kind&#x27;s line" in overview or "callers waiting in this kind's line" in overview

    assert held.release()
    served = second.outcome()  # the higher priority first
    assert served.holder == "urgent"
    served.release()
    first.outcome().release()
    assert not Waiter.objects.filter(kind="seen").exists()
    assert lease_settings.LINE_POLL > 0
