"""Keeping the lease: renewed across many ttls; a loss (a refused renewal, the local deadline)
noticed, reported through on_lost() and lost_event, and followed by a fresh grant."""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

import pytest
from django.db import transaction

from resource_lease import pool
from resource_lease.exceptions import LeaseLost, NoResourceAvailable
from resource_lease.lease import acquire
from resource_lease.models import Resource
from tests.holder_helpers import wait_for


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


def test_the_local_deadline_holds_without_the_thread(make_pool: Any, holders: Any) -> None:
    make_pool("h", 1)
    holder = holders(ttl=0.5, renew_interval=0.1)
    lease = holder.acquire(timeout=5)
    assert holder.check() is lease
    wait_for(lambda: holder.lost, timeout=3, what="the local deadline")
    with pytest.raises(LeaseLost, match="local deadline"):
        holder.check()
    assert not holder.holding and lease.lost
