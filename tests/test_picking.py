"""acquire()'s probe of a sampled free id: never a double grant, operators' changes count at once.

The probe is a hint: the row it names is granted by the same conditional UPDATE as any grant
and read back from the database. These tests race real processes on probes (with a negative
control: a probe that trusts its sample), and check that a quarantine, a disabled row and a
changed payload count from the next acquire, and a new row within ``PROBE_REFRESH``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from resource_lease import acquire, pool
from resource_lease.db.connections import lease_connection
from resource_lease.models import Resource
from tests.ledger import check

WORKERS = 6
RESOURCES = 12  # more than the workers: most probes find their row free


def race(spawn_worker: Any, make_pool: Any, tmp_path: Path, *, trusting: bool) -> tuple[Any, int, int]:
    make_pool("probe", RESOURCES)
    args = ["--kind", "probe", "--dir", str(tmp_path), "--seconds", "3", *(["--trusting"] if trusting else [])]
    procs = [spawn_worker("tests.procs.probe_race", *args, stdout=-1) for _ in range(WORKERS)]
    probes = hits = 0
    for proc in procs:
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0
        counts = json.loads(out.strip().splitlines()[-1])
        probes, hits = probes + counts["probes"], hits + counts["hits"]
    return check(tmp_path), probes, hits


def test_racing_probes_never_grant_one_row_twice(spawn_worker: Any, make_pool: Any, tmp_path: Path) -> None:
    verdict, probes, hits = race(spawn_worker, make_pool, tmp_path, trusting=False)
    print(f"probes: {verdict.summary()} probes={probes} hits={hits}")
    assert verdict.grants >= 30, "too few grants for the check to mean anything"
    assert hits >= verdict.grants // 2, "the grants did not come from probes: this tested the scan"
    assert verdict.violations == 0, verdict.summary()


def test_negative_control_a_probe_that_trusts_its_sample_is_caught(
    spawn_worker: Any, make_pool: Any, tmp_path: Path
) -> None:
    verdict, probes, hits = race(spawn_worker, make_pool, tmp_path, trusting=True)
    print(f"negative control: {verdict.summary()} probes={probes} hits={hits}")
    assert verdict.grants >= 30
    assert verdict.violations > 0, "the checker did not notice probes that trust a stale sample"


def _sampled(kind: str) -> list[int]:
    return list(lease_connection().picker.kinds[kind].ids)


def test_a_quarantined_or_disabled_row_in_the_sample_is_not_granted(make_pool: Any) -> None:
    rows = make_pool("op", 4)
    acquire("op", ttl=30).release()  # loads this thread's sample: all four rows
    assert sorted(_sampled("op")) == sorted(r.pk for r in rows)
    pool.quarantine([rows[0].pk], reason="operator says so", seconds=600)
    Resource.objects.filter(pk=rows[1].pk).update(enabled=False)
    granted = set()
    for _ in range(40):  # well inside PROBE_REFRESH (1 s): the sample still names both
        lease = acquire("op", ttl=30)
        granted.add(lease.resource.pk)
        lease.release()
    assert granted == {rows[2].pk, rows[3].pk}


def test_a_changed_payload_is_returned_within_one_refresh(make_pool: Any, settings: Any) -> None:
    """PostgreSQL and SQLite return the row as granted (so at once); MySQL builds it from the
    sample, which is read again after PROBE_REFRESH."""
    settings.RESOURCE_LEASE = {"PROBE_REFRESH": 0.3}
    row = make_pool("url", 1)[0]
    acquire("url", ttl=30).release()
    Resource.objects.filter(pk=row.pk).update(data={"url": "http://10.9.9.9:3128"}, name="moved")
    time.sleep(0.35)
    lease = acquire("url", ttl=30)
    assert (lease.resource.name, lease.resource.data) == ("moved", {"url": "http://10.9.9.9:3128"})
    lease.release()


def test_the_granted_row_is_the_database_row(make_pool: Any) -> None:
    """Field for field, including the expiry and times by the database's clock, and a take-over
    with its previous holder."""
    make_pool("exact", 3)
    acquire("exact", ttl=30).release()  # load the sample
    for ttl in (7.25, 30, 0.2):
        lease = acquire("exact", ttl=ttl, holder=f"h-{ttl}")
        row = Resource.objects.get(pk=lease.resource.pk)
        fields = [f.attname for f in Resource._meta.concrete_fields]
        assert [getattr(lease.resource, f) for f in fields] == [getattr(row, f) for f in fields]
        assert lease.expires_at == row.busy_before and lease.fence == row.fence
        if ttl != 0.2:
            lease.release()
    Resource.objects.filter(kind="exact").exclude(holder="h-0.2").update(enabled=False)
    time.sleep(0.25)  # the unreleased 0.2 s lease expires
    taken = acquire("exact", ttl=30, holder="next")
    row = Resource.objects.get(pk=taken.resource.pk)
    assert taken.resource.took_over and taken.resource.previous_holder == "h-0.2" == row.previous_holder
    assert taken.expires_at == row.busy_before and taken.fence == row.fence
    assert lease_connection().picker.probe_hits >= 4


def test_the_clock_bits_unfold_only_near_the_estimate() -> None:
    """MySQL's probe returns the low 24 bits of the database's clock (us); the rest comes from
    an estimate. Within 4 s of the truth it is exact; beyond, the grant reads the row back."""
    import datetime as dt

    from resource_lease.db.mysql import _unfold

    truth = dt.datetime(2026, 11, 25, 3, 21, 12, 187369)
    us = round((truth - dt.datetime(1970, 1, 1)).total_seconds() * 1_000_000)
    low = us & ((1 << 24) - 1)
    for off in (-3.9, -0.5, 0, 0.001, 2.5, 3.9):
        estimate = truth.replace(tzinfo=dt.UTC) + dt.timedelta(seconds=off)
        assert _unfold(low, estimate) == truth
    for off in (-9.0, 4.5, 12.0):
        assert _unfold(low, truth.replace(tzinfo=dt.UTC) + dt.timedelta(seconds=off)) is None


def test_a_new_row_is_granted_at_once_and_probed_after_one_refresh(make_pool: Any, settings: Any) -> None:
    settings.RESOURCE_LEASE = {"PROBE_REFRESH": 0.3}
    old = make_pool("grow", 2)
    held = [acquire("grow", ttl=30) for _ in old]  # the sample is loaded, then every row taken
    new = Resource.objects.create(kind="grow", name="grow-new", data={})
    assert new.pk not in _sampled("grow")
    lease = acquire("grow", ttl=30)  # the probe's sample is stale: the scan finds the new row
    assert lease.resource.pk == new.pk
    for one in [lease, *held]:
        one.release()
    time.sleep(0.35)
    acquire("grow", ttl=30).release()
    assert new.pk in _sampled("grow")


def test_probe_refresh_zero_scans_least_recently_used_first(make_pool: Any, settings: Any) -> None:
    settings.RESOURCE_LEASE = {"PROBE_REFRESH": 0}
    rows = make_pool("lru", 3)
    order = []
    for _ in range(6):
        lease = acquire("lru", ttl=30)
        order.append(lease.resource.pk)
        lease.release()
        time.sleep(0.005)  # SQLite's clock in busy_before has milliseconds: no ties
    assert order[:3] == order[3:] and sorted(order[:3]) == sorted(r.pk for r in rows)
    assert lease_connection().picker.kinds["lru"].ids == []
