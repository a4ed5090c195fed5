"""The Prometheus metrics (shared/docs/API.md "Metrics"): names, types and labels as the
contract fixes them, each counted where it happens on the real database; the pools read at
scrape time; prometheus_client's multiprocess mode; and nothing at all without it."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from resource_lease import Election, LeaseLost, LockHeld, NoResourceAvailable, ResourceHolder, acquire, lock, metrics
from resource_lease import semaphore as take_semaphore
from resource_lease.models import Resource
from resource_lease.pool import force_release, quarantine
from tests.conftest import REPO, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = "resource_lease_acquire_wait_seconds"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def waits(kind: str, outcome: str) -> float:
    return value(f"{WAIT}_count", kind=kind, outcome=outcome)


def test_the_contract_s_names_types_and_labels() -> None:
    families = {f.name: f for f in REGISTRY.collect() if f.name.startswith("resource_lease_")}
    expected = {
        "resource_lease_acquire_wait_seconds": ("histogram", ["kind", "outcome"]),
        "resource_lease_grants": ("counter", ["kind"]),
        "resource_lease_takeovers": ("counter", ["kind"]),
        "resource_lease_lost": ("counter", ["kind"]),
        "resource_lease_waiters": ("gauge", ["kind"]),
        "resource_lease_resources": ("gauge", ["kind", "state"]),
        "resource_lease_leader": ("gauge", ["election"]),
        "resource_lease_reports": ("counter", ["kind", "outcome"]),
        "resource_lease_auto_quarantines": ("counter", ["kind"]),
    }
    assert {name: families[name].type for name in expected} == {n: t for n, (t, _) in expected.items()}
    exposed = generate_latest(REGISTRY).decode()
    for name in ("grants_total", "takeovers_total", "lost_total"):
        assert f"# TYPE resource_lease_{name} counter" in exposed
    assert metrics.ENABLED


def test_a_grant_is_counted_and_its_wait_observed(make_pool: Callable[..., list[Resource]]) -> None:
    make_pool("m-grant", 2)
    before = (waits("m-grant", "granted"), value("resource_lease_grants_total", kind="m-grant"))
    with acquire("m-grant", ttl=30) as lease:
        assert lease.waited is not None and lease.waited >= 0
    assert waits("m-grant", "granted") == before[0] + 1
    assert value("resource_lease_grants_total", kind="m-grant") == before[1] + 1
    assert value("resource_lease_takeovers_total", kind="m-grant") == 0


def test_a_caller_that_gives_up_is_a_timeout_and_waited_at_least_its_timeout(
    make_pool: Callable[..., list[Resource]],
) -> None:
    make_pool("m-timeout", 1)
    with acquire("m-timeout", ttl=30):
        total = value(f"{WAIT}_sum", kind="m-timeout", outcome="timeout")
        with pytest.raises(NoResourceAvailable):
            acquire("m-timeout", ttl=30, timeout=0.3)
    assert waits("m-timeout", "timeout") == 1
    assert value(f"{WAIT}_sum", kind="m-timeout", outcome="timeout") - total >= 0.3
    assert value("resource_lease_grants_total", kind="m-timeout") == 1


def test_a_take_over_and_a_loss_are_counted(make_pool: Callable[..., list[Resource]]) -> None:
    make_pool("m-take", 1)
    first = acquire("m-take", ttl=30)
    # Its lease runs out unreleased (the row's expiry moved into the past).
    Resource.objects.filter(kind="m-take").update(busy_before=dt.datetime(2001, 1, 1, tzinfo=dt.UTC))
    second = acquire("m-take", ttl=30)
    assert second.resource.took_over
    assert value("resource_lease_takeovers_total", kind="m-take") == 1
    force_release(Resource.objects.filter(kind="m-take"))
    with pytest.raises(LeaseLost):
        second.renew()
    with pytest.raises(LeaseLost):
        first.renew()
    assert value("resource_lease_lost_total", kind="m-take") == 2


def served_after_waiting(kind: str) -> Any:
    """A caller of ``kind`` (one resource, held here) that waits in another thread: counted in
    the waiters gauge while it waits, and no longer once the release served it; its lease."""
    held = acquire(kind, ttl=30)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(acquire(kind, ttl=30, timeout=60)))
    waiter.start()
    for _ in range(600):
        if value("resource_lease_waiters", kind=kind) == 1:
            break
        time.sleep(0.05)
    assert value("resource_lease_waiters", kind=kind) == 1
    held.release()
    waiter.join(60)
    assert got and value("resource_lease_waiters", kind=kind) == 0
    return got[0]


def test_waiters_counts_the_callers_waiting_now(make_pool: Callable[..., list[Resource]]) -> None:
    make_pool("m-wait", 1)
    served_after_waiting("m-wait").release()


def test_a_caller_granted_at_its_first_attempt_is_never_counted_as_waiting(
    make_pool: Callable[..., list[Resource]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller pays for the line only when there is one: ``acquire(timeout=60)`` granted at
    its first attempt never touches the waiters gauge. The control: a caller that had to
    wait counts in it (once) while it waits."""
    make_pool("m-first", 1)
    counted: list[str] = []
    child = metrics._child

    def recording(metric: Any, *labels: str) -> Any:
        if metric is metrics._waiters:
            counted.append(labels[0])
        return child(metric, *labels)

    monkeypatch.setattr(metrics, "_child", recording)
    acquire("m-first", ttl=30, timeout=60).release()
    assert counted == []
    served = served_after_waiting("m-first")
    assert counted == ["m-first", "m-first"]  # up while it waited, down when served
    served.release()


