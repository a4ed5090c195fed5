"""Scenario 2 (and 6): a holder paused with SIGSTOP past its ttl, then resumed with SIGCONT.

Another process takes the resource over once the lease has expired (never before); the
resumed holder's renewal, fenced write and release are refused, and it notices the loss on
its own (``on_lost``) within one renew interval of being resumed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from resource_lease.models import Resource
from tests.faults.harness import Child, poll_acquire, rounds, spread
from tests.grants import Grant, exclusion_violations

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

TTL = 1.5
INTERVAL = TTL / 3  # RENEW_FRACTION
TAKER_TTL = 60.0


def _last_expiry(child: Child) -> tuple[Any, float]:
    """The holder's last granted expiry (database clock) and its local deadline (host clock)."""
    events = child.of("acquired") + child.of("renewed")
    last = max(events, key=lambda e: e["deadline"])
    return last["expires_at"], last["deadline"]


def test_paused_holder_is_taken_over_then_refused_and_notices(
    make_pool: Callable[..., list[Resource]], start_holder: Callable[..., Child], figures: Callable[..., Any]
) -> None:
    """Rounds alternate where the pause falls: anywhere in the renewal cycle (the resumed
    holder's local deadline refuses it) or right after its local check passed, inside
    ``fenced()`` or ``renew()`` (only the database can refuse it there)."""
    make_pool("pause", 1)
    takeovers: list[float] = []
    after_expiry: list[float] = []
    notices: list[float] = []
    grants: list[Grant] = []
    problems: list[str] = []
    refused_by_db = 0
    n = rounds(3, 1 / 6)
    for i in range(n):
        where = ("anywhere", "fenced_write", "renew")[i % 3]
        a = start_holder("pause", TTL)
        got = a.wait_for("acquired")
        a.wait_for("renewed")
        time.sleep(random.uniform(0, INTERVAL))  # pause anywhere in the renewal cycle
        pending = None
        if where != "anywhere":
            note = ["late"] if where == "fenced_write" else []
            pending = a.send("after_check", 1.0, where, *note)
            a.wait_for("checked")
        paused_at = a.stop()
        time.sleep(0.2)  # a statement already sent may still commit: only the process is paused

        # The taker's own ttl plays no part in the takeover: long, so that it still holds the
        # row when the round ends (the checks of the resumed holder below take more than
        # TTL on a loaded machine: in CI its lease ran out before its fenced write).
        b, _, b_recv = poll_acquire("pause", ttl=TAKER_TTL, timeout=2 * TTL + 10, holder=f"taker-{i}")
        takeovers.append(b_recv - paused_at)
        a_expiry, a_deadline = _last_expiry(a)
        row = b.resource
        # By the database's clock the takeover came after A's last expiry, from A, with a
        # higher fence.
        after_expiry.append((row.acquired_at - _aware(a_expiry)).total_seconds())
        if row.acquired_at < _aware(a_expiry):
            problems.append(f"round {i}: taken at {row.acquired_at} before A's expiry {a_expiry}")
        if not (row.took_over and row.previous_holder == got["holder"] and b.fence > got["fence"]):
            problems.append(f"round {i}: takeover row {row.previous_holder!r} {row.took_over} fence {b.fence}")

        mark = a.mark()
        resumed = a.cont()
        if pending is not None:
            answer = a.reply(pending)
            refusal = a.wait_for("after_check", since=mark)
            if answer["ok"] or "LeaseLost" not in answer["error"] or not refusal["checked"]:
                problems.append(f"round {i}: {where} paused after its check was not refused: {answer}")
            else:
                refused_by_db += 1
        lost = a.wait_for("lost", since=mark, timeout=INTERVAL + 10)
        notices.append(lost["t"] - resumed)

        for command in ("renew", "fenced_write"):
            answer = a.command(command)
            if answer["ok"] or "LeaseLost" not in answer.get("error", ""):
                problems.append(f"round {i}: the resumed holder's {command} was not refused: {answer}")
        held = a.command("is_held")
        release = a.command("release")
        if held.get("result") is not False:
            problems.append(f"round {i}: the resumed holder thinks it holds: {held}")
        if release.get("result", {}).get("released") is not False:
            problems.append(f"round {i}: the resumed holder's release freed it: {release}")

        # The new holder's own fenced write goes through; the late ones left no trace.
        with b.fenced():
            Resource.objects.filter(pk=row.pk).update(data={"fence": b.fence, "note": "new holder"})
        data = Resource.objects.get(pk=row.pk).data
        if data != {"fence": b.fence, "note": "new holder"}:
            problems.append(f"round {i}: a late write is in the row: {data}")
        if not b.is_held():
            problems.append(f"round {i}: the new holder lost the resource to the resumed one")
        released_at = time.monotonic()
        b.release()
        a.finish()
        grants.append(Grant(row.pk, got["fence"], f"A{i}", got["t_recv"], a_deadline))
        grants.append(Grant(row.pk, b.fence, f"B{i}", b_recv, released_at))

    violations = exclusion_violations(grants) + problems
    figures(
        "2-pause-sigstop",
        rounds=n,
        grants=len(grants),
        violations=len(violations),
        refused_by_db=refused_by_db,
        ttl=TTL,
        **spread("takeover", takeovers),
        **spread("after_expiry", after_expiry),
        **spread("notice", notices),
        interval=INTERVAL,
    )
    assert not violations, violations
    # Liveness, with room for a busy machine: the resumed holder noticed by itself, at once.
    assert max(notices) < INTERVAL + 5, notices


