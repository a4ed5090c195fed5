"""A release that hands its row to the first waiter of its line in its own statement
(PostgreSQL's ``RELEASE`` with ``HEAD_OF_LINE``, ``LineStatements.hands_off``): the waiter then only
reads its grant (``CLAIM_HANDED``), one read and no commit of its own per hand-off.

What must hold, each with a negative control that the same check catches:

- the row goes to the first waiter in the order of service (priority, then who asked first),
  with the grant a grant statement would write (fence + 1, its holder, its place's token),
  and its place leaves the line in the same commit; the waiters behind keep theirs
  (control: a release that hands to the last waiter);
- a waiter that leaves the line without taking a row handed to it (it gave up) gives it back
  as it leaves, and that release hands it on (control: leaving without the give-back leaves
  the row held under a token nobody reads, until its ttl);
- a waiter served by a grant of its own a moment after a release handed its place another
  row (its grant found the place gone) gives the handed row back (same control).

Elsewhere (MySQL/MariaDB, SQLite) no release hands a row: the waiter runs its own grant.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from resource_lease import acquire, lock
from resource_lease.db.connections import lease_connection, run_repeatable
from resource_lease.db.line import Ask
from resource_lease.db.postgresql import HANDED_DATA_MAX
from resource_lease.lease import Lease, making
from resource_lease.line import Line, Wait, Waiting, granting, leaving
from resource_lease.line.wakeups import Waker
from resource_lease.models import Resource, Waiter
from resource_lease.recipes.locks import LOCK_KIND
from tests.conftest import worker_env
from tests.line_waiting import Waiting as WaiterProcess
from tests.line_waiting import wait_for_places
from tests.line_waiting import waiting_fixture as waiting  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _hands_off() -> None:
    if not lease_connection("default").dialect.line.hands_off:
        pytest.skip(f"{connection.vendor}: no release hands its row on (the waiter runs its own grant)")


def _waiting(kind: str, holder: str, name: str = "") -> Waiting:
    """A waiter of this process with a place in line (no thread waits on it)."""
    request: Wait[Lease] = Wait(
        Line("default", kind, name),
        lambda grant: None,
        lambda grant: grant,  # type: ignore[arg-type,return-value]
        timeout=None,
        holder=holder,
        ttl=30,
        make=making(alias="default"),
        handed=making(alias="default"),
    )
    waiter = Waiting(request, timeout=None, waker=Waker())
    waiter.place = waiter._enter()
    assert waiter.place is not None and waiter.place.token
    return waiter


def _hand_to_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: releases hand their row to the last waiter of the line."""
    dialect = lease_connection("default").dialect
    order = "w.priority DESC, w.id LIMIT 1"
    assert order in dialect.sql["RELEASE"]
    monkeypatch.setitem(dialect.sql, "RELEASE", dialect.sql["RELEASE"].replace(order, "w.priority, w.id DESC LIMIT 1"))


def _two_waiters(
    name: str, start: Callable[..., WaiterProcess]
) -> tuple[Any, WaiterProcess, WaiterProcess, dict[int, str]]:
    """The lock ``name`` held here, and two waiter processes in its line, one after the other:
    (the lease, the first, the second, {place: token} in the order they took their places)."""
    held = lock(name, ttl=300, timeout=0)
    first = start("--what", f"lock:{name}", "--once", "--hold", "0.05")
    first_place = first.next("entered")["id"]
    wait_for_places(LOCK_KIND, name, 1)
    second = start("--what", f"lock:{name}", "--once", "--hold", "0.05")
    second_place = second.next("entered")["id"]
    wait_for_places(LOCK_KIND, name, 2)
    tokens = dict(Waiter.objects.filter(id__in=[first_place, second_place]).values_list("id", "token"))
    return held, first, second, {first_place: tokens[first_place], second_place: tokens[second_place]}


