"""rwlock(name).read() / .write(): many readers or one writer, fenced, writers not starved, on
the real database (the ledger of processes racing, killed and paused, is in
tests/test_rwlock_ledger.py)."""

from __future__ import annotations

import math
import threading
import time

import pytest

import resource_lease
from resource_lease import Lease, LockHeld, lock, named, rwlock
from resource_lease.models import Resource, Waiter
from resource_lease.pool import force_release
from resource_lease.recipes.rwlock import RWLOCK_KIND, ReadLease

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _forget_created_rows():
    named._known.clear()


def row(name: str) -> Resource:
    return Resource.objects.get(kind=RWLOCK_KIND, name=name)


def test_many_readers_share_it_and_every_grant_raises_the_one_fence() -> None:
    rw = rwlock("catalogue")
    first = rw.read(ttl=30, auto_renew=False)
    second = rw.read(ttl=30, auto_renew=False, holder="other")
    assert isinstance(first, Lease) and isinstance(first, ReadLease)
    assert (first.fence, second.fence) == (1, 2)
    assert first.is_held() and second.is_held()
    assert row("catalogue").readers == 2
    with pytest.raises(LockHeld, match="held for reading by 2 reader"):
        rw.write(ttl=30, timeout=0)
    assert first.release() and first.is_held() is False and second.is_held()
    assert second.release()
    writer = rw.write(ttl=30, auto_renew=False)
    assert type(writer) is Lease and writer.fence == 3  # above every reader's
    with pytest.raises(LockHeld, match="held for writing"):
        rw.read(ttl=30, timeout=0)
    with pytest.raises(LockHeld, match="held for writing"):
        rw.write(ttl=30, timeout=0)
    assert writer.release()
    again = rw.read(ttl=30, auto_renew=False)
    assert again.fence == 4 and row("catalogue").readers == 1
    assert again.release() and row("catalogue").readers == 0


def test_a_read_grant_is_renewed_released_once_and_refused_after_a_writer() -> None:
    rw = rwlock("renewed")
    reader = rw.read(ttl=1, auto_renew=False)
    expiry = reader.renew(ttl=30)
    assert expiry == row("renewed").busy_before
    assert reader.release() and not reader.release()  # once
    writer = rw.write(ttl=0.3, auto_renew=False)
    time.sleep(0.4)  # the writer's grant expires unreleased; a new read period starts
    late = rw.read(ttl=30, auto_renew=False)
    assert late.fence == writer.fence + 1 and row("renewed").took_over
    assert late.release()


def test_a_reader_of_an_earlier_period_cannot_renew_nor_release_the_next_one() -> None:
    rw = rwlock("periods")
    old = rw.read(ttl=0.3, auto_renew=False)
    time.sleep(0.4)  # its period expires with it
    new = rw.read(ttl=30, auto_renew=False, holder="new")
    assert row("periods").readers == 1 and row("periods").read_fence == new.fence
    assert old.is_held() is False
    assert old.release() is False  # would count the new reader out
    assert row("periods").readers == 1
    with pytest.raises(LockHeld):
        rw.write(timeout=0)
    assert new.release()


def test_a_writer_waits_for_the_readers_and_readers_after_it_wait_for_it() -> None:
    rw = rwlock("line")
    reader = rw.read(ttl=30, auto_renew=False)
    got: dict[str, Lease] = {}

    def write() -> None:
        got["writer"] = rw.write(ttl=30, timeout=10, holder="writer", auto_renew=False)

    thread = threading.Thread(target=write)
    thread.start()
    deadline = time.monotonic() + 5
    while not Waiter.objects.filter(kind=RWLOCK_KIND, name="line", shared=False).exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # A writer waits: a newcomer reader is refused although the rwlock is read-held.
    with pytest.raises(LockHeld, match="wait in line"):
        rw.read(ttl=30, timeout=0)
    assert reader.release()
    thread.join(10)
    assert got["writer"].fence == reader.fence + 1
    assert got["writer"].release()