def _aware(value: Any) -> Any:
    import datetime as dt

    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value


def test_paused_resource_holder_notices_and_moves_on(
    make_pool: Callable[..., list[Resource]], start_child: Callable[..., Child], figures: Callable[..., Any]
) -> None:
    """The same pause for a ResourceHolder (its own renewal thread): after SIGCONT its
    ``on_lost()`` runs within one renew interval, ``check()`` and the old lease's fenced
    write are refused, and once the resource is free again it holds it under a new fence."""
    make_pool("holder-pause", 1)
    h = start_child("resource_holder", "--kind", "holder-pause", "--ttl", TTL)
    got = h.wait_for("acquired", timeout=60)
    h.wait_for("renewed")
    time.sleep(random.uniform(0, INTERVAL))
    paused_at = h.stop()
    time.sleep(0.2)
    b, _, b_recv = poll_acquire("holder-pause", ttl=TAKER_TTL, timeout=2 * TTL + 10, holder="taker")
    takeover = b_recv - paused_at
    a_expiry, a_deadline = _last_expiry(h)
    problems: list[str] = []
    if b.resource.acquired_at < _aware(a_expiry):
        problems.append(f"taken at {b.resource.acquired_at}, before the holder's expiry {a_expiry}")
    mark = h.mark()
    resumed = h.cont()
    lost = h.wait_for("lost", since=mark, timeout=INTERVAL + 10)
    for command in ("check", "fenced_write"):
        answer = h.command(command, "late")
        if answer["ok"] or "LeaseLost" not in answer.get("error", ""):
            problems.append(f"the resumed holder's {command} was not refused: {answer}")
    if Resource.objects.get(pk=b.resource.pk).data.get("note") == "late":
        problems.append("the late write is in the row")
    released_at = time.monotonic()
    b.release()
    deadline = time.monotonic() + 30
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = h.command("state")["result"]
        if state["holding"] and state["fence"] == b.fence + 1:
            break
        time.sleep(0.1)
    else:
        problems.append(f"the holder did not move on to a fresh grant: {state}")
    h.command("exit")
    grants = [
        Grant(got["pk"], got["fence"], "holder", got["t_recv"], a_deadline),
        Grant(b.resource.pk, b.fence, "taker", b_recv, released_at),
    ]
    violations = exclusion_violations(grants) + problems
    figures(
        "2-pause-sigstop-holder",
        grants=3,
        violations=len(violations),
        takeover=takeover,
        notice=lost["t"] - resumed,
        interval=INTERVAL,
    )
    assert not violations, violations
    assert lost["t"] - resumed < INTERVAL + 5
