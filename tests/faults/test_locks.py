"""Named locks under faults: the holder killed with SIGKILL, and paused with SIGSTOP past its ttl.

The holder is tests/procs/holder.py with ``--lock``: the same ``Lease`` and the same
commands as a resource holder. A killed holder's lock is free again once its lease has
expired by the database's clock (never before), within ttl plus one retry interval of the
kill; a holder paused past its ttl is taken over, and on resume its renewal, fenced write
and release are refused and it notices the loss on its own. A semaphore slot whose holder was
killed comes back the same way, to one waiter, while the other slot's holder keeps its own.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from resource_lease import LockHeld, lock
from resource_lease.models import Resource
from resource_lease.recipes.locks import LOCK_KIND
from tests.faults.harness import Child, rounds, spread
from tests.grants import Grant, exclusion_violations

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

#: Long enough for CI's first minute, when six test runs start at once and make their
#: databases: at 1.5 s a renewal answered 1.64 s after it was sent lost the holder's lease,
#: and a waiter's grant answered too late to be trusted was given back and asked for again,
#: both before the fault under test (CI, MariaDB and PostgreSQL, the same minute).
TTL = 3.0
INTERVAL = TTL / 3  # RENEW_FRACTION
#: A waiter retries at most every second (the default backoff cap): "within ttl + 1 s".
RETRY = 1.0
#: What a loaded 2-core machine may add on top (process scheduling, a slow statement).
SLACK = 4.0


def start_lock_holder(start_child: Callable[..., Child], name: str) -> Child:
    return start_child("holder", "--lock", name, "--ttl", TTL, "--timeout", 60, "--auto-renew")


def last_expiry(child: Child) -> dt.datetime:
    events = child.of("acquired") + child.of("renewed")
    return max(dt.datetime.fromisoformat(e["expires_at"]) for e in events)


def poll_lock(name: str, *, timeout: float, holder: str) -> tuple[Any, float]:
    """``lock(name, timeout=0)`` every 20 ms until granted: (lease, time it was received)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return lock(name, ttl=TTL, timeout=0, holder=holder, auto_renew=False), time.monotonic()
        except LockHeld:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def test_a_killed_holders_lock_is_free_again_within_ttl_plus_one_retry(
    start_child: Callable[..., Child], figures: Callable[..., Any]
) -> None:
    n = rounds(3, 1 / 3)
    recoveries: list[float] = []
    after_expiry: list[float] = []
    problems: list[str] = []
    for i in range(n):
        child = start_lock_holder(start_child, "killed-lock")
        held = child.wait_for("acquired", timeout=60)
        child.wait_for("renewed", timeout=30)
        time.sleep(random.uniform(0, INTERVAL))  # anywhere in the renewal cycle
        killed_at = child.kill()
        # The default waiter: lock() with a timeout, backing off up to a second.
        lease = lock("killed-lock", ttl=TTL, timeout=TTL + RETRY + 60, holder=f"waiter-{i}", auto_renew=False)
        recoveries.append(time.monotonic() - killed_at)
        row = lease.resource
        expiry = last_expiry(child)
        after_expiry.append((row.acquired_at - expiry).total_seconds())
        if row.acquired_at < expiry:
            problems.append(f"round {i}: granted at {row.acquired_at}, before the dead holder's expiry {expiry}")
        if not (row.took_over and row.previous_holder == held["holder"] and lease.fence == held["fence"] + 1):
            problems.append(f"round {i}: {row.took_over=} {row.previous_holder=} fence {lease.fence} after {held}")
        if recoveries[-1] > TTL + RETRY + SLACK:
            problems.append(f"round {i}: the lock came back {recoveries[-1]:.2f}s after the kill")
        assert lease.release()
    figures(
        "locks-kill",
        rounds=n,
        ttl=TTL,
        violations=len(problems),
        **spread("recovery", recoveries),
        **spread("after_expiry", after_expiry),
    )
    assert not problems, problems


