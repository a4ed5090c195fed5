"""Scenario 8: a process forked while its parent holds an auto-renewed lease.

The child inherits the Lease object but not the lease: ``release()`` is False, ``renew()``
and ``check()`` raise ``LeaseLost``, ``is_held()`` is False; it has no renewal thread and
leases on connections of its own. The parent's engine sessions survive the child, whether it
exits through interpreter shutdown or ``os._exit``: no session of the parent is reopened
after the fork, and it keeps renewing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from resource_lease.models import Resource
from tests.faults.harness import Child

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

TTL = 1.5


@pytest.mark.parametrize("child_exit", ["normal", "_exit"])
def test_forked_child_inherits_no_lease_thread_or_connection(
    child_exit: str,
    make_pool: Callable[..., list[Resource]],
    start_child: Callable[..., Child],
    figures: Callable[..., Any],
) -> None:
    make_pool("forked", 2)
    proc = start_child("fork", "--kind", "forked", "--ttl", TTL, "--child-exit", child_exit)
    held = proc.wait_for("acquired")
    child = proc.wait_for("child")
    parent = proc.wait_for("parent")
    proc.finish()
    parent_pid = held["pid"]

    problems: list[str] = []
    if "error" in child:
        problems.append(f"the child failed: {child['error']}")
    else:
        expected = {"release": False, "is_held": False, "renewer": False}
        for key, value in expected.items():
            if child[key] != value:
                problems.append(f"child {key}: {child[key]!r}, expected {value!r}")
        for key in ("renew", "check"):
            if not child[key].startswith("LeaseLost"):
                problems.append(f"child {key}: {child[key]!r}, expected LeaseLost")
        if "resource-lease-keeper" in child["threads"]:
            problems.append(f"the child has the renewal thread: {child['threads']}")
        if child["own_pk"] == held["pk"] or not child["own_released"]:
            problems.append(f"the child's own lease: {child}")

    sessions = proc.of("session")
    parent_ids = {e["session"] for e in sessions if e["pid"] == parent_pid and e["t"] < parent["forked_at"]}
    child_ids = {e["session"] for e in sessions if e["pid"] == child["pid"]}
    reopened = [e for e in sessions if e["pid"] == parent_pid and e["t"] > parent["forked_at"]]
    if (child_ids & parent_ids) - {None}:
        problems.append(f"the child used the parent's sessions {child_ids & parent_ids}")
    if reopened:
        problems.append(f"the parent had to reopen sessions after the fork (the child closed them): {reopened}")
    renewals_after = [
        e
        for e in proc.of("renewed")
        if e["pid"] == parent_pid and e["t"] > parent["child_done"] and e["thread"] != "MainThread"
    ]
    if not renewals_after:
        problems.append("the parent's renewal thread did not renew after the child exited")
    if not (parent["is_held"] and parent["released"] and not parent["lost"] and parent["child_status"] == 0):
        problems.append(f"the parent's lease after the fork: {parent}")

    figures(
        f"8-fork-{child_exit}",
        grants=2,
        violations=len(problems),
        parent_sessions_reopened=len(reopened),
        parent_renewals_after_child=len(renewals_after),
        user_connection_survived=parent["user_connection"] == "ok",
    )
    assert not problems, problems