def test_readers_waiting_behind_a_writer_are_all_served_when_it_releases() -> None:
    rw = rwlock("together")
    writer = rw.write(ttl=30, auto_renew=False)
    got: list[Lease] = []

    def read(i: int) -> None:
        got.append(rw.read(ttl=30, timeout=10, holder=f"r{i}", auto_renew=False))

    threads = [threading.Thread(target=read, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while Waiter.objects.filter(kind=RWLOCK_KIND, name="together", shared=True).count() < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert writer.release()
    for t in threads:
        t.join(10)
    assert len(got) == 3 and row("together").readers == 3
    assert sorted(lease.fence for lease in got) == [writer.fence + 1, writer.fence + 2, writer.fence + 3]
    for lease in got:
        assert lease.release()


def test_the_context_manager_and_auto_renewal() -> None:
    with rwlock("ctx").read(ttl=0.6) as lease:  # renewed in the background (lock()'s default)
        time.sleep(1.0)
        assert lease.is_held() and not lease.lost
    assert row("ctx").readers == 0 and row("ctx").grant_token == ""
    with rwlock("ctx").write(ttl=30) as lease:
        assert lease.is_held()
    assert not lease.is_held()


def test_a_fenced_block_of_a_reader_is_refused_once_its_period_is_over() -> None:
    reader = rwlock("fenced").read(ttl=30, auto_renew=False)
    with reader.fenced():
        pass
    force_release([row("fenced").pk])  # an operator ends the period
    with pytest.raises(resource_lease.LeaseLost):
        with reader.fenced():
            pass
    assert reader.lost


def test_an_rwlock_is_not_a_lock_of_the_same_name() -> None:
    held = lock("shared-name", ttl=30, auto_renew=False)
    reader = rwlock("shared-name").read(ttl=30, auto_renew=False)
    assert held.release() and reader.release()


@pytest.mark.parametrize(
    ("argument", "call"),
    [
        ("name", lambda: rwlock("")),
        ("ttl", lambda: rwlock("x").read(ttl=-1)),
        ("ttl", lambda: rwlock("x").write(ttl=math.nan)),
        ("timeout", lambda: rwlock("x").read(timeout=-1)),
        ("priority", lambda: rwlock("x").write(priority="high")),
        ("auto_renew", lambda: rwlock("x").read(auto_renew="yes")),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument_and_writes_nothing(argument, call) -> None:
    with pytest.raises(ValueError, match=argument):
        call()
    assert not Resource.objects.filter(kind=RWLOCK_KIND).exists()


def test_exported_from_the_package() -> None:
    assert resource_lease.rwlock is rwlock
    assert "rwlock" in resource_lease.__all__ and "arwlock" in resource_lease.__all__


# -- what operators see ------------------------------------------------------------------------

RWLOCKS = "/admin/resource_lease/rwlockrow/"


def test_the_admin_page_shows_readers_and_the_writer(staff) -> None:
    readers = [rwlock("catalogue").read(ttl=120, holder=f"reader-{i}", auto_renew=False) for i in range(2)]
    writer = rwlock("prices").write(ttl=120, holder="host-w:7:main", auto_renew=False)
    rwlock("idle").write(ttl=120, auto_renew=False).release()
    response = staff(superuser=True).get(RWLOCKS)
    assert response.status_code == 200
    html = response.content.decode().replace("<wbr>", "")
    assert "catalogue" in html and "prices" in html and "idle" in html
    assert "2 readers" in html and "reader-1" in html  # the last reader granted
    assert "a writer" in html and "host-w:7:main" in html
    for lease in (*readers, writer):
        assert lease.release()


def test_inspect_locks_lists_rwlocks_with_their_mode(capsys) -> None:
    import json

    from django.core.management import call_command

    readers = [rwlock("catalogue").read(ttl=120, holder=f"reader-{i}", auto_renew=False) for i in range(3)]
    writer = rwlock("prices").write(ttl=120, holder="writer", auto_renew=False)
    call_command("inspect_locks", "--json")
    data = {e["name"]: e for e in json.loads(capsys.readouterr().out)["rwlocks"]}
    assert data["catalogue"]["mode"] == "read" and data["catalogue"]["readers"] == 3
    assert data["catalogue"]["holder"] == "reader-2" and data["catalogue"]["fence"] == 3
    assert data["prices"]["mode"] == "write" and data["prices"]["holder"] == "writer"
    call_command("inspect_locks")
    text = capsys.readouterr().out
    assert "RW locks: 2" in text and "read (3)" in text and "write" in text
    for lease in (*readers, writer):
        assert lease.release()
