"""ResourceHolder: hold one valid resource for many ttls, loud and quick to move on when lost."""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import logging
import math
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.db import connections as django_connections
from django.db import transaction

from resource_lease import pool
from resource_lease.contrib.proxy import ProxyHolder, probe_proxy
from resource_lease.db.connections import close_connections
from resource_lease.exceptions import LeaseError, LeaseLost, NoResourceAvailable
from resource_lease.holder import ResourceHolder, live_holders
from resource_lease.lease import Lease, acquire
from resource_lease.models import Resource
from tests.dbstats import open_connections

OLD = dt.datetime(1960, 1, 1, tzinfo=dt.UTC)


class Holder(ResourceHolder):
    """A test holder: ``data["valid"] = False`` is invalid, ``data["boom"]`` makes is_valid raise."""

    kind = "h"
    ttl = 1.0
    renew_interval = 0.2

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.losses: list[tuple[int, int, str]] = []
        self.on_lost_called = threading.Event()
        self.broken: set[int] = set()

    def is_valid(self) -> bool:
        resource = self.resource
        assert resource is not None
        if resource.data.get("boom"):
            raise RuntimeError("a bug in is_valid")
        if not resource.data.get("valid", True) or resource.pk in self.broken:
            self.invalid_reason = f"{resource.name} is marked invalid"
            return False
        return True

    def on_lost(self) -> None:
        lease = self.lost_lease
        assert lease is not None
        self.losses.append((lease.resource.pk, lease.fence, self.lost_reason))
        self.on_lost_called.set()
        super().on_lost()


class Searching(Holder):
    """The same through the search/lock steps instead of the engine's acquire."""

    def search(self) -> Any:
        return self.candidates()


@pytest.fixture
def holders() -> Iterator[Callable[..., Any]]:
    """``holders(cls, **kwargs)`` makes a holder that is terminated at the end of the test."""
    made: list[ResourceHolder] = []

    def make(cls: type[ResourceHolder] = Holder, **kwargs: Any) -> Any:
        holder = cls(**kwargs)
        made.append(holder)
        return holder

    yield make
    for holder in made:
        holder.terminate(timeout=30)
        assert not holder.is_alive()


