"""Invalid resources: is_valid() says no (on acquire, or asked again by fix()), the resource is
quarantined with the reason, and the holder moves on to another."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from resource_lease import pool
from resource_lease.exceptions import NoResourceAvailable
from resource_lease.models import Resource
from tests.holder_helpers import OLD, Holder, Searching, state_of


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