@pytest.mark.parametrize("variant", ["engine", "negative-control"])
def test_a_release_hands_its_row_to_the_first_waiter_in_the_same_statement(
    variant: str,
    monkeypatch: pytest.MonkeyPatch,
    waiting: Callable[..., WaiterProcess],  # noqa: F811
) -> None:
    held, first, second, tokens = _two_waiters("handed", waiting)
    first_place, second_place = tokens
    if variant == "negative-control":
        _hand_to_the_last(monkeypatch)
    # Both paused: what the release wrote is read before either waiter could act on it.
    first.kill(signal.SIGSTOP)
    second.kill(signal.SIGSTOP)
    try:
        assert held.release()
        row = Resource.objects.get(kind=LOCK_KIND, name="handed")
        places = set(Waiter.objects.filter(id__in=[first_place, second_place]).values_list("id", flat=True))
    finally:
        first.kill(signal.SIGCONT)
        second.kill(signal.SIGCONT)
    served_first = (
        row.grant_token == tokens[first_place]
        and row.fence == held.fence + 1
        and row.busy_before > row.acquired_at
        and places == {second_place}
    )
    if variant == "negative-control":
        assert not served_first, "a release handing its row to the last waiter was not caught"
        return
    assert served_first, (row.grant_token, tokens, row.fence, held.fence, places)
    granted = first.next("granted")
    assert granted["fence"] == held.fence + 1 and granted["handed"] == 1  # read, not granted by itself
    after = second.next("granted")  # the first one's release hands it on
    assert after["fence"] == held.fence + 2 and after["handed"] == 1
    assert Waiter.objects.filter(kind=LOCK_KIND, name="handed").count() == 0


@pytest.mark.parametrize("variant", ["engine", "negative-control"])
def test_a_release_hands_its_row_past_a_place_another_transaction_holds_locked(
    variant: str,
    monkeypatch: pytest.MonkeyPatch,
    waiting: Callable[..., WaiterProcess],  # noqa: F811
) -> None:
    """Releases at the same instant pick the same head of line; the one that finds its place
    locked (another release is handing it a row, or its waiter's own statement) hands its row
    to the next waiter at once (``SKIP LOCKED``) instead of waiting for that commit: 64
    processes on a pool of 40 queued each hand-off behind the one before it (3.6-3.8 ms a
    RELEASE, 0.35-0.42 without the wait: scripts/device/tail_probe.py). The place held
    locked is served by the next release. Control: without SKIP LOCKED the release waits
    for the lock."""
    import psycopg

    held, first, second, tokens = _two_waiters("past-locked", waiting)
    first_place, second_place = tokens
    if variant == "negative-control":
        dialect = lease_connection("default").dialect
        assert " SKIP LOCKED)" in dialect.sql["RELEASE"]
        monkeypatch.setitem(
            dialect.sql, "RELEASE", dialect.sql["RELEASE"].replace("FOR UPDATE OF w SKIP LOCKED)", "FOR UPDATE OF w)")
        )
    first.kill(signal.SIGSTOP)
    second.kill(signal.SIGSTOP)
    try:
        with psycopg.connect(**connection.get_connection_params()) as other:
            table = Waiter._meta.db_table
            other.execute(f'SELECT id FROM "{table}" WHERE id = %s FOR UPDATE', [first_place])  # noqa: S608
            # The lock is let go after 3 s whatever happens, so a release that waits for it ends.
            unlocking = threading.Timer(3.0, other.rollback)
            unlocking.start()
            started = time.monotonic()
            released = held.release()
            at_once = time.monotonic() - started < 2.0
            row = Resource.objects.get(kind=LOCK_KIND, name="past-locked")
            unlocking.join()
    finally:
        first.kill(signal.SIGCONT)
        second.kill(signal.SIGCONT)
    if variant == "negative-control":
        assert not at_once, "a release that waits for a locked place was not caught"
        assert released
        return
    assert at_once and released
    assert row.grant_token == tokens[second_place] and row.fence == held.fence + 1, (row.grant_token, tokens)
    # The first waiter is served next: the second one's release hands it on.
    assert second.next("granted")["handed"] == 1
    granted = first.next("granted")
    assert granted["fence"] == held.fence + 2 and granted["handed"] == 1


#: Seconds the waiter is stopped between the hand-off and its taking the grant.
PAUSED = 4.0


