"""lock_delay= on lock(), semaphore(), rwlock().read/.write() and acquire(): a grant that
EXPIRED without being released (its holder vanished) is granted to nobody until lock_delay
seconds after its expiry, by the database's clock; a released one is free at once. Holders
are real processes, SIGKILLed; the negative control is the same check against a grant
statement without the delay's condition (swapped in this test process only)."""

from __future__ import annotations

import datetime as dt
import math
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from resource_lease import Lease, LockHeld, NoResourceAvailable, acquire, lock, named, rwlock, semaphore
from resource_lease.db.connections import lease_connection
from resource_lease.models import Resource

pytestmark = pytest.mark.django_db(transaction=True)

TTL = 1.0
DELAY = 2.0


@pytest.fixture(autouse=True)
def _forget_created_rows():
    named._known.clear()


def take(family: str, name: str, **options: Any) -> Lease:
    options = {"ttl": 30, **options}
    if family == "lock":
        return lock(name, auto_renew=False, **options)
    if family == "semaphore":
        return semaphore(name, 1, auto_renew=False, **options)
    if family in ("read", "write"):
        return getattr(rwlock(name), family)(auto_renew=False, **options)
    return acquire(name, **options)


def held_by_a_process(spawn_worker, family: str, name: str, *, release: bool = False) -> dt.datetime:
    """A process takes it with lock_delay=DELAY; killed at once (or after releasing it). The
    grant's expiry by the database's clock."""
    args = ["--what", f"{family}:{name}", "--ttl", str(TTL), "--lock-delay", str(DELAY)]
    proc = spawn_worker("tests.procs.delay_holder", *args, *(["--release"] if release else []), stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "HELD", line
    if release:
        assert proc.stdout.readline().strip() == "RELEASED"
        proc.wait(timeout=30)
    else:
        proc.kill()  # SIGKILL: the grant is never released
        proc.wait(timeout=30)
    return dt.datetime.fromisoformat(line[1])


#: (the killed or releasing holder's, the next caller's): a reader after a dead reader joins
#: its read period at once (readers share), so an rwlock's cases cross modes.
CASES = [("lock", "lock"), ("write", "write"), ("read", "write"), ("write", "read"), ("pool", "pool")]


@pytest.fixture
def pool_of_one(make_pool: Callable[..., Any]) -> None:
    make_pool("delayed", 1)


def name_of(family: str) -> str:
    return {"pool": "delayed", "lock": "delayed-lock"}.get(family, "delayed-rw")


def granted_at(lease: Lease) -> dt.datetime:
    """When the grant was made, read back from the database (its clock)."""
    acquired = Resource.objects.get(pk=lease.resource.pk).acquired_at
    assert acquired is not None
    return acquired


@pytest.mark.usefixtures("pool_of_one")
@pytest.mark.parametrize(("holder", "caller"), CASES)
def test_a_killed_holders_grant_is_not_granted_again_before_expiry_plus_delay(
    spawn_worker, holder: str, caller: str
) -> None:
    name = name_of(holder)
    expired_at = held_by_a_process(spawn_worker, holder, name)
    waiter = take(caller, name, timeout=30)  # waits in line through the expiry and the delay
    at = granted_at(waiter)
    print(f"{holder} -> {caller}: granted {(at - expired_at).total_seconds():.3f}s after the expiry (delay {DELAY}s)")
    assert at >= expired_at + dt.timedelta(seconds=DELAY)
    assert waiter.release()


@pytest.mark.usefixtures("pool_of_one")
@pytest.mark.parametrize(("holder", "caller"), CASES)
def test_a_released_grant_is_free_at_once(spawn_worker, holder: str, caller: str) -> None:
    name = name_of(holder)
    held_by_a_process(spawn_worker, holder, name, release=True)
    lease = take(caller, name, timeout=0)  # one attempt, no waiting: free at once
    assert lease.release()


@contextmanager
def without_the_delay_condition() -> Iterator[None]:
    """The negative control: this thread's grant statements with the lock delay's condition
    made always true (the library's own statements are untouched elsewhere)."""
    dialect = lease_connection().dialect
    # Every form of every grant (PostgreSQL: a waiter's grant that leaves its place too).
    tables = [dialect.sql, *dialect.forms.values(), *([dialect.line.leaving] if dialect.line.leaving else [])]
    saved = [dict(sql) for sql in tables]
    over = dialect.sql["DELAY_OVER"]
    for sql in tables:
        for key, text in sql.items():
            sql[key] = text.replace(over, "(1 = 1)")
    try:
        yield
    finally:
        for sql, before in zip(tables, saved, strict=True):
            sql.clear()
            sql.update(before)


@pytest.mark.usefixtures("pool_of_one")
@pytest.mark.parametrize("family", ["lock", "pool"])
def test_negative_control_a_grant_without_the_delay_is_caught(spawn_worker, family: str) -> None:
    name = name_of(family)
    expired_at = held_by_a_process(spawn_worker, family, name)
    with without_the_delay_condition():
        waiter = take(family, name, timeout=30)
    at = granted_at(waiter)
    print(f"negative control ({family}): granted {(at - expired_at).total_seconds():.3f}s after the expiry")
    assert at < expired_at + dt.timedelta(seconds=DELAY), "the check did not notice a grant inside the delay"
    assert waiter.release()


def test_within_the_delay_a_caller_is_refused_naming_the_expired_holder() -> None:
    lease = lock("delay-held", ttl=0.3, auto_renew=False, lock_delay=30)
    time.sleep(0.5)  # expired unreleased: in its lock delay
    with pytest.raises(LockHeld, match="in its lock delay until .* let its grant expire without releasing it"):
        lock("delay-held", ttl=30, timeout=0)
    with pytest.raises(LockHeld):
        lock("delay-held", ttl=30, timeout=0, lock_delay=0)  # the holder's delay holds, not the caller's
    assert Resource.objects.get(kind="@lock", name="delay-held").lock_delay == 30
    assert not lease.release()  # expired: nothing to give back
    semaphore("delay-sem", 1, ttl=0.3, auto_renew=False, lock_delay=30)
    time.sleep(0.5)
    with pytest.raises(LockHeld, match="lock delay"):
        semaphore("delay-sem", 1, ttl=30, timeout=0)
    rwlock("delay-rw").write(ttl=0.3, auto_renew=False, lock_delay=30)
    time.sleep(0.5)
    with pytest.raises(LockHeld, match="lock delay"):
        rwlock("delay-rw").read(ttl=30, timeout=0)


def test_the_admin_and_inspect_locks_show_the_delay(staff, capsys) -> None:
    import json

    from django.core.management import call_command

    lock("delay-shown", ttl=0.3, auto_renew=False, lock_delay=60)
    time.sleep(0.5)
    html = staff(superuser=True).get("/admin/resource_lease/lockrow/").content.decode()
    assert "rl-badge rl-expired" in html and "lock delay until" in html
    call_command("inspect_locks", "--json")
    entry = json.loads(capsys.readouterr().out)["locks"][0]
    assert entry["name"] == "delay-shown" and entry["lock_delay_until"]


@pytest.mark.parametrize("value", [-1, -0.5, math.nan, math.inf, True, "1", None])
@pytest.mark.parametrize("family", ["lock", "semaphore", "read", "write"])
def test_a_bad_lock_delay_is_a_value_error_naming_it_and_writes_nothing(family: str, value: Any) -> None:
    with pytest.raises(ValueError, match="lock_delay"):
        take(family, "bad-delay", lock_delay=value)
    assert not Resource.objects.filter(name__in=["bad-delay", "0000"]).exists()


def test_a_bad_lock_delay_on_acquire_writes_nothing(make_pool: Callable[..., Any]) -> None:
    make_pool("bad-delay", 1)
    with pytest.raises(ValueError, match="lock_delay"):
        acquire("bad-delay", lock_delay=-1)
    assert Resource.objects.get(kind="bad-delay").fence == 0
    with pytest.raises(NoResourceAvailable):
        acquire("nothing-here", lock_delay=1)


def test_lease_task_takes_lease_lock_delay_and_refuses_a_bad_one() -> None:
    from tests.test_lease_quarantine import declare, used

    with pytest.raises(ValueError, match="lease_lock_delay"):
        declare(used, lease_kind="proxy", lease_lock_delay=-1)
    assert declare(used, lease_kind="proxy", lease_lock_delay=5).lease_lock_delay == 5


def test_the_async_twins_check_lock_delay_too() -> None:
    import asyncio

    from resource_lease import alock, arwlock

    async def ask(call: Any) -> None:
        await call

    for call in (lambda: alock("x", lock_delay=-1), lambda: arwlock("x").write(lock_delay=math.nan)):
        with pytest.raises(ValueError, match="lock_delay"):
            asyncio.run(ask(call()))
