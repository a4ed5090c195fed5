"""Waits and time-outs per kind across every process: grant events carry how long their
caller waited, a caller that gave up leaves a ``timed_out`` event, and the pool overview shows
them per kind (``resource_lease.wait_stats``; docs/operations.md#metrics)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from resource_lease import NoResourceAvailable, acquire, lock
from resource_lease.models import LeaseEvent, Resource
from resource_lease.wait_stats import quantile, wait_stats

pytestmark = pytest.mark.django_db(transaction=True)


def test_quantiles_are_read_off_the_buckets() -> None:
    cumulative = [(0.01, 50), (0.1, 90), (1.0, 99), (10.0, 100)]
    assert quantile(0.5, cumulative, 100) == 0.01
    assert quantile(0.95, cumulative, 100) == 1.0
    assert quantile(0.5, [(0.01, 0), (0.1, 0)], 3) == float("inf"), "above the last bound"
    assert quantile(0.5, cumulative, 0) is None


def waits_of_a_busy_pool(make_pool: Callable[..., list[Resource]], audit_on: Callable[..., Any]) -> Any:
    writer = audit_on(AUDIT_FLUSH_INTERVAL=60)
    make_pool("w-pool", 2)
    for _ in range(3):
        acquire("w-pool", ttl=30).release()
    held = [acquire("w-pool", ttl=30, holder=f"crawler-{i}") for i in range(2)]
    with pytest.raises(NoResourceAvailable):
        acquire("w-pool", ttl=30, timeout=0.2, holder="late-crawler")
    for lease in held:
        lease.release()
    with lock("w-coordination", ttl=30):
        pass
    writer.flush()
    return writer


def test_grants_carry_their_wait_and_a_timeout_is_an_event(
    make_pool: Callable[..., list[Resource]], audit_on: Callable[..., Any]
) -> None:
    waits_of_a_busy_pool(make_pool, audit_on)
    grants = LeaseEvent.objects.filter(kind="w-pool", event=LeaseEvent.GRANTED)
    assert grants.count() == 5 and not grants.filter(waited__isnull=True).exists()
    (timeout,) = LeaseEvent.objects.filter(event=LeaseEvent.TIMED_OUT)
    assert (timeout.kind, timeout.holder) == ("w-pool", "late-crawler") and timeout.waited >= 0.2


def test_wait_stats_per_pool_kind(make_pool: Callable[..., list[Resource]], audit_on: Callable[..., Any]) -> None:
    waits_of_a_busy_pool(make_pool, audit_on)
    stats = wait_stats("default")
    assert list(stats) == ["w-pool"], "coordination kinds are not pools"
    row = stats["w-pool"]
    assert {k: row[k] for k in ("granted", "taken_over", "timed_out", "measured")} == {
        "granted": 5,
        "taken_over": 0,
        "timed_out": 1,
        "measured": 5,
    }
    assert row["median"] is not None and row["median"] <= row["p95"]
    assert 0 <= row["longest"] <= row["p95"]


def test_the_overview_shows_waits_and_timeouts_per_kind(
    make_pool: Callable[..., list[Resource]], audit_on: Callable[..., Any], admin_client: Client
) -> None:
    waits_of_a_busy_pool(make_pool, audit_on)
    page = admin_client.get("/admin/resource_lease/pooloverview/").content.decode()
    table = page[page.index('<table id="rl-waits">') :]
    table = table[: table.index("</table>")]
    row = table[table.index(">w-pool</a>") :]
    cells = [c.split(">", 1)[1].split("<", 1)[0] for c in row.split("<td")[1:8]]
    granted, median, p95, longest, timed_out, taken_over = cells[:6]
    assert (granted, timed_out, taken_over) == ("5", "1", "0")
    assert median.startswith("≤ ") and p95.startswith("≤ ") and longest.endswith(("ms", "s"))


def test_without_the_audit_trail_the_overview_says_what_it_needs(
    make_pool: Callable[..., list[Resource]], admin_client: Client
) -> None:
    make_pool("w-pool", 1)
    acquire("w-pool", ttl=30).release()
    page = admin_client.get("/admin/resource_lease/pooloverview/").content.decode()
    assert "Turn the audit trail on to see waits and time-outs per kind across processes" in page
