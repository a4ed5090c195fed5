"""Scenario 7: many processes on few resources, under READ COMMITTED and REPEATABLE READ.

The engine sets READ COMMITTED on its own connections; the REPEATABLE READ runs force the
engine's sessions (and on MySQL the user's connection, used by the fenced writes) to the
server's default instead, as a project that overrides session settings would. Deadlocks,
lock wait timeouts and serialization failures must be retried by the engine (counted from its
DEBUG log) or absent, never a double grant or an error reaching the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from resource_lease.models import Resource
from tests.faults.harness import Child, duration, quantile, run_churn

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

ISOLATIONS = ["read-committed", "repeatable-read"]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_contention_is_retried_never_double_granted(
    isolation: str,
    make_pool: Callable[..., list[Resource]],
    start_child: Callable[..., Child],
    figures: Callable[..., Any],
) -> None:
    if connection.vendor == "sqlite" and isolation != "read-committed":
        pytest.skip("SQLite has one isolation level (serializable, one writer at a time)")
    env: dict[str, str] = {}
    if isolation == "repeatable-read":
        env["FAULTS_ISOLATION"] = "repeatable-read"
        if connection.vendor == "mysql":
            env["FAULTS_USER_ISOLATION"] = "repeatable read"
    make_pool("busy", 2)
    seconds = duration(4.0)
    result = run_churn(start_child, kind="busy", workers=6, seconds=seconds, ttl=3.0, hold=0.02, fenced=True, env=env)
    violations = result.violations
    label = "sqlite" if connection.vendor == "sqlite" else isolation
    figures(
        f"7-contention-{label}",
        seconds=seconds,
        workers=6,
        resources=2,
        grants=len(result.grants),
        violations=len(violations),
        deadlocks=result.retried.get("deadlock", 0),
        lock_waits=result.retried.get("lock_wait", 0),
        serialization=result.retried.get("serialization", 0),
        busy=result.retried.get("busy", 0),
        no_resource=result.counts.get("no_resource", 0),
        unhandled=result.counts.get("error", 0),
        latency_p50=quantile(result.latencies, 0.5),
        latency_p99=quantile(result.latencies, 0.99),
    )
    assert result.grants, "no grant at all: the workers never ran"
    assert not violations, violations[:20]