@pytest.mark.parametrize("variant", ["engine", "negative-control"])
@pytest.mark.parametrize(("ttl", "unread"), [(20.0, 1), (6.0, 0)], ids=["taken-unread", "read-after-long-pause"])
def test_a_grant_taken_as_the_release_described_it_never_outlasts_its_expiry(
    variant: str,
    ttl: float,
    unread: int,
    waiting: Callable[..., WaiterProcess],  # noqa: F811
) -> None:
    """The waiter takes a handed grant from the release's NOTIFY, without reading it, and
    counts its ttl from when it sent ENTER_LINE (the release's expiry counts from a moment
    after that insert committed: RELEASE's clock_timestamp()). A waiter stopped between the
    hand-off and its take must then believe no longer than the database's expiry; one stopped
    for more than half its ttl (``line.handoff.HANDED_UNREAD_MIN``) reads its grant instead, and
    counts from the read's answer. Control: the ttl counted from the take
    (``--handed-deadline-at-take``, taken unread): it believes the grant lasts PAUSED seconds
    longer than it does, which the same check catches."""
    held = lock("paused-handoff", ttl=300, timeout=0)
    # A payload the NOTIFY carries (under HANDED_DATA_MAX), as the waiter must see it.
    payload = {"url": "http://proxy-7:3128", "weight": 1.5, "tags": ["eu", None], "name": 'd\u00e9j\u00e0 "vu"'}
    Resource.objects.filter(kind=LOCK_KIND, name="paused-handoff").update(data=payload)
    args = ["--what", "lock:paused-handoff", "--once", "--ttl", str(ttl), "--heard", "--hold", "60"]
    if variant == "negative-control":
        args.append("--handed-deadline-at-take")
    # Looks so rare that none comes due in the pause: the waiter learns of the hand-off from
    # the NOTIFY (a look finding its place gone first would make it read its grant).
    waiter = waiting(*args, env=worker_env(RESOURCE_LEASE_LINE_POLL_MAX="120"))
    waiter.next("entered")
    wait_for_places(LOCK_KIND, "paused-handoff", 1)
    waiter.kill(signal.SIGSTOP)
    try:
        assert held.release()  # handed to the stopped waiter: its NOTIFY waits in its socket
        time.sleep(PAUSED)
    finally:
        waiter.kill(signal.SIGCONT)
    granted = waiter.next("granted")
    asked = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM busy_before - statement_timestamp()), fence, grant_token = ''"
            " FROM resource_lease_resource WHERE kind = %s AND name = %s",
            [LOCK_KIND, "paused-handoff"],
        )
        left, fence, freed = cursor.fetchone()
    assert granted["data"] == payload, granted["data"]
    expected_unread = 1 if variant == "negative-control" else unread
    assert granted["unread"] == expected_unread and granted["fence"] == fence == held.fence + 1 and not freed, (
        granted,
        fence,
    )
    # What the waiter believes is left at the moment of the read (at least: the read's clock
    # is a little later than ``asked``), against what the database has left.
    believed = granted["deadline_left"] - (asked - granted["deadline_at"])
    overshoot = believed - float(left)
    if variant == "negative-control":
        assert overshoot > PAUSED / 2, f"a deadline counted from the take was not caught ({overshoot:.3f}s)"
    else:
        assert overshoot <= 0.05, f"the waiter believes its grant lasts {overshoot:.3f}s past its expiry"


def test_a_handed_grant_whose_data_the_notify_cannot_carry_loads_it_on_first_access(
    waiting: Callable[..., WaiterProcess],  # noqa: F811
) -> None:
    """``data`` longer than HANDED_DATA_MAX is left out of the NOTIFY (its payload has a limit
    of 8000 bytes): the waiter still takes the grant unread, and its ``data`` loads when first
    read, whole."""
    held = lock("big-data", ttl=300, timeout=0)
    payload = {"blob": "x" * (HANDED_DATA_MAX * 3), "n": 7}
    Resource.objects.filter(kind=LOCK_KIND, name="big-data").update(data=payload)
    waiter = waiting("--what", "lock:big-data", "--once", "--heard", "--hold", "60")
    waiter.next("entered")
    wait_for_places(LOCK_KIND, "big-data", 1)
    assert held.release()
    granted = waiter.next("granted")
    assert granted["unread"] == 1 and granted["fence"] == held.fence + 1, granted
    assert granted["data"] == payload


