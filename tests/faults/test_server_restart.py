"""Scenario 4, continued: the database server restarted under a holder (this machine's
MariaDB or PostgreSQL, whichever the run uses; never SQLite).

Other people's sessions share the server, so the suite restarts it once per run, waits until
it answers again, and brings it back up in ``finally`` whatever happened. Set
``RESOURCE_LEASE_FAULTS_NO_RESTART=1`` to skip this test (e.g. on a shared server).

Each holder either reconnects and keeps its lease, or reports the loss; nobody else gets the
resource while it still trusts it; and the first acquire after the restart, on a session the
restart killed, grants a free resource at its one attempt.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from resource_lease import acquire
from resource_lease.db.connections import close_connections
from resource_lease.exceptions import NoResourceAvailable
from resource_lease.models import Resource
from tests.faults.harness import Child, ensure_server_up, have_server_tools, restart_server
from tests.grants import Grant, exclusion_violations

pytestmark = [pytest.mark.faults, pytest.mark.restarts_server, pytest.mark.django_db(transaction=True)]

# A holder that outlives a quick restart (trusts its lease 5.4 s past a renewal) and one that
# should not (1.35 s): each must either keep its lease or report the loss.
TTLS = {"long": 6.0, "short": 1.5}


def test_server_restart_under_a_holder(
    make_pool: Callable[..., list[Resource]], start_holder: Callable[..., Child], figures: Callable[..., Any]
) -> None:
    vendor = connection.vendor
    if vendor == "sqlite":
        pytest.skip("SQLite has no server to restart")
    if os.environ.get("RESOURCE_LEASE_FAULTS_NO_RESTART"):
        pytest.skip("RESOURCE_LEASE_FAULTS_NO_RESTART is set")
    if not have_server_tools(vendor):
        pytest.skip(f"restarting the local {vendor} server needs root and its tools")
    if connection.settings_dict["HOST"] not in ("127.0.0.1", "localhost", ""):
        pytest.skip("the database server is not on this machine")

    holders = {}
    for name, ttl in TTLS.items():
        make_pool(f"restart-{name}", 2)
        holders[name] = start_holder(f"restart-{name}", ttl)
    for child in holders.values():
        child.wait_for("renewed")
        # This process's own lease session exists before the restart (and is dead after it).
    acquire("restart-long", ttl=5).release()

    try:
        downtime = restart_server(vendor)
    finally:
        ensure_server_up(vendor)
    up_at = time.monotonic()
    connection.close()  # this process's Django session died with the server

    figures_line: dict[str, Any] = {"downtime": downtime}
    violations: list[str] = []
    grants = 0
    for name, ttl in TTLS.items():
        found, line = _judge(holders[name], f"restart-{name}", ttl, up_at)
        violations += [f"{name} holder: {v}" for v in found]
        grants += line.pop("grants")
        figures_line.update({f"{name}_{k}": v for k, v in line.items()})
    figures("4-server-restart", grants=grants, violations=len(violations), **figures_line)
    close_connections()
    assert not violations, violations


def _judge(a: Child, kind: str, ttl: float, up_at: float) -> tuple[list[str], dict[str, Any]]:
    """What became of one holder and its resource after the restart."""
    got = a.of("acquired")[0]
    outcome = _renewed_or_lost(a, after=up_at, timeout=ttl + 60)
    time.sleep(ttl / 3 * 2)  # let a lost lease be reported, a kept one renew again
    kept = not a.of("lost")
    problems: list[str] = []
    # One attempt, on a session the restart killed: the free resource is granted.
    try:
        other = acquire(kind, ttl=ttl, timeout=0)
    except NoResourceAvailable as exc:
        other = None
        problems.append(f"acquire(timeout=0) after the restart: {exc}")
    grants = [Grant(got["pk"], got["fence"], "holder", got["t_recv"], _trust_end(a))]
    if other is not None:
        grants.append(Grant(other.resource.pk, other.fence, "after-restart", time.monotonic(), time.monotonic()))
    # The holder's resource: not grantable while it keeps its lease; after a loss, only once
    # the holder has stopped trusting it.
    try:
        taken = acquire(kind, ttl=ttl, timeout=0 if kept else ttl + 30)
        grants.append(Grant(taken.resource.pk, taken.fence, "contender", time.monotonic(), time.monotonic()))
        if kept:
            problems.append("its resource was granted while it kept its lease")
        taken.release()
    except NoResourceAvailable:
        if not kept:
            problems.append("the lost lease's resource never came back")
    if kept:
        held = a.command("is_held")
        if held.get("result") is not True:
            problems.append(f"it kept trusting a lease the database does not have: {held}")
    if other is not None:
        other.release()
    line = {
        "grants": len(grants),
        "outcome": "kept" if kept else "lost",
        "renew_failures": len(a.of("renew_failed")),
        "first_renewal_after_up": (outcome["t"] - up_at) if outcome["ev"] == "renewed" else float("nan"),
    }
    return [str(v) for v in exclusion_violations(grants)] + problems, line


def _renewed_or_lost(child: Child, *, after: float, timeout: float) -> dict[str, Any]:
    """The holder's first renewal after ``after``, or its loss, whichever it reports first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for event in list(child.events):
            if event.get("ev") == "lost" or (event.get("ev") == "renewed" and event["t"] >= after):
                return event
        time.sleep(0.1)
    raise AssertionError(f"the holder neither renewed nor reported a loss after the restart: {child.tail()}")


def _trust_end(child: Child) -> float:
    """When the holder stopped trusting its lease (loss reported or deadline, whichever came
    first), or now if it still does."""
    lost = child.of("lost")
    if lost:
        return min(float(lost[0]["t"]), float(lost[0]["deadline"]))
    return time.monotonic()
