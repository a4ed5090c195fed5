"""Scenario 5: client clocks hours off (libfaketime) and a MySQL session time zone not UTC.

Leases are judged by the database server's clock only (expiry, takeover, fenced writes,
pool states); a process trusts its lease by its monotonic clock, relative to when it sent
the request. So neither a wall clock hours off nor a user connection whose MySQL session
time zone is not UTC changes anything. (A monotonic clock far off would not either, but
libfaketime cannot fake it under Python: lock waits hang.)

SQLite is the exception and is skipped: it has no server; its "database clock" is the wall
clock of each process that runs a statement, so processes must share one machine's clock
(which processes on one machine do, unless something like libfaketime lies to them).
"""

from __future__ import annotations

import datetime as dt
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from resource_lease import acquire
from resource_lease.exceptions import NoResourceAvailable
from resource_lease.models import Resource
from tests.faults.harness import LIBFAKETIME, Child, duration, exclusion_race, faketime_env

pytestmark = [
    pytest.mark.faults,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not LIBFAKETIME.exists(), reason=f"libfaketime is not installed ({LIBFAKETIME})"),
]

TTL = 3.0
USER_TZ = "SET time_zone = '+05:45'"  # Nepal: hours and an odd quarter off UTC


@pytest.fixture(autouse=True)
def _not_sqlite() -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite's clock is each client's own wall clock: skewed clients disagree by design")


def _skews() -> list[dict[str, str]]:
    skews = [faketime_env("+5h"), faketime_env("-7h"), faketime_env("+0")]
    if connection.vendor == "mysql":
        for env in skews:
            env["FAULTS_USER_INIT_COMMAND"] = USER_TZ
    return skews


def test_exclusion_with_skewed_client_clocks(
    spawn_worker: Callable[..., subprocess.Popen[str]],
    make_pool: Callable[..., list[Resource]],
    tmp_path: Path,
    figures: Callable[..., Any],
) -> None:
    """The exclusion race of scenario 1, its workers' wall clocks +5h, -7h and right (their
    monotonic clocks, which the ledger compares, untouched): a worker that judged whether a
    resource is free by its own clock would take held resources (+5h) or none (-7h)."""
    make_pool("skewed", 3)
    seconds = duration(2.0)
    verdict, failed = exclusion_race(
        spawn_worker, tmp_path, kind="skewed", workers=6, seconds=seconds, envs=_skews(), ttl=1.0
    )
    figures(
        "5-clocks-exclusion",
        seconds=seconds,
        workers=6,
        skews="+5h,-7h,0" + (",tz+05:45" if connection.vendor == "mysql" else ""),
        grants=verdict.grants,
        violations=verdict.violations + failed,
    )
    assert verdict.grants >= 30, "too few grants for the check to mean anything"
    assert verdict.violations == 0 and failed == 0, verdict.summary()


@pytest.mark.parametrize("skew", ["+5h", "-7h", "session-tz"])
def test_holder_with_a_skewed_clock_sees_the_database_clock(
    skew: str,
    make_pool: Callable[..., list[Resource]],
    start_holder: Callable[..., Child],
    figures: Callable[..., Any],
) -> None:
    if skew == "session-tz" and connection.vendor != "mysql":
        pytest.skip("a session time zone changes NOW() on MySQL only")
    env = {
        "+5h": faketime_env("+5h"),
        "-7h": faketime_env("-7h"),
        "session-tz": {"FAULTS_USER_INIT_COMMAND": USER_TZ},
    }[skew]
    make_pool("clock", 1)
    holder = start_holder("clock", TTL, env=env)
    got = holder.wait_for("acquired")
    clocks = holder.command("clocks")["result"]
    state = holder.command("pool_state")["result"]
    write = holder.command("fenced_write", "skewed")
    renew = holder.command("renew")

    wall_off = (dt.datetime.fromisoformat(clocks["wall"]) - dt.datetime.fromisoformat(clocks["db_now"])).total_seconds()
    problems = []
    # The grant's expiry is ttl ahead of the database's clock, whatever the client's says.
    if not 0 < got["ttl_by_db"] <= TTL:
        problems.append(f"expiry {got['ttl_by_db']:.3f}s ahead of the database clock, not within ttl {TTL}")
    if state["state"] != "held" or not 0 < state["time_left"] <= TTL:
        problems.append(f"pool state seen from the skewed client: {state}")
    if not write["ok"]:
        problems.append(f"fenced write refused: {write}")
    if not renew["ok"]:
        problems.append(f"renew refused: {renew}")
    # Another process cannot take it meanwhile; it can once it is released.
    try:
        acquire("clock", ttl=TTL)
        problems.append("another process was granted the held resource")
    except NoResourceAvailable:
        pass
    engine_tz = {e["tz"] for e in holder.of("session")}
    if connection.vendor == "mysql" and engine_tz != {"+00:00"}:
        problems.append(f"engine sessions not in UTC: {engine_tz}")
    released = holder.command("release")["result"]["released"]
    if not released:
        problems.append("release refused")
    lease = acquire("clock", ttl=TTL)
    if lease.fence != got["fence"] + 1:
        problems.append(f"the next grant has fence {lease.fence}")
    lease.release()

    if skew == "session-tz":
        # The skew is real: the user's connection's NOW() is 5h45 off, and the system check says so.
        assert clocks["user_session_offset"] == 5 * 3600 + 45 * 60, clocks
        assert "resource_lease.W001" in clocks["checks"], clocks
    else:
        assert abs(wall_off) > 3600, f"libfaketime did not move the wall clock: {clocks}"
    figures(
        f"5-clocks-holder-{skew}",
        grants=2,
        violations=len(problems),
        wall_minus_db=wall_off,
        ttl_by_db=got["ttl_by_db"],
    )
    assert not problems, problems