def test_a_paused_lock_holder_is_taken_over_then_refused_and_notices(
    start_child: Callable[..., Child], figures: Callable[..., Any]
) -> None:
    n = rounds(2, 1 / 6)
    takeovers: list[float] = []
    notices: list[float] = []
    grants: list[Grant] = []
    problems: list[str] = []
    for i in range(n):
        a = start_lock_holder(start_child, "paused-lock")
        got = a.wait_for("acquired", timeout=60)
        a.wait_for("renewed", timeout=30)
        time.sleep(random.uniform(0, INTERVAL))
        paused_at = a.stop()
        time.sleep(0.2)  # a statement already sent may still commit: only the process is paused

        b, b_recv = poll_lock("paused-lock", timeout=2 * TTL + 30, holder=f"taker-{i}")
        takeovers.append(b_recv - paused_at)
        a_expiry = last_expiry(a)
        row = b.resource
        if row.acquired_at < a_expiry:
            problems.append(f"round {i}: taken at {row.acquired_at} before A's expiry {a_expiry}")
        if not (row.took_over and row.previous_holder == got["holder"] and b.fence > got["fence"]):
            problems.append(f"round {i}: takeover row {row.previous_holder!r} {row.took_over} fence {b.fence}")

        mark = a.mark()
        resumed = a.cont()
        lost = a.wait_for("lost", since=mark, timeout=INTERVAL + 10)
        notices.append(lost["t"] - resumed)
        for command in ("renew", "fenced_write", "check"):
            answer = a.command(command)
            if answer["ok"] or "LeaseLost" not in answer.get("error", ""):
                problems.append(f"round {i}: the resumed holder's {command} was not refused: {answer}")
        if a.command("is_held").get("result") is not False:
            problems.append(f"round {i}: the resumed holder thinks it holds the lock")
        if a.command("release").get("result", {}).get("released") is not False:
            problems.append(f"round {i}: the resumed holder's release freed the lock")

        with b.fenced():  # the new holder's fenced write goes through; the late one left no trace
            Resource.objects.filter(pk=row.pk).update(data={"fence": b.fence})
        if Resource.objects.get(kind=LOCK_KIND, name="paused-lock").data != {"fence": b.fence}:
            problems.append(f"round {i}: a late write is in the row")
        if not b.is_held():
            problems.append(f"round {i}: the new holder lost the lock to the resumed one")
        released_at = time.monotonic()
        assert b.release()
        a.finish()
        a_deadline = max(e["deadline"] for e in a.of("acquired") + a.of("renewed"))
        grants.append(Grant(row.pk, got["fence"], f"A{i}", got["t_recv"], a_deadline))
        grants.append(Grant(row.pk, b.fence, f"B{i}", b_recv, released_at))

    violations = exclusion_violations(grants) + problems
    figures(
        "locks-pause",
        rounds=n,
        ttl=TTL,
        violations=len(violations),
        **spread("takeover", takeovers),
        **spread("notice", notices),
    )
    assert not violations, violations


def test_a_killed_semaphore_holders_slot_comes_back_and_no_slot_is_granted_twice(
    start_child: Callable[..., Child], figures: Callable[..., Any]
) -> None:
    from resource_lease import semaphore

    holders = [
        start_child("holder", "--semaphore", "killed-sem", "--slots", 2, "--ttl", TTL, "--timeout", 60, "--auto-renew")
        for _ in range(2)
    ]
    held = [child.wait_for("acquired", timeout=60) for child in holders]
    assert len({h["pk"] for h in held}) == 2  # one slot each
    with pytest.raises(LockHeld) as full:
        semaphore("killed-sem", 2, ttl=TTL, timeout=0)
    assert full.value.holder in {h["holder"] for h in held}
    victim, survivor = holders
    killed_at = victim.kill()
    lease = semaphore("killed-sem", 2, ttl=TTL, timeout=TTL + RETRY + 60, holder="waiter", auto_renew=False)
    recovery = time.monotonic() - killed_at
    row = lease.resource
    assert row.pk == held[0]["pk"] and lease.fence == held[0]["fence"] + 1  # the dead one's slot, fenced
    assert row.took_over and row.previous_holder == held[0]["holder"]
    assert row.acquired_at >= last_expiry(victim)  # never before its lease ran out
    assert survivor.command("is_held")["result"] is True  # the live holder kept its slot
    assert recovery <= TTL + RETRY + SLACK, recovery
    figures("locks-semaphore-kill", ttl=TTL, recovery=recovery)
    assert lease.release()
    survivor.finish()