@pytest.mark.parametrize("variant", ["engine", "negative-control"])
def test_a_waiter_that_gives_up_gives_back_the_row_handed_to_it(
    variant: str, monkeypatch: pytest.MonkeyPatch, make_pool: Callable[..., Any]
) -> None:
    if variant == "negative-control":
        monkeypatch.setattr(leaving, "give_back_handed", lambda place: False)
    make_pool("given-up", 1)
    held = acquire("given-up", ttl=300)
    giving_up = _waiting("given-up", "leaving")
    behind = _waiting("given-up", "behind")
    assert giving_up.place is not None and behind.place is not None
    token, behind_token = giving_up.place.token, behind.place.token
    try:
        assert held.release()  # handed to the first waiter's place
        assert Resource.objects.get(kind="given-up").grant_token == token
        giving_up.cleanup()  # it gave up (a timeout) and leaves, with a row handed to it
        row = Resource.objects.get(kind="given-up")
    finally:
        behind.cleanup()
    handed_on = row.grant_token == behind_token and row.holder == "behind" and row.fence == held.fence + 2
    if variant == "negative-control":
        assert row.grant_token == token and not handed_on, "a handed row left unclaimed was not caught"
    else:
        assert handed_on, (row.grant_token, row.holder, row.fence, held.fence)


@pytest.mark.parametrize("variant", ["engine", "negative-control"])
def test_a_waiter_served_by_its_own_grant_gives_back_a_row_handed_meanwhile(
    variant: str, monkeypatch: pytest.MonkeyPatch, make_pool: Callable[..., Any]
) -> None:
    if variant == "negative-control":
        monkeypatch.setattr(leaving, "give_back_handed", lambda place: False)
    make_pool("both", 2)
    first, second = acquire("both", ttl=300, holder="other"), acquire("both", ttl=300, holder="other")
    waiter = _waiting("both", "twice")
    place = waiter.place
    assert place is not None
    assert first.release()  # handed to the waiter's place, which leaves the line
    assert second.release()  # nobody waits now: freed
    # The waiter's own grant, as it was sent just before it heard of the hand-off: the line
    # form with its place, which finds the place gone as it leaves it.
    lease = granting.grant("default", Ask("both", "twice", 30), place.turn, making(alias="default"))
    assert lease is not None and lease.resource.pk == second.resource.pk
    waiter.granted = True
    waiter.cleanup()
    handed = Resource.objects.get(pk=first.resource.pk)
    given_back = handed.grant_token == "" and handed.busy_before <= handed.released_at
    try:
        if variant == "negative-control":
            assert handed.grant_token == place.token and not given_back, "a row handed twice was not caught"
        else:
            assert given_back, (handed.grant_token, place.token)
    finally:
        lease.release()


@pytest.mark.parametrize("variant", ["engine", "negative-control"])
def test_a_release_settled_after_its_row_was_handed_on_counts_as_released(
    variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release whose answer was lost is settled by reading back whether it happened
    (``WAS_RELEASED``): one that handed its row to a waiter left the row with the waiter's
    grant, fence + 1, and counts as released. Control: the check as it was (only a cleared
    token of our fence counts) calls it not released."""
    dialect = lease_connection("default").dialect
    if variant == "negative-control":
        found = "OR (previous_holder = %s AND fence = %s + 1 AND took_over = FALSE)"
        assert found in dialect.sql["WAS_RELEASED"]
        before = dialect.sql["WAS_RELEASED"].replace(
            found, "OR (CAST(%s AS text) IS NULL AND CAST(%s AS bigint) IS NULL)"
        )
        monkeypatch.setitem(dialect.sql, "WAS_RELEASED", before)
    held = lock("settled", ttl=300, timeout=0)
    waiter = _waiting(LOCK_KIND, "next", name="settled")
    try:
        assert held.release()
        row = Resource.objects.get(kind=LOCK_KIND, name="settled")
        assert row.holder == "next" and row.fence == held.fence + 1  # handed on
        released = run_repeatable(
            "default",
            lambda d, c: d.leases.was_released(c, pk=row.pk, holder=held.holder, fence=held.fence),
            what="settling a release",
        )
    finally:
        waiter.cleanup()
    if variant == "negative-control":
        assert not released, "a handed-on release settled as not released was not caught"
    else:
        assert released
