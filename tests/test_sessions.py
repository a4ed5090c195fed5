"""Sticky sessions (``acquire(kind, session=...)``, docs/learning.md#sessions), on the real
database, with real processes:

- a session keeps its resource across processes (negative control: a call without the
  session gets another, the least recently used);
- a bound resource held by another is waited for in its own line and granted when released,
  though other resources are free meanwhile (the fallback poll far above the deadline: the
  release wakes the waiter);
- a bound resource that is quarantined, disabled, cooling down for the caller's target or
  deleted is replaced by a new binding (``lease.rebound``), also while a waiter waits for it;
- a binding idle past the policy's ``session_idle`` is forgotten;
- bad input is a ValueError naming it, with nothing written.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from resource_lease import NoResourceAvailable, acquire, pool_policy
from resource_lease.models import Resource, SessionBinding, Waiter
from resource_lease.pool import database_now
from tests.conftest import worker_env

pytestmark = pytest.mark.django_db(transaction=True)


def start(spawn_worker: Any, *args: str) -> subprocess.Popen[str]:
    proc = spawn_worker(
        "tests.procs.target_worker", *args, env=worker_env(RESOURCE_LEASE_LINE_POLL_MAX="120"), stdout=subprocess.PIPE
    )
    assert json.loads(proc.stdout.readline())["event"] == "ready"
    return proc  # type: ignore[no-any-return]


def answer(proc: subprocess.Popen[str]) -> dict[str, Any]:
    # Not communicate(timeout=...): it reads the pipe itself, past what readline() has
    # already buffered (the "ready" line's read may have taken this one too).
    proc.wait(timeout=60)
    assert proc.stdout is not None
    out = proc.stdout.read()
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_session_keeps_its_resource_across_processes(make_pool, spawn_worker) -> None:
    make_pool("proxy", 5)
    lease = acquire("proxy", session="acct-42", ttl=30)
    assert (lease.session, lease.rebound) == ("acct-42", False)
    bound = lease.resource.name
    lease.release()
    for _ in range(2):
        got = answer(start(spawn_worker, "wait", "--kind", "proxy", "--session", "acct-42", "--timeout", "5"))
        assert got["event"] == "granted" and got["resource"] == bound and got["rebound"] is False, got
    # Negative control: calls without the session do not keep to it.
    names = set()
    for _ in range(5):
        other = acquire("proxy", ttl=30)
        names.add(other.resource.name)
        assert other.session is None
        other.release()
    assert names != {bound}
    assert SessionBinding.objects.get(kind="proxy", session="acct-42").resource.name == bound


def test_a_bound_resource_held_by_another_is_waited_for_and_granted_at_its_release(make_pool, spawn_worker) -> None:
    make_pool("proxy", 3)
    held = acquire("proxy", session="acct-1", ttl=30)
    waiter = start(spawn_worker, "wait", "--kind", "proxy", "--session", "acct-1", "--timeout", "10")
    deadline = time.monotonic() + 20
    while not Waiter.objects.filter(kind="proxy", name=held.resource.name).exists():
        assert time.monotonic() < deadline, "the session's caller took no place in its resource's line"
        time.sleep(0.02)
    time.sleep(0.5)  # it looks and sleeps; two other resources are free all along
    released_at = database_now()
    held.release()
    got = answer(waiter)
    assert got["event"] == "granted" and got["resource"] == held.resource.name and not got["rebound"], got
    assert got["acquired_at"] >= released_at.timestamp()


@pytest.mark.parametrize("how", ["quarantined", "disabled", "cooling", "deleted"])
def test_a_bound_resource_that_cannot_serve_is_replaced_by_a_new_binding(make_pool, how: str) -> None:
    from resource_lease.pool import quarantine

    make_pool("proxy", 3)
    first = acquire("proxy", session="s", target="shop.example", ttl=30)
    bound = first.resource
    if how == "cooling":
        first.release(cooldown=60)
    else:
        first.release()
    rows = Resource.objects.filter(pk=bound.pk)
    if how == "quarantined":
        quarantine(rows, reason="test", seconds=60)
    elif how == "disabled":
        rows.update(enabled=False)
    elif how == "deleted":
        rows.delete()
    again = acquire("proxy", session="s", target="shop.example", ttl=30, timeout=0)
    assert again.resource.pk != bound.pk and again.rebound is True
    assert SessionBinding.objects.get(session="s").resource_id == again.resource.pk
    again.release()
    third = acquire("proxy", session="s", target="shop.example", ttl=30, timeout=0)
    assert third.resource.pk == again.resource.pk and third.rebound is False
    third.release()


def quarantined_while_waited(spawn_worker: Any, *flags: str, timeout: float = 10) -> tuple[dict[str, Any], str]:
    """A session's waiter (started with ``flags``) waits in line for its bound resource, which
    its holder's report quarantines (threshold 1: effective at its release) before releasing
    it; the waiter's answer, and the quarantined resource's name."""
    pool_policy("proxy", error_threshold=1, backoff=(60, 60))
    held = acquire("proxy", session="s", ttl=30)
    waiter = start(spawn_worker, "wait", "--kind", "proxy", "--session", "s", "--timeout", str(timeout), *flags)
    deadline = time.monotonic() + 20
    while not Waiter.objects.filter(kind="proxy", name=held.resource.name).exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    held.report("error")
    held.release()
    return answer(waiter), held.resource.name


def test_a_waiter_for_a_bound_resource_quarantined_meanwhile_gets_another(make_pool, spawn_worker) -> None:
    make_pool("proxy", 3)
    got, quarantined = quarantined_while_waited(spawn_worker)
    assert got["event"] == "granted" and got["resource"] != quarantined and got["rebound"] is True, got


def test_a_deaf_waiter_still_finds_in_time_that_its_bound_resource_was_quarantined(make_pool, spawn_worker) -> None:
    """The session's own tries (``lease.SESSION_RETRY``) do not depend on being woken: a waiter
    that hears nothing and looks no sooner than LINE_POLL_MAX (120 s here) still finds, within
    a few seconds, that its bound resource can no longer serve it, and takes another. Before,
    its tries came only with its looks: a turn told before its LISTEN was in force (a loaded
    machine) left it asleep past its timeout."""
    make_pool("proxy", 3)
    got, quarantined = quarantined_while_waited(spawn_worker, "--deaf")
    assert got["event"] == "granted" and got["resource"] != quarantined and got["rebound"] is True, got


def test_negative_control_without_its_own_tries_a_deaf_waiter_sleeps_through_its_timeout(
    make_pool, spawn_worker
) -> None:
    """The same, the waiter's own tries of its bound resource turned off (``--no-session-retry``):
    nothing tells it that the resource was quarantined, and it is refused at its timeout. What
    serves the deaf waiter above is those tries, and they now come whatever its looks say."""
    make_pool("proxy", 3)
    got, _ = quarantined_while_waited(spawn_worker, "--deaf", "--no-session-retry", timeout=4)
    assert got["event"] == "refused", got


def test_a_binding_idle_past_session_idle_is_forgotten(make_pool) -> None:
    make_pool("proxy", 3)
    pool_policy("proxy", session_idle=1)
    lease = acquire("proxy", session="s", ttl=30)
    bound = lease.resource.pk
    lease.release()
    kept = acquire("proxy", session="s", ttl=30, timeout=0)  # within the second: the same
    assert kept.resource.pk == bound
    kept.release()
    time.sleep(1.3)
    # The old resource held by another: a live binding would wait for it (and time out at
    # once); a forgotten one is an ordinary grant, a new binding rather than a moved one.
    every = [acquire("proxy", ttl=30, timeout=0) for _ in range(3)]
    for lease in every:
        if lease.resource.pk != bound:
            lease.release()
    later = acquire("proxy", session="s", ttl=30, timeout=0)
    assert later.resource.pk != bound and later.rebound is False
    later.release()
    for lease in every:
        lease.release()


def test_a_bound_resource_not_free_in_time_is_named(make_pool) -> None:
    make_pool("proxy", 2)
    held = acquire("proxy", session="s", ttl=30)
    with pytest.raises(NoResourceAvailable, match="bound to session 's'"):
        acquire("proxy", session="s", ttl=30, timeout=0.5)
    held.release()


@pytest.mark.parametrize(
    ("session", "named"),
    [("", "session must be a non-empty string"), (7, "session must be a non-empty string"),
     ("s" * 201, "session must be at most 200 characters")],
)  # fmt: skip
def test_a_bad_session_is_refused_naming_it(make_pool, session: Any, named: str) -> None:
    make_pool("proxy", 1)
    with pytest.raises(ValueError, match=named):
        acquire("proxy", session=session)
    assert not SessionBinding.objects.exists() and not Resource.objects.filter(grant_token__gt="").exists()


def test_operators_see_each_resources_sessions(make_pool, admin_client) -> None:
    import io

    from django.core.management import call_command

    make_pool("proxy", 2)
    lease = acquire("proxy", session="acct-42", ttl=30)
    lease.release()
    out = io.StringIO()
    call_command("inspect_pool", "--json", stdout=out)
    shown = {r["name"]: r["sessions"] for r in json.loads(out.getvalue())["resources"]}
    assert shown[lease.resource.name] == ["acct-42"] and sum(map(len, shown.values())) == 1
    page = admin_client.get(f"/admin/resource_lease/resource/{lease.resource.pk}/change/")
    assert page.status_code == 200 and "acct-42" in page.content.decode()