@pytest.mark.parametrize("offset", ["+5h", "-7h"])
def test_skewed_waiter_takes_over_at_expiry_by_the_database_clock(
    offset: str,
    make_pool: Callable[..., list[Resource]],
    start_holder: Callable[..., Child],
    figures: Callable[..., Any],
) -> None:
    """A lease abandoned by a process with a right clock is taken by a waiter whose clock is
    hours off once it expires by the database's clock: not before (+5h), not hours later (-7h)."""
    make_pool("expiring", 1)
    abandoned = acquire("expiring", ttl=TTL)
    waiter = start_holder("expiring", TTL, auto_renew=False, timeout=TTL + 60, env=faketime_env(offset))
    got = waiter.wait_for("acquired", timeout=TTL + 90)
    taken_at = Resource.objects.get(pk=got["pk"]).acquired_at
    late = (taken_at - abandoned.expires_at).total_seconds()
    figures(f"5-clocks-takeover{offset}", grants=2, violations=int(not 0 <= late < TTL + 30), after_expiry=late)
    assert got["fence"] == abandoned.fence + 1 and got["took_over"]
    assert taken_at >= abandoned.expires_at, f"taken {-late:.3f}s before the expiry"
    assert late < TTL + 30, f"taken {late:.3f}s after the expiry"  # hours, were the waiter's clock used


@pytest.mark.parametrize("offset", ["+5h", "-7h"])
def test_audit_events_of_a_skewed_process_carry_the_database_clock(
    offset: str,
    make_pool: Callable[..., list[Resource]],
    start_holder: Callable[..., Child],
    figures: Callable[..., Any],
) -> None:
    """The audit trail of a process whose wall clock is hours off: every event's time is on
    the database's clock (the writer maps its monotonic stamps there), not the process's."""
    from resource_lease.models import LeaseEvent
    from resource_lease.pool import database_now

    make_pool("audited", 1)
    env = {**faketime_env(offset), "FAULTS_LEASE_SETTINGS": '{"AUDIT": true}'}
    holder = start_holder("audited", TTL, auto_renew=False, env=env)
    got = holder.wait_for("acquired")
    clocks = holder.command("clocks")["result"]
    assert holder.command("release")["result"]["released"]
    assert holder.command("flush_audit")["result"]["stored"] == 2
    now = database_now()

    events = list(LeaseEvent.objects.filter(kind="audited").order_by("at"))
    wall_off = (dt.datetime.fromisoformat(clocks["wall"]) - dt.datetime.fromisoformat(clocks["db_now"])).total_seconds()
    acquired_at = Resource.objects.get(pk=got["pk"]).acquired_at
    granted_off = (events[0].at - acquired_at).total_seconds() if events else float("nan")
    figures(f"5-clocks-audit{offset}", events=len(events), wall_minus_db=wall_off, granted_at_minus_db=granted_off)
    assert abs(wall_off) > 3600, f"libfaketime did not move the wall clock: {clocks}"
    assert [(e.event, e.fence) for e in events] == [("granted", got["fence"]), ("released", got["fence"])]
    # Within a second of the database's own grant time, not hours off.
    assert abs(granted_off) < 1.0, (events[0].at, acquired_at)
    assert all(acquired_at - dt.timedelta(seconds=1) <= e.at <= now for e in events), [e.at for e in events]
