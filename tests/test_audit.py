"""The audit trail: lease events stored in the background, never on the lease path."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import pytest

from resource_lease import LeaseLost, acquire, audit
from resource_lease.models import LeaseEvent, Resource
from resource_lease.pool import force_release, quarantine, restore
from tests.conftest import REPO, worker_env
from tests.late_answers import acquire_short

pytestmark = pytest.mark.django_db(transaction=True)


def events(*fields: str) -> list[tuple[Any, ...]]:
    return list(LeaseEvent.objects.order_by("at", "id").values_list(*fields))


def wait_for(condition: Callable[[], bool], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_grants_and_releases_are_stored_by_the_background_thread(make_pool: Any, audit_on: Any) -> None:
    writer = audit_on(AUDIT_FLUSH_INTERVAL=0.1)
    make_pool("proxy", 1)

    lease = acquire("proxy", ttl=30, holder="worker-1")
    assert lease.release()

    assert wait_for(lambda: LeaseEvent.objects.count() == 2)
    assert writer.pending() == 0
    granted, released = LeaseEvent.objects.order_by("at", "id")
    assert (granted.event, granted.kind, granted.name, granted.resource_id) == (
        "granted",
        "proxy",
        "proxy-0",
        lease.resource.pk,
    )
    assert (granted.holder, granted.fence, granted.expires_at) == ("worker-1", lease.fence, lease.expires_at)
    assert (released.event, released.holder, released.fence) == ("released", "worker-1", lease.fence)


def test_the_lease_path_only_queues_events(make_pool: Any, audit_on: Any) -> None:
    writer = audit_on(AUDIT_FLUSH_INTERVAL=60)  # the writer thread stays asleep
    make_pool("proxy", 1)

    for _ in range(3):
        acquire("proxy", ttl=30).release()

    assert LeaseEvent.objects.count() == 0
    assert writer.pending() == 6
    assert audit.flush() == 6
    assert LeaseEvent.objects.count() == 6 and writer.pending() == 0


def test_a_full_batch_wakes_the_writer_before_its_interval(make_pool: Any, audit_on: Any) -> None:
    writer = audit_on(AUDIT_FLUSH_INTERVAL=60)
    make_pool("proxy", 1)
    acquire("proxy", ttl=30).release()  # starts the writer, which then sleeps for 60 s
    for _ in range(audit.BATCH_SIZE):
        writer.record("default", event="lost", kind="proxy", name="x", detail="filler")

    # Stored within seconds, not a minute: the full queue woke the writer.
    assert wait_for(lambda: LeaseEvent.objects.count() >= audit.BATCH_SIZE)


def test_audit_off_records_nothing(make_pool: Any) -> None:
    make_pool("proxy", 1)
    acquire("proxy", ttl=30).release()
    quarantine(Resource.objects.all(), reason="x", seconds=60)
    assert audit.writer.pending() == 0
    audit.flush()
    assert LeaseEvent.objects.count() == 0


def test_a_take_over_names_the_previous_holder(make_pool: Any, audit_on: Any) -> None:
    audit_on(AUDIT_FLUSH_INTERVAL=60)
    make_pool("proxy", 1)
    stale = acquire_short("proxy", ttl=0.3, holder="paused-worker")
    time.sleep(0.5)
    fresh = acquire("proxy", ttl=30, holder="new-worker")

    assert not stale.release()  # its lease had expired and was taken
    assert fresh.release()
    audit.flush()

    assert events("event", "holder", "previous_holder", "fence") == [
        ("granted", "paused-worker", "", stale.fence),
        ("taken_over", "new-worker", "paused-worker", fresh.fence),
        ("release_refused", "paused-worker", "", stale.fence),
        ("released", "new-worker", "", fresh.fence),
    ]


def test_a_lost_lease_is_recorded_with_its_reason(make_pool: Any, audit_on: Any) -> None:
    audit_on(AUDIT_FLUSH_INTERVAL=60)
    make_pool("proxy", 1)
    lease = acquire("proxy", ttl=30, holder="worker-3")
    force_release([lease.resource])

    with pytest.raises(LeaseLost):
        lease.renew()
    audit.flush()

    assert events("event", "holder", "fence")[-2:] == [
        ("force_released", "worker-3", lease.fence),
        ("lost", "worker-3", lease.fence),
    ]
    assert "refused the renewal" in LeaseEvent.objects.get(event="lost").detail


def test_operator_actions_are_recorded_with_the_actor_and_reason(make_pool: Any, audit_on: Any) -> None:
    audit_on(AUDIT_FLUSH_INTERVAL=60)
    make_pool("proxy", 3)
    lease = acquire("proxy", ttl=30, holder="crawler-1")

    with audit.acting_as("admin:alice"):
        assert quarantine(Resource.objects.exclude(pk=lease.resource.pk), reason="timeouts", seconds=600) == 2
        assert restore(Resource.objects.all()) == 2
        assert force_release(Resource.objects.all()) == 1
    quarantine(Resource.objects.filter(pk=lease.resource.pk), reason="by a script", seconds=5)
    audit.flush()

    rows = events("event", "name", "holder", "fence", "actor", "detail")[1:]  # after the grant
    assert sorted(rows[:2]) == [
        ("quarantined", name, "", 0, "admin:alice", "for 10m 00s: timeouts")
        for name in sorted(r.name for r in Resource.objects.exclude(pk=lease.resource.pk))
    ]
    assert sorted(r[:2] for r in rows[2:4]) == sorted(("restored", r[1]) for r in rows[:2])
    assert rows[4] == (
        "force_released",
        lease.resource.name,
        "crawler-1",
        lease.fence,
        "admin:alice",
        "",
    )
    assert LeaseEvent.objects.get(event="force_released").summary == "cut off crawler-1"
    # Outside acting_as (code calling pool.quarantine): the process, not "-" (as before).
    assert rows[5][0] == "quarantined" and rows[5][4] == audit.code_actor()
    assert re.fullmatch(r"code: .+@.+:\d+", rows[5][4])
    assert LeaseEvent.objects.filter(event="quarantined", name=lease.resource.name).get().who == rows[5][4]


def test_a_quarantine_names_the_operator_not_the_last_dead_holder(make_pool: Any, audit_on: Any) -> None:
    audit_on(AUDIT_FLUSH_INTERVAL=60)
    make_pool("proxy", 1)
    acquire("proxy", ttl=30, holder="crawler-that-died:4242:MainThread").release()
    with audit.acting_as("admin:alice"):
        quarantine(Resource.objects.all(), reason="502s", seconds=600)
    audit.flush()
    event = LeaseEvent.objects.get(event="quarantined")
    assert (event.holder, event.actor, event.who) == ("", "admin:alice", "admin:alice")


def test_events_still_queued_at_exit_are_stored(make_pool: Any) -> None:
    make_pool("proxy", 1)
    child = textwrap.dedent(
        """
        from tests.procs import setup
        setup()
        from django.conf import settings
        from django.test import override_settings
        override_settings(RESOURCE_LEASE={**settings.RESOURCE_LEASE, "AUDIT": True, "AUDIT_FLUSH_INTERVAL": 3600}).enable()
        from resource_lease import acquire
        acquire("proxy", ttl=30, holder="short-lived").release()
        # no flush: the process just ends
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", child], env=worker_env(), cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert events("event", "holder") == [("granted", "short-lived"), ("released", "short-lived")]


