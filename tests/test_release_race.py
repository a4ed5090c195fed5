"""A release whose snapshot predates a place still wakes that place's waiter (PostgreSQL).

RELEASE decides whom to tell with the snapshot its statement started with. A waiter whose place
commits while the release runs is not in that snapshot, and its look, made before the release
commits, sees the row still held: nobody would tell it, and it would sleep until its
``LINE_POLL_MAX`` look (found by tests/test_liveness.py, 4 runs in 5 on a loaded machine). A
release that told nobody of a marked row tells again once it has committed
(``TELL_TURNS_AFTER``, ``RW_TELL_AFTER``).

The race is made certain here: another transaction locks the row, so the release takes its
snapshot and then waits; the waiter (a process of its own, whose looks are two minutes apart)
takes its place and looks meanwhile; the lock is let go. The negative control runs the same
with the second telling off, and the same check catches the stall."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.conf import settings
from django.db import connection, connections
from django.test import override_settings

from resource_lease import lock, rwlock
from resource_lease.db.postgresql import PostgreSQLLine
from resource_lease.models import Resource
from resource_lease.recipes.locks import LOCK_KIND
from resource_lease.recipes.rwlock import RWLOCK_KIND
from tests.conftest import worker_env
from tests.line_waiting import Waiting, wait_for_places, waiting_fixture  # noqa: F401 (the fixture)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="turns are told by NOTIFY: PostgreSQL only (elsewhere waiters look)"
    ),
]

#: Seconds a told waiter has to be served: far below its looks (120 s apart).
SERVED_WITHIN = 15.0
#: Seconds the negative control waits to see that nobody told the waiter.
STALLED_FOR = 6.0


def slow_looks() -> dict[str, str]:
    return worker_env(RESOURCE_LEASE_LINE_POLL_MAX="120", RESOURCE_LEASE_LINE_POLL="120")


@pytest.fixture(name="tells_again")
def tells_again_fixture() -> Iterator[Callable[[bool], None]]:
    def set_to(on: bool) -> None:
        PostgreSQLLine.tells_again = on

    yield set_to
    PostgreSQLLine.tells_again = True


def waiting_on_lock() -> int:
    """Backends of this database waiting for a row lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])


#: The release's bounded lock wait while the other transaction holds the row: far above the
#: time the waiter's process takes to start, take its place and look, which on CI's loaded
#: machine once outlasted the default 5 s (the release gave up with LockWaitTimeout, and
#: nothing was released for the waiter to be told of).
RELEASE_LOCK_WAIT = 60.0


def race(kind: str, name: str, release: Callable[[], object], waiter: Callable[[], Waiting]) -> Waiting:
    """Release (in a thread) while another transaction locks the row, start the waiter and let
    it take its place and look, then let the row go; the waiter."""
    with override_settings(RESOURCE_LEASE={**settings.RESOURCE_LEASE, "LOCK_WAIT_TIMEOUT": RELEASE_LOCK_WAIT}):
        return _race(kind, name, release, waiter)


def _race(kind: str, name: str, release: Callable[[], object], waiter: Callable[[], Waiting]) -> Waiting:
    # The row is marked for a long while (as a waiter of a moment ago left it), so neither the
    # release's check of the mark nor the new waiter's MARK touches the locked row.
    Resource.objects.filter(kind=kind, name=name).update(line_until=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    blocker = connections.create_connection("default")
    blocker.set_autocommit(False)
    try:
        with blocker.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {Resource._meta.db_table} WHERE kind = %s AND name = %s FOR UPDATE", (kind, name)
            )
        releasing = threading.Thread(target=release)
        releasing.start()
        deadline = time.monotonic() + 30
        while waiting_on_lock() < 1:
            assert time.monotonic() < deadline, "the release never waited for the locked row"
            time.sleep(0.02)
        w = waiter()
        w.next("entered")
        wait_for_places(kind, name, 1)
        time.sleep(1.5)  # its look, right after its place: it sees the row held
        assert "granted" not in [e["event"] for e in w.events]
    finally:
        blocker.rollback()
        blocker.close()
    releasing.join(timeout=30)
    assert not releasing.is_alive(), "the release never ended"
    return w


def lock_race(waiting: Callable[..., Waiting]) -> Waiting:
    held = lock("release-race", ttl=300, timeout=0)
    return race(
        LOCK_KIND,
        "release-race",
        held.release,
        lambda: waiting("--what", "lock:release-race", "--once", "--heard", env=slow_looks()),
    )


def test_a_place_taken_while_a_release_ran_is_told_its_turn(
    waiting: Callable[..., Waiting], tells_again: Callable[[bool], None]
) -> None:
    tells_again(True)
    w = lock_race(waiting)
    assert w.next("granted", timeout=SERVED_WITHIN)["wakes"] >= 1


def test_without_the_second_telling_the_waiter_sleeps_through_the_release(
    waiting: Callable[..., Waiting], tells_again: Callable[[bool], None]
) -> None:
    tells_again(False)
    w = lock_race(waiting)
    with pytest.raises(AssertionError, match="no"):
        w.next("granted", timeout=STALLED_FOR)


def read_race(waiting: Callable[..., Waiting]) -> Waiting:
    read = rwlock("release-race").read(ttl=300, timeout=0)
    return race(
        RWLOCK_KIND,
        "release-race",
        read.release,
        lambda: waiting("--what", "rwlock-write:release-race", "--once", "--heard", env=slow_looks()),
    )


def test_a_writer_that_came_while_the_last_reader_left_is_woken(
    waiting: Callable[..., Waiting], tells_again: Callable[[bool], None]
) -> None:
    tells_again(True)
    w = read_race(waiting)
    assert w.next("granted", timeout=SERVED_WITHIN)["wakes"] >= 1


def test_without_the_second_telling_the_writer_sleeps_through_the_last_reader(
    waiting: Callable[..., Waiting], tells_again: Callable[[bool], None]
) -> None:
    tells_again(False)
    w = read_race(waiting)
    with pytest.raises(AssertionError, match="no"):
        w.next("granted", timeout=STALLED_FOR)


def test_a_release_pays_for_the_line_only_when_there_is_one(make_pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release of a row no waiter marked runs the plain statement (RELEASE_UNMARKED) and never
    the hand-off's RELEASE; a marked row's release runs RELEASE (which tells its line). Shown by
    a RELEASE that fails if it runs: the unmarked release succeeds, the marked one fails."""
    from resource_lease import acquire
    from resource_lease.db.connections import lease_connection
    from resource_lease.exceptions import LeaseDatabaseError

    make_pool("proxy", 2)
    dialect = lease_connection("default").dialect
    monkeypatch.setitem(dialect.sql, "RELEASE", "SELECT 1 / 0 WHERE %s > 0 AND %s > 0 AND %s <> '' AND %s > 0")
    assert acquire("proxy", ttl=30).release() is True
    marked = acquire("proxy", ttl=30)
    Resource.objects.filter(pk=marked.resource.pk).update(line_until=dt.datetime(2999, 1, 1, tzinfo=dt.UTC))
    with pytest.raises(LeaseDatabaseError):
        marked.release()