def wait_for(condition: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def state_of(pk: int) -> str:
    return str(pool.with_state(Resource.objects.filter(pk=pk)).values_list("state", flat=True)[0])


# -- bad input ------------------------------------------------------------------------------


class Bare(ResourceHolder):
    def is_valid(self) -> bool:
        return True


BAD_ARGUMENTS = [
    ({}, "kind"),
    ({"kind": ""}, "kind"),
    ({"kind": 5}, "kind"),
    ({"kind": "x" * 101}, "kind"),
    ({"kind": "k", "ttl": 0}, "ttl"),
    ({"kind": "k", "ttl": -1}, "ttl"),
    ({"kind": "k", "ttl": math.nan}, "ttl"),
    ({"kind": "k", "ttl": math.inf}, "ttl"),
    ({"kind": "k", "ttl": True}, "ttl"),
    ({"kind": "k", "ttl": "5"}, "ttl"),
    ({"kind": "k", "ttl": 10, "renew_interval": 0}, "renew_interval"),
    ({"kind": "k", "ttl": 10, "renew_interval": -1}, "renew_interval"),
    ({"kind": "k", "ttl": 10, "renew_interval": "3"}, "renew_interval"),
    ({"kind": "k", "ttl": 10, "renew_interval": math.nan}, "renew_interval"),
    ({"kind": "k", "ttl": 10, "renew_interval": 10}, "renew_interval"),
    ({"kind": "k", "ttl": 10, "renew_interval": 30}, "renew_interval"),
    # trusted for 10 - min(10 * 0.1, 2) = 9 s only: renewing every 9.5 s would always be late
    ({"kind": "k", "ttl": 10, "renew_interval": 9.5}, "renew_interval"),
    ({"kind": "k", "quarantine_seconds": 0}, "quarantine_seconds"),
    ({"kind": "k", "quarantine_seconds": -5}, "quarantine_seconds"),
    ({"kind": "k", "quarantine_seconds": math.inf}, "quarantine_seconds"),
    ({"kind": "k", "holder": ""}, "holder"),
    ({"kind": "k", "holder": 5}, "holder"),
    ({"kind": "k", "holder": "x" * 256}, "holder"),
    ({"kind": "k", "using": "nope"}, "using"),
    ({"kind": "k", "name": ""}, "name"),
]


@pytest.mark.parametrize(
    ("kwargs", "argument"), BAD_ARGUMENTS, ids=[f"{a}-{i}" for i, (_, a) in enumerate(BAD_ARGUMENTS)]
)
def test_bad_constructor_argument_is_a_value_error_naming_it(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        Bare(**kwargs)


BAD_CLASS_ATTRIBUTES = [
    ({"kind": ""}, "kind"),
    ({"kind": "k", "ttl": "60"}, "ttl"),
    ({"kind": "k", "ttl": 10, "renew_interval": 20}, "renew_interval"),
    ({"kind": "k", "quarantine_seconds": -1}, "quarantine_seconds"),
]


@pytest.mark.parametrize(("attributes", "argument"), BAD_CLASS_ATTRIBUTES)
def test_bad_class_attribute_is_a_value_error_naming_it(attributes: dict[str, Any], argument: str) -> None:
    subclass = type("Configured", (Bare,), attributes)
    with pytest.raises(ValueError, match=argument):
        subclass()


def test_defaults_come_from_settings_and_the_constructor_overrides_class_attributes(settings: Any) -> None:
    settings.RESOURCE_LEASE = {"TTL": 12.0, "QUARANTINE_SECONDS": 99.0}
    holder = Bare(kind="k")
    assert (holder.ttl, holder.renew_interval, holder.quarantine_seconds) == (12.0, 4.0, 99.0)
    holder = Holder(ttl=3, renew_interval=1, quarantine_seconds=5, holder="me")
    assert (holder.kind, holder.ttl, holder.renew_interval, holder.quarantine_seconds, holder.holder) == (
        "h",
        3.0,
        1.0,
        5.0,
        "me",
    )
    assert holder.daemon
    assert f":{os.getpid()}:" in Holder().holder


def test_the_base_class_is_abstract() -> None:
    with pytest.raises(TypeError, match="is_valid"):
        ResourceHolder(kind="k")  # type: ignore[abstract]


BAD_CALLS: list[tuple[Callable[[Holder], Any], str]] = [
    (lambda h: h.acquire(timeout=-1), "timeout"),
    (lambda h: h.acquire(timeout="1"), "timeout"),
    (lambda h: h.acquire(timeout=math.nan), "timeout"),
    (lambda h: h.fix(reason=""), "reason"),
    (lambda h: h.fix(reason=5), "reason"),
    (lambda h: h.fix(timeout=-1), "timeout"),
]


def test_bad_call_arguments_are_refused_and_nothing_is_written(make_pool: Any, holders: Any) -> None:
    rows = make_pool("h", 2)
    holder = holders()
    for call, argument in BAD_CALLS:  # one pool for the whole table: a flush per case is slow
        with pytest.raises(ValueError, match=argument):
            call(holder)
    assert holder.lease is None
    assert [(r.fence, r.holder) for r in Resource.objects.order_by("name")] == [(r.fence, r.holder) for r in rows]


# -- acquire ----------------------------------------------------------------------------------


def test_acquire_and_fix_inside_a_transaction_are_refused(make_pool: Any, holders: Any) -> None:
    make_pool("h", 1)
    holder = holders()
    with transaction.atomic():
        with pytest.raises(LeaseError, match="inside an open transaction"):
            holder.acquire(timeout=1)
        with pytest.raises(LeaseError, match="inside an open transaction"):
            holder.fix(timeout=1)
    assert list(Resource.objects.values_list("fence", flat=True)) == [0]


@pytest.mark.parametrize("cls", [Holder, Searching], ids=["engine", "search"])
def test_invalid_resources_are_quarantined_with_a_reason_and_skipped(
    make_pool: Any, holders: Any, cls: type, settings: Any
) -> None:
    # The bad rows are the least recently used, so they are tried first only in that order:
    # acquire() probes free rows at random unless PROBE_REFRESH is 0.
    settings.RESOURCE_LEASE = {"PROBE_REFRESH": 0}
    good = make_pool("h", 1)[0]
    bad = [
        Resource.objects.create(kind="h", name=f"bad-{i}", data={"valid": False}, busy_before=OLD + dt.timedelta(i))
        for i in range(2)
    ]
    # A ttl long enough that the unrenewed lease outlasts the test on a loaded machine (at 1 s,
    # `other` below could take the good resource after it expired).
    holder = holders(cls, quarantine_seconds=300, ttl=30)
    lease = holder.acquire(timeout=10)
    assert holder.holding and not holder.lost
    assert holder.lease is lease and holder.resource.pk == good.pk and holder.fence == lease.fence == 1
    now = pool.database_now()
    for row in Resource.objects.filter(pk__in=[b.pk for b in bad]):
        assert state_of(row.pk) == "quarantined"
        assert row.quarantine_reason == f"{row.name} is marked invalid"
        assert row.grant_token == ""  # released: nobody holds it
        assert dt.timedelta(seconds=250) < row.quarantined_until - now <= dt.timedelta(seconds=300)
        assert row.fence == 1  # granted once, to be checked, and never again

    other = holders(cls)
    with pytest.raises(NoResourceAvailable):
        other.acquire(timeout=0.5)
    assert not other.holding and other.lease is None
    assert sorted(Resource.objects.values_list("fence", flat=True)) == [1, 1, 1]


def test_an_exception_in_is_valid_is_raised_and_quarantines_nothing(make_pool: Any, holders: Any) -> None:
    row = Resource.objects.create(kind="h", name="boom", data={"boom": True})
    holder = holders()
    with pytest.raises(RuntimeError, match="a bug in is_valid"):
        holder.acquire(timeout=5)
    assert not holder.holding and holder.lease is None
    row.refresh_from_db()
    assert state_of(row.pk) == "free" and row.quarantined_until is None and row.fence == 1


@pytest.mark.parametrize("cls", [Holder, Searching], ids=["engine", "search"])
def test_a_kind_with_no_resources_says_so_at_once(make_pool: Any, holders: Any, cls: type) -> None:
    make_pool("other", 1)
    with pytest.raises(NoResourceAvailable, match="no resources of kind 'h'") as caught:
        holders(cls).acquire()
    assert caught.value.exists is False


def test_acquire_times_out_and_returns_the_held_lease_when_called_again(make_pool: Any, holders: Any) -> None:
    make_pool("h", 1)
    first = holders()
    lease = first.acquire(timeout=5)
    assert first.acquire() is lease  # already holding: no second grant
    with pytest.raises(NoResourceAvailable, match="within 0.3s"):
        holders().acquire(timeout=0.3)


class Region(Holder):
    region = "eu"

    def search(self) -> Any:
        return self.candidates().filter(data__region=self.region)


def test_search_narrows_the_pool_and_lock_grants_like_the_engine(make_pool: Any, holders: Any) -> None:
    for i, region in enumerate(["us", "eu", "us", "eu"]):
        Resource.objects.create(kind="h", name=f"{region}-{i}", data={"region": region}, busy_before=OLD)
    eu = [holders(Region), holders(Region)]
    leases = [h.acquire(timeout=5) for h in eu]
    assert sorted(lease.resource.name for lease in leases) == ["eu-1", "eu-3"]
    with pytest.raises(NoResourceAvailable):
        holders(Region).acquire(timeout=0.3)  # the us ones are free, but not ours to take
    assert pool.counts()["h"]["free"] == 2

    lease = leases[0]
    row = Resource.objects.get(pk=lease.resource.pk)
    assert (row.fence, row.holder, row.grant_token) == (1, eu[0].holder, lease.resource.grant_token)
    assert row.grant_token and row.busy_before == lease.expires_at
    assert dt.timedelta(seconds=0.5) < lease.expires_at - pool.database_now() <= dt.timedelta(seconds=1)
    before = lease.expires_at
    assert lease.renew() > before and lease.is_held()
    with lease.fenced():
        pass
    assert lease.release() and state_of(row.pk) == "free"


def test_lock_decides_a_race_for_one_row_by_its_matched_row_count(make_pool: Any, holders: Any) -> None:
    row = make_pool("h", 1)[0]
    contenders = [holders() for _ in range(8)]
    barrier = threading.Barrier(len(contenders))
    results: list[Lease | None] = []

    def contend(holder: Holder) -> None:
        try:
            barrier.wait()
            results.append(holder.lock(row))
        finally:
            close_connections()

    threads = [threading.Thread(target=contend, args=(h,)) for h in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [lease for lease in results if lease is not None]
    assert len(results) == 8 and len(winners) == 1
    row.refresh_from_db()
    assert (row.fence, row.holder) == (1, winners[0].holder) and winners[0].fence == 1
    assert contenders[0].lock(row) is None  # held


def test_lock_refuses_quarantined_disabled_and_other_kinds(make_pool: Any, holders: Any) -> None:
    quarantined, disabled = make_pool("h", 2)
    stranger = make_pool("x", 1)[0]
    pool.quarantine([quarantined], reason="test", seconds=60)
    Resource.objects.filter(pk=disabled.pk).update(enabled=False)
    holder = holders()
    assert holder.lock(quarantined) is None
    assert holder.lock(disabled) is None
    assert holder.lock(stranger) is None
    assert list(Resource.objects.values_list("fence", flat=True)) == [0, 0, 0]


# -- keeping it ------------------------------------------------------------------------------------


def test_keeps_its_lease_across_many_ttls(make_pool: Any, holders: Any) -> None:
    row = make_pool("h", 1)[0]
    # ttl 1.5 s: several renewals in the run, and room for a loaded machine's stall.
    holder = holders(ttl=1.5, renew_interval=0.3)
    lease = holder.acquire(timeout=5)
    first_expiry = lease.expires_at
    holder.start()
    refused = 0
    until = time.monotonic() + 4 * holder.ttl
    while time.monotonic() < until:
        with pytest.raises(NoResourceAvailable):
            acquire("h", ttl=5, timeout=0)
        refused += 1
        holder.check()
        time.sleep(0.05)
    assert refused > 10
    assert holder.holding and not holder.lost and holder.losses == []
    assert holder.lease is lease and holder.fence == 1 and lease.is_held()
    row.refresh_from_db()
    assert row.fence == 1 and row.busy_before > first_expiry + dt.timedelta(seconds=3 * holder.ttl)


def test_a_renewal_slower_than_the_interval_warns(make_pool: Any, holders: Any, caplog: Any) -> None:
    row = make_pool("h", 1)[0]
    holder = holders(ttl=3, renew_interval=0.2)
    holder.acquire(timeout=5)
    holder.start()
    with caplog.at_level(logging.WARNING, logger="resource_lease"):
        # Hold the row's lock (SQLite: the write lock) so the next renewal has to wait.
        with transaction.atomic():
            list(Resource.objects.select_for_update().filter(pk=row.pk))
            Resource.objects.filter(pk=row.pk).update(data={"touched": True})
            time.sleep(0.8)
        wait_for(lambda: "longer than the renew interval" in caplog.text, what="the slow renewal warning")
    assert holder.holding and holder.fence == 1 and holder.losses == []


def test_force_release_is_noticed_on_lost_fires_and_a_fresh_grant_follows(make_pool: Any, holders: Any) -> None:
    row = make_pool("h", 1)[0]
    holder = holders(ttl=1, renew_interval=0.2)
    old = holder.acquire(timeout=5)
    holder.start()
    assert pool.force_release([row]) == 1
    assert holder.on_lost_called.wait(10), "on_lost was not called"
    assert holder.losses[0][:2] == (row.pk, 1) and "refused the renewal" in holder.losses[0][2]
    assert old.lost
    with pytest.raises(LeaseLost):
        old.check()
    # The only resource is free again: the holder is back on it with a higher fence.
    wait_for(lambda: holder.holding, what="the re-acquire")
    assert holder.resource.pk == row.pk and holder.fence == 2 and holder.lease is not old
    assert len(holder.losses) == 1


def test_lost_event_is_set_on_a_loss_and_cleared_once_a_fresh_lease_is_held(make_pool: Any, holders: Any) -> None:
    row = make_pool("h", 1)[0]
    holder = holders(ttl=2, renew_interval=0.3)
    holder.acquire(timeout=5)
    holder.start()
    assert holder.lost is False and not holder.lost_event.is_set()
    pool.force_release([row])
    other = acquire("h", ttl=30, timeout=0)  # the only resource: the holder cannot move on yet
    assert holder.lost_event.wait(10), "the holder's lost_event was not set"
    assert holder.lost is True
    other.release()
    wait_for(lambda: holder.holding, what="the re-acquire")
    assert not holder.lost_event.is_set() and holder.lost is False


def test_renewals_blocked_past_ttl_stop_the_trust_locally_then_on_lost_and_a_fresh_grant(
    make_pool: Any, holders: Any
) -> None:
    row = make_pool("h", 1)[0]
    holder = holders(ttl=1, renew_interval=0.2)
    old = holder.acquire(timeout=5)
    holder.start()
    with transaction.atomic():
        # The database cannot answer the renewal (row lock held), yet the holder stops
        # trusting the lease at its local deadline.
        list(Resource.objects.select_for_update().filter(pk=row.pk))
        Resource.objects.filter(pk=row.pk).update(data={"touched": True})
        wait_for(lambda: holder.lost, timeout=5, what="the local deadline")
        assert not holder.holding
        with pytest.raises(LeaseLost):
            holder.check()
    assert holder.on_lost_called.wait(10), "on_lost was not called"
    wait_for(lambda: holder.holding, what="the re-acquire")
    assert holder.resource.pk == row.pk and holder.fence > old.fence
    assert not holder.lost


def test_close_stops_the_threads_re_acquire_for_good(make_pool: Any, holders: Any) -> None:
    row = make_pool("h", 1)[0]
    holder = holders(ttl=2, renew_interval=0.8)
    holder.acquire(timeout=5)
    holder.start()
    pool.force_release([row])
    other = acquire("h", ttl=30, timeout=0)  # before the holder's next renewal notices
    assert holder.on_lost_called.wait(10)
    assert holder.lost and not holder.holding  # and it keeps trying to get one
    holder.close()
    other.release()
    time.sleep(1.5)  # longer than the largest backoff pause of an acquire still going on
    assert holder.lease is None and not holder.lost and state_of(row.pk) == "free"
    # At most the one attempt that was already in flight when close() came may have been
    # granted (then let go at once, see the tests below); no attempt after it.
    fence = Resource.objects.get(pk=row.pk).fence
    assert fence in (other.fence, other.fence + 1)
    time.sleep(1.5)
    assert Resource.objects.get(pk=row.pk).fence == fence and state_of(row.pk) == "free"
    assert holder.is_alive()


class _ReportsStops:
    """Test mixin for a holder: ``closed`` is set when a close() (terminate()'s too) has
    returned, ``loss_handled`` when the thread's handling of a loss (its re-acquire) is over."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # type: ignore[call-arg]
        self.closed = threading.Event()
        self.loss_handled = threading.Event()

    def close(self) -> bool:
        released: bool = super().close()  # type: ignore[misc]
        self.closed.set()
        return released

    def _handle_loss(self, lease: Lease, validated: bool, reason: str) -> None:
        try:
            super()._handle_loss(lease, validated, reason)  # type: ignore[misc]
        finally:
            self.loss_handled.set()


def _paused_after_grant(cls: type[Holder]) -> type[Holder]:
    """``cls`` whose thread, re-acquiring after a loss, stops right after the grant statement
    returned a fresh lease and before the holder stores it, until ``go_on`` is set."""

    class PausedAfterGrant(_ReportsStops, cls):  # type: ignore[valid-type,misc]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.granted = threading.Event()  # the thread holds a grant nobody has seen yet
            self.go_on = threading.Event()
            self.paused_grant: Lease | None = None
            self.checked: list[int] = []  # fences is_valid() was asked about

        def is_valid(self) -> bool:
            lease = self.lease
            self.checked.append(-1 if lease is None else lease.fence)
            return super().is_valid()

        def _grab(self, *, give_up_if_empty: bool) -> Lease | None:
            lease = super()._grab(give_up_if_empty=give_up_if_empty)
            if lease is not None and threading.current_thread() is self and not self.granted.is_set():
                self.paused_grant = lease
                self.granted.set()
                assert self.go_on.wait(30), "the test never let the thread go on"
            return lease

    return PausedAfterGrant


@pytest.mark.parametrize("stop", ["close", "terminate"])
@pytest.mark.parametrize("cls", [Holder, Searching], ids=["engine", "search"])
def test_close_between_the_threads_re_acquire_grant_and_its_storing_leaves_nothing_held(
    make_pool: Any, holders: Any, cls: type[Holder], stop: str
) -> None:
    row = make_pool("h", 1)[0]
    holder = holders(_paused_after_grant(cls), ttl=2, renew_interval=0.2)
    old = holder.acquire(timeout=5)
    holder.start()
    pool.force_release([row])  # the next renewal is refused: on_lost, then a re-acquire
    assert holder.granted.wait(15), "the thread never re-acquired"
    fresh = holder.paused_grant
    assert fresh is not None and fresh.fence == old.fence + 1
    # The window: the database has granted the row to this holder, the holder does not know.
    assert holder.lease is None and state_of(row.pk) == "held"
    assert Resource.objects.get(pk=row.pk).holder == holder.holder

    stopper = None
    if stop == "close":
        assert holder.close() is False  # nothing stored yet, so nothing of its own to release
    else:  # terminate() from another thread: it joins the thread, which is paused
        stopper = threading.Thread(target=holder.terminate, kwargs={"timeout": 30})
        stopper.start()
        assert holder.closed.wait(10), "terminate() never got through close()"
    holder.go_on.set()
    assert holder.loss_handled.wait(15), "the thread's re-acquire never ended"
    if stopper is not None:
        stopper.join(30)
        assert not stopper.is_alive()
    else:
        assert holder.close() is False and holder.close() is False  # idempotent
        holder.terminate(timeout=30)
    assert not holder.is_alive()

    # The grant made in the window was released, by the database's clock, not left to expire.
    assert fresh.released
    assert holder.checked == [old.fence]  # a closed holder does not go on to check the grant
    assert holder.lease is None and not holder.holding and not holder.lost
    final = Resource.objects.get(pk=row.pk)
    assert state_of(row.pk) == "free" and final.grant_token == ""
    assert final.fence == fresh.fence  # and nothing was granted after it
    assert holder.close() is False


def test_the_local_deadline_holds_without_the_thread(make_pool: Any, holders: Any) -> None:
    make_pool("h", 1)
    holder = holders(ttl=0.5, renew_interval=0.1)
    lease = holder.acquire(timeout=5)
    assert holder.check() is lease
    wait_for(lambda: holder.lost, timeout=3, what="the local deadline")
    with pytest.raises(LeaseLost, match="local deadline"):
        holder.check()
    assert not holder.holding and lease.lost


def test_fix_keeps_a_valid_resource_and_replaces_a_broken_one(make_pool: Any, holders: Any) -> None:
    make_pool("h", 3)
    holder = holders(quarantine_seconds=60)
    holder.acquire(timeout=5)
    holder.start()
    first = holder.resource.pk
    assert holder.fix() is True and holder.resource.pk == first

    holder.broken.add(first)
    assert holder.fix() is False
    second = holder.resource.pk
    assert second != first and holder.holding
    broken = Resource.objects.get(pk=first)
    assert broken.quarantine_reason == f"{broken.name} is marked invalid" and state_of(first) == "quarantined"

    assert holder.fix(reason="banned by the target site") is False
    assert holder.resource.pk not in (first, second)
    assert Resource.objects.get(pk=second).quarantine_reason == "banned by the target site"
    assert pool.counts()["h"]["quarantined"] == 2
    with pytest.raises(NoResourceAvailable):
        holder.fix(reason="also banned", timeout=0.3)


# -- letting go -----------------------------------------------------------------------------------


def test_close_and_terminate_release_and_are_idempotent(make_pool: Any, holders: Any) -> None:
    row = make_pool("h", 1)[0]
    holder = holders()
    lease = holder.acquire(timeout=5)
    holder.start()
    assert holder.close() is True and holder.close() is False
    assert state_of(row.pk) == "free" and lease.released and holder.lease is None
    assert not holder.holding and not holder.lost
    assert holder.is_alive()  # closed, not terminated: idle, ready for another acquire
    holder.acquire(timeout=5)
    assert holder.fence == 2
    holder.terminate()
    holder.terminate()
    assert not holder.is_alive() and state_of(row.pk) == "free" and holder not in live_holders()
    with pytest.raises(LeaseError, match="terminated"):
        holder.acquire()


def test_the_context_manager_terminates_on_error(make_pool: Any) -> None:
    row = make_pool("h", 1)[0]
    with pytest.raises(KeyError), Holder() as holder:
        assert holder.holding and holder.is_alive()
        raise KeyError("work failed")
    assert not holder.is_alive() and state_of(row.pk) == "free"


def _renewed_once(cls: type[Holder]) -> type[Holder]:
    class RenewedOnce(cls):  # type: ignore[valid-type,misc]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.renewed = threading.Event()
            self.first_expiry: dt.datetime | None = None

        def keep_occupation(self) -> float:
            delay = super().keep_occupation()
            lease = self.lease
            if lease is not None and lease.expires_at != self.first_expiry:
                self.renewed.set()
            return delay

    return RenewedOnce


def test_no_thread_or_connection_leak_after_1000_acquire_terminate_cycles(make_pool: Any) -> None:
    make_pool("h", 2)
    holder_class = _renewed_once(Holder)

    def cycle(renew: bool) -> None:
        holder = holder_class(ttl=2, renew_interval=0.001 if renew else 1)
        lease = holder.acquire(timeout=5)
        holder.first_expiry = lease.expires_at
        holder.start()
        if renew:  # the thread has opened its own connection, which it must close
            assert holder.renewed.wait(10), "the thread never renewed"
        holder.terminate(timeout=10)
        assert not holder.is_alive()

    # Warm up: this thread's own connections open, and SQLite keeps (and reuses) the file
    # descriptor of a connection closed while another one held a lock.
    cycle(renew=True)
    cycle(renew=False)
    time.sleep(0.5)  # the server lets go of the warm-up thread's connection
    threads, connections = set(threading.enumerate()), open_connections()
    # Every tenth thread renews over a server connection of its own (~30 ms each on
    # PostgreSQL); the others are terminated while they wait for their first renewal.
    for i in range(1000):
        cycle(renew=i % 10 == 0)
    wait_for(lambda: open_connections() <= connections, timeout=10, what="connections to close")
    # Compared as sets: a thread of an earlier test may end meanwhile, none may be added.
    assert [t.name for t in threading.enumerate() if t not in threads] == []
    assert pool.counts()["h"]["free"] == 2
    assert live_holders() == []


# -- in other processes ----------------------------------------------------------------------------


class Events:
    """JSON lines from a worker's stdout, read by a thread, waited for by event name."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.queue.put(json.loads(line))

    def next(self, event: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self.queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {event!r} from the worker within {timeout}s") from None
            if item["event"] == event:
                return item


def start_worker(spawn_worker: Any, kind: str, ttl: float, renew_interval: float) -> tuple[Any, Events]:
    proc = spawn_worker("tests.procs.holder_worker", kind, str(ttl), str(renew_interval), stdout=subprocess.PIPE)
    return proc, Events(proc)


def wait_renewed(pk: int) -> Resource:
    def renewed() -> Resource | None:
        row = Resource.objects.get(pk=pk)
        return row if row.renewed_at is not None and row.renewed_at > row.acquired_at else None

    return wait_for(renewed, what="a renewal by the worker")


@pytest.mark.faults
def test_sigkill_frees_the_resource_after_ttl_and_not_before(make_pool: Any, spawn_worker: Any) -> None:
    row = make_pool("h", 1)[0]
    proc, events = start_worker(spawn_worker, "h", 1.5, 0.3)
    held = events.next("acquired")
    wait_renewed(row.pk)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    expiry = Resource.objects.get(pk=row.pk).busy_before  # nobody renews it any more

    refused_while_live = 0
    deadline = time.monotonic() + 20
    while True:
        try:
            lease = acquire("h", ttl=5, timeout=0)
            break
        except NoResourceAvailable:
            if pool.database_now() < expiry:
                refused_while_live += 1
        assert time.monotonic() < deadline, "the killed holder's resource never came free"
        time.sleep(0.02)
    assert refused_while_live >= 1
    assert lease.resource.acquired_at >= expiry  # granted only once the lease had run out
    assert lease.resource.took_over and lease.resource.previous_holder == held["holder"]
    assert lease.fence == held["fence"] + 1
    lease.release()


@pytest.mark.faults
def test_a_paused_holder_notices_on_resume_and_moves_to_another_resource(
    make_pool: Any, spawn_worker: Any, holders: Any
) -> None:
    make_pool("h", 2)
    proc, events = start_worker(spawn_worker, "h", 1.0, 0.2)
    first = events.next("acquired")
    wait_renewed(first["pk"])
    proc.send_signal(signal.SIGSTOP)
    try:

        class Takeover(Holder):
            def search(self) -> Any:
                return self.candidates().filter(pk=first["pk"])

        # While it is paused its lease runs out, and another holder takes the resource.
        taker = holders(Takeover, ttl=5, renew_interval=1)
        taken = taker.acquire(timeout=20)
        taker.start()
        assert taken.resource.pk == first["pk"] and taken.fence == first["fence"] + 1
        assert taken.resource.took_over and taken.resource.previous_holder == first["holder"]
    finally:
        proc.send_signal(signal.SIGCONT)

    lost = events.next("lost")
    assert (lost["pk"], lost["fence"]) == (first["pk"], first["fence"])
    second = events.next("acquired")
    assert second["pk"] != first["pk"]
    assert events.next("fenced")["ok"] is False  # the old lease's fenced write is refused
    assert taken.is_held() and taker.fence == first["fence"] + 1  # untouched by the resumed one


@pytest.mark.faults
def test_sigterm_with_the_handler_installed_releases_at_once(make_pool: Any, spawn_worker: Any) -> None:
    row = make_pool("h", 1)[0]
    proc, events = start_worker(spawn_worker, "h", 30, 10)
    events.next("acquired")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    row.refresh_from_db()
    assert state_of(row.pk) == "free" and row.grant_token == "" and row.released_at is not None


# -- ProxyHolder: real proxies on 127.0.0.1, some of them broken -------------------------------------


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def url_of(server: ThreadingHTTPServer, credentials: str = "") -> str:
    host, port = server.server_address[:2]
    return f"http://{credentials}{host!s}:{port}"


@pytest.fixture
def proxies() -> Iterator[dict[str, Any]]:
    """A target site, two working proxies (one with credentials) and broken ones."""
    hits: list[str] = []
    release = threading.Event()

    class Target(QuietHandler):
        def do_GET(self) -> None:
            hits.append(self.headers.get("X-Proxied-By", "directly"))
            body = b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def relay(name: str, credentials: str | None = None) -> type[BaseHTTPRequestHandler]:
        class Relay(QuietHandler):
            def do_GET(self) -> None:
                if credentials is not None:
                    expected = "Basic " + base64.b64encode(credentials.encode()).decode()
                    if self.headers.get("Proxy-Authorization") != expected:
                        self.send_response(407, "Proxy Authentication Required")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                target = urlsplit(self.path)  # a proxy is sent the absolute URL
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=5)
                conn.request("GET", target.path or "/", headers={"X-Proxied-By": name})
                answer = conn.getresponse()
                body = answer.read()
                conn.close()
                self.send_response(answer.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Relay

    class BadGateway(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(502, "Bad Gateway")
            self.send_header("Content-Length", "0")
            self.end_headers()

    class Hang(QuietHandler):
        def do_GET(self) -> None:
            release.wait(30)  # never answers within the probe's timeout

    servers = {
        "target": serve(Target),
        "good1": serve(relay("good1", credentials="user:secret")),
        "good2": serve(relay("good2")),
        "bad_gateway": serve(BadGateway),
        "hang": serve(Hang),
    }
    with socket.socket() as sock:  # a port nobody listens on: connections are refused
        sock.bind(("127.0.0.1", 0))
        refused_port = sock.getsockname()[1]
    yield {"servers": servers, "hits": hits, "refused_port": refused_port}
    release.set()
    for server in servers.values():
        server.shutdown()
        server.server_close()


def test_proxy_holder_holds_only_working_proxies_and_quarantines_broken_ones(
    make_pool: Any, holders: Any, proxies: dict[str, Any]
) -> None:
    servers = proxies["servers"]
    good = {
        url_of(servers["good1"], "user:secret@"),
        url_of(servers["good2"]).removeprefix("http://"),  # bare host:port is a proxy too
    }
    broken = {
        "refused": (f"http://127.0.0.1:{proxies['refused_port']}", "refused"),
        "bad-gateway": (url_of(servers["bad_gateway"]), "HTTP 502 Bad Gateway"),
        "hang": (url_of(servers["hang"]), "timed out"),
        "wrong-password": (url_of(servers["good1"], "user:wrong@"), "HTTP 407"),
        "no-url": (None, 'no proxy URL in data["url"]'),
    }
    # Broken ones sort first (least recently used), so every one of them is probed.
    for i, (name, (url, _)) in enumerate(broken.items()):
        data = {} if url is None else {"url": url}
        Resource.objects.create(kind="proxy", name=name, data=data, busy_before=OLD + dt.timedelta(days=i))
    for i, url in enumerate(sorted(good)):
        Resource.objects.create(kind="proxy", name=f"good-{i}", data={"url": url})

    class Crawler(ProxyHolder):
        probe_timeout = 0.5

    target = url_of(servers["target"]) + "/probe"
    first, second = (holders(Crawler, probe_url=target, ttl=10, quarantine_seconds=60) for _ in range(2))
    first.acquire(timeout=30)
    second.acquire(timeout=30)
    assert {first.proxy_url, second.proxy_url} == good
    assert first.holding and second.holding
    assert sorted(set(proxies["hits"])) == ["good1", "good2"]  # really fetched through them
    with pytest.raises(NoResourceAvailable):
        holders(Crawler, probe_url=target).acquire(timeout=0.3)

    for name, (_, reason) in broken.items():
        row = Resource.objects.get(kind="proxy", name=name)
        assert state_of(row.pk) == "quarantined", name
        assert reason in row.quarantine_reason, (name, row.quarantine_reason)
        assert "secret" not in row.quarantine_reason and "wrong" not in row.quarantine_reason
    assert pool.counts()["proxy"] == {
        "free": 0,
        "held": 2,
        "expired": 0,
        "quarantined": 5,
        "disabled": 0,
        "total": 7,
    }


@pytest.mark.parametrize("stop", ["close", "terminate"])
def test_close_while_the_threads_re_acquire_checks_a_working_proxy_does_not_quarantine_it(
    make_pool: Any, holders: Any, proxies: dict[str, Any], stop: str
) -> None:
    servers = proxies["servers"]
    row = Resource.objects.create(kind="proxy", name="good", data={"url": url_of(servers["good2"])})

    class PausedCheck(_ReportsStops, ProxyHolder):
        """The thread's is_valid() waits for ``go_on`` before it looks at the candidate."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.checking, self.go_on = threading.Event(), threading.Event()

        def is_valid(self) -> bool:
            if threading.current_thread() is self:
                self.checking.set()
                assert self.go_on.wait(30), "the test never let the thread go on"
            return super().is_valid()

    holder = holders(PausedCheck, probe_url=url_of(servers["target"]) + "/probe", ttl=2, renew_interval=0.2)
    old = holder.acquire(timeout=10)
    holder.start()
    pool.force_release([row])
    assert holder.checking.wait(15), "the thread never re-acquired"
    candidate = holder.lease
    assert candidate is not None and candidate.fence == old.fence + 1 and not holder.holding

    stopper = None
    if stop == "close":
        assert holder.close() is True  # the candidate was stored: close() releases it
    else:
        stopper = threading.Thread(target=holder.terminate, kwargs={"timeout": 30})
        stopper.start()
        assert holder.closed.wait(10), "terminate() never got through close()"
    holder.go_on.set()  # is_valid() now finds no resource: that is no verdict on the proxy
    assert holder.loss_handled.wait(15), "the thread's re-acquire never ended"
    if stopper is not None:
        stopper.join(30)
    else:
        holder.terminate(timeout=30)
    assert not holder.is_alive()

    final = Resource.objects.get(pk=row.pk)
    assert (final.quarantined_until, final.quarantine_reason) == (None, ""), final.quarantine_reason
    assert state_of(row.pk) == "free" and final.fence == candidate.fence
    assert holder.lease is None and holder.close() is False


def _call_in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Start ``call`` in a thread of its own; the list gets its result or the exception it
    raised. The thread closes its own connections (the engine's and Django's) at the end."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # noqa: BLE001  (the outcome is what the test checks)
            outcome.append(exc)
        finally:
            close_connections()
            django_connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_a_candidate_lost_while_is_valid_checks_it_is_not_quarantined(
    make_pool: Any, holders: Any, proxies: dict[str, Any]
) -> None:
    """acquire() (caller's thread) asks is_valid() of a fresh candidate while the holder's
    thread, renewing it, finds it force-released and drops it: is_valid() then sees no
    resource. That is no verdict on the proxy: it is not quarantined, and acquire() goes on to
    a fresh grant."""
    servers = proxies["servers"]
    row = Resource.objects.create(kind="proxy", name="good", data={"url": url_of(servers["good2"])})

    class PausedOnce(ProxyHolder):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.checking, self.go_on, self.paused = threading.Event(), threading.Event(), False

        def is_valid(self) -> bool:
            if not self.paused and threading.current_thread() is not self:
                self.paused = True
                self.checking.set()
                assert self.go_on.wait(30), "the test never let acquire() go on"
            return super().is_valid()

    holder = holders(PausedOnce, probe_url=url_of(servers["target"]) + "/probe", ttl=2, renew_interval=0.1)
    holder.start()  # its thread renews the candidate while it is being checked
    acquirer, got = _call_in_thread(lambda: holder.acquire(timeout=20))
    assert holder.checking.wait(15), "acquire() never asked is_valid()"
    first = holder.lease
    assert first is not None and first.fence == 1
    assert pool.force_release([row]) == 1
    wait_for(lambda: holder.lease is None, timeout=10, what="the thread dropping the lost candidate")
    holder.go_on.set()
    acquirer.join(30)
    final = Resource.objects.get(pk=row.pk)
    assert (final.quarantined_until, final.quarantine_reason) == (None, ""), final.quarantine_reason
    assert len(got) == 1 and got[0].resource.pk == row.pk and got[0].fence == 2 and holder.holding


def test_close_while_fix_checks_a_working_proxy_neither_quarantines_it_nor_acquires_again(
    make_pool: Any, holders: Any, proxies: dict[str, Any]
) -> None:
    """fix() asks is_valid() of the held proxy; close() from another thread lands meanwhile, so
    is_valid() finds no resource. That is no verdict: nothing is quarantined, and fix() stops
    (cancelled) instead of acquiring a fresh resource for a holder that was just closed."""
    servers = proxies["servers"]
    rows = [
        Resource.objects.create(kind="proxy", name=f"good{i}", data={"url": url_of(servers["good2"])}) for i in range(2)
    ]

    class PausedCheck(ProxyHolder):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.pause_next, self.checking, self.go_on = False, threading.Event(), threading.Event()

        def is_valid(self) -> bool:
            if self.pause_next:
                self.checking.set()
                assert self.go_on.wait(30), "the test never let fix() go on"
            return super().is_valid()

    holder = holders(PausedCheck, probe_url=url_of(servers["target"]) + "/probe", ttl=30, renew_interval=5)
    held = holder.acquire(timeout=10)
    holder.pause_next = True
    fixer, outcome = _call_in_thread(lambda: holder.fix(timeout=5))
    assert holder.checking.wait(15), "fix() never asked is_valid()"
    assert holder.close() is True
    holder.go_on.set()
    fixer.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], NoResourceAvailable), outcome
    assert "closed" in str(outcome[0])
    for row in rows:
        final = Resource.objects.get(pk=row.pk)
        assert (final.quarantined_until, final.quarantine_reason) == (None, ""), final.quarantine_reason
        assert state_of(row.pk) == "free"
    assert Resource.objects.get(pk=held.resource.pk).fence == held.fence  # nothing granted since
    assert sum(Resource.objects.get(pk=row.pk).fence for row in rows) == held.fence  # no fresh grant
    assert holder.lease is None


def test_probe_proxy_names_what_it_cannot_probe() -> None:
    reason = probe_proxy("socks5://u:p@127.0.0.1:1080", "http://example.com/", timeout=0.5)
    assert reason is not None and "socks5://127.0.0.1:1080" in reason and "u:p" not in reason


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({}, "probe_url"),
        ({"probe_url": ""}, "probe_url"),
        ({"probe_url": "ftp://example.com/"}, "probe_url"),
        ({"probe_url": "http://"}, "probe_url"),
        ({"probe_url": "http://example.com/", "probe_timeout": 0}, "probe_timeout"),
        ({"probe_url": "http://example.com/", "probe_timeout": "1"}, "probe_timeout"),
    ],
)
def test_proxy_holder_bad_arguments(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        ProxyHolder(**kwargs)