def test_a_forked_child_does_not_inherit_queued_events(audit_on: Any) -> None:
    writer = audit_on(AUDIT_FLUSH_INTERVAL=60)
    writer.record("default", event="granted", kind="proxy", name="p")
    pid = os.fork()
    if pid == 0:  # the child: nothing queued, no writer thread inherited
        os._exit(0 if audit.writer.pending() == 0 and audit.writer._thread is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert writer.pending() == 1


def test_refused_writes_stay_queued_and_are_logged(audit_on: Any, caplog: pytest.LogCaptureFixture) -> None:
    writer = audit_on(AUDIT_FLUSH_INTERVAL=60)
    writer.record("no-such-alias", event="granted", kind="proxy", name="p")
    writer.record("default", event="granted", kind="proxy", name="q")

    with caplog.at_level(logging.WARNING, logger="resource_lease.audit"):
        assert writer.flush() == 1

    assert writer.pending() == 1
    assert list(LeaseEvent.objects.values_list("name", flat=True)) == ["q"]
    assert "storing 1 events on 'no-such-alias' failed; will retry" in caplog.text
    writer._pending.clear()


def test_a_full_queue_drops_new_events_and_says_so(audit_on: Any, caplog: pytest.LogCaptureFixture) -> None:
    writer = audit_on(AUDIT_FLUSH_INTERVAL=60, AUDIT_MAX_BUFFERED=3)
    for i in range(5):
        writer.record("default", event="granted", kind="proxy", name=f"p{i}")

    with caplog.at_level(logging.ERROR, logger="resource_lease.audit"):
        writer.flush()

    assert sorted(LeaseEvent.objects.values_list("name", flat=True)) == ["p0", "p1", "p2"]
    assert "dropped 2 events" in caplog.text