def test_locks_semaphores_elections_and_holders_measure_their_waits(
    make_pool: Callable[..., list[Resource]],
) -> None:
    before = {k: waits(k, "granted") for k in ("@lock", "@semaphore", "@election", "m-holder")}
    with lock("m-rebuild", ttl=30):
        held = waits("@lock", "timeout")
        with pytest.raises(LockHeld):
            lock("m-rebuild", ttl=30)
        assert waits("@lock", "timeout") == held + 1
    with take_semaphore("m-exports", slots=2, ttl=30):
        pass
    election = Election("m-nightly", ttl=30)
    election.campaign(timeout=0)
    assert value("resource_lease_leader", election="m-nightly") == 1
    election.resign()
    assert value("resource_lease_leader", election="m-nightly") == 0

    make_pool("m-holder", 1)

    class Gpu(ResourceHolder):
        kind = "m-holder"
        ttl = 30

        def is_valid(self) -> bool:
            return True

    holder = Gpu()
    holder.acquire(timeout=5)
    holder.close()
    assert {k: waits(k, "granted") - before[k] for k in before} == {
        "@lock": 1,
        "@semaphore": 1,  # the semaphore's name is not a label value: few, bounded values
        "@election": 1,
        "m-holder": 1,
    }


def test_a_lost_leadership_reads_zero(make_pool: Callable[..., list[Resource]]) -> None:
    election = Election("m-lost", ttl=30)
    lease = election.campaign(timeout=0)
    assert value("resource_lease_leader", election="m-lost") == 1
    force_release(Resource.objects.filter(kind="@election", name="m-lost"))
    with pytest.raises(LeaseLost):
        lease.renew()
    assert value("resource_lease_leader", election="m-lost") == 0


def resources_gauge(text: str) -> dict[tuple[str, str], float]:
    return {
        (s.labels["kind"], s.labels["state"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "resource_lease_resources"
        for s in family.samples
    }


def test_the_pools_are_read_from_the_database_at_scrape_time(make_pool: Callable[..., list[Resource]]) -> None:
    make_pool("m-res", 3)
    quarantine(Resource.objects.filter(name="m-res-0"), reason="502s", seconds=600)
    with lock("m-coordination", ttl=30):
        first = resources_gauge(generate_latest(REGISTRY).decode())
        assert first[("m-res", "free")] == 2 and first[("m-res", "quarantined")] == 1
        assert not any(kind.startswith("@") for kind, _ in first), "coordination rows are not pools"
        with acquire("m-res", ttl=30):
            assert resources_gauge(generate_latest(REGISTRY).decode())[("m-res", "held")] == 1


def test_the_view_serves_the_metrics(make_pool: Callable[..., list[Resource]]) -> None:
    make_pool("m-view", 1)
    response = Client().get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    assert resources_gauge(response.content.decode())[("m-view", "free")] == 1


def test_multiprocess_mode_adds_up_the_processes(
    make_pool: Callable[..., list[Resource]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As under gunicorn or Celery prefork: each process writes its own files, the scrape
    adds them up (plus the pools read by the scraping process)."""
    make_pool("m-multi", 2)
    env = worker_env(PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    for n in (2, 3):
        child = subprocess.run(
            [sys.executable, "-m", "tests.procs.metrics_child", "m-multi", str(n)],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert child.returncode == 0 and "enabled=True waited=True" in child.stdout, child.stderr
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    registry = metrics.registry()
    assert registry is not REGISTRY
    assert registry.get_sample_value("resource_lease_grants_total", {"kind": "m-multi"}) == 5
    assert registry.get_sample_value(f"{WAIT}_count", {"kind": "m-multi", "outcome": "granted"}) == 5
    assert registry.get_sample_value("resource_lease_resources", {"kind": "m-multi", "state": "free"}) == 2


def test_without_prometheus_client_nothing_is_measured_and_leasing_works(
    make_pool: Callable[..., list[Resource]],
) -> None:
    make_pool("m-none", 1)
    child = subprocess.run(
        [sys.executable, "-m", "tests.procs.metrics_child", "m-none", "3"],
        env=worker_env(RESOURCE_LEASE_TEST_NO_PROMETHEUS="1"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    assert "enabled=False waited=True" in child.stdout  # the audit trail still gets the waits
    assert Client().get("/metrics").status_code == 200  # (this process has it)
