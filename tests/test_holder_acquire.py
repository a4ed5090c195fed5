"""ResourceHolder.acquire() and its search/lock steps: one free resource of its kind, granted by
the database, never inside an open transaction."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import transaction

from resource_lease import pool
from resource_lease.db.connections import close_connections
from resource_lease.exceptions import LeaseError, NoResourceAvailable
from resource_lease.lease import Lease
from resource_lease.models import Resource
from tests.holder_helpers import OLD, Holder, Searching, state_of


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
    asked = pool.database_now()
    leases = [h.acquire(timeout=5) for h in eu]
    granted = pool.database_now()
    assert sorted(lease.resource.name for lease in leases) == ["eu-1", "eu-3"]
    with pytest.raises(NoResourceAvailable):
        holders(Region).acquire(timeout=0.3)  # the us ones are free, but not ours to take
    assert pool.counts()["h"]["free"] == 2

    lease = leases[0]
    row = Resource.objects.get(pk=lease.resource.pk)
    assert (row.fence, row.holder, row.grant_token) == (1, eu[0].holder, lease.resource.grant_token)
    assert row.grant_token and row.busy_before == lease.expires_at
    # the ttl counted by the database's clock from the grant (bounds, not a timing: a slow CI
    # machine may spend most of the second before this line)
    assert asked + dt.timedelta(seconds=1) <= lease.expires_at <= granted + dt.timedelta(seconds=1)
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
