"""Letting go: close() and terminate() release, are idempotent and stop the thread's re-acquire
(even between its grant and its storing); nothing leaks, threads or connections."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest

from resource_lease import pool
from resource_lease.db.line import Turn
from resource_lease.exceptions import LeaseError
from resource_lease.holder import live_holders
from resource_lease.lease import Lease, acquire
from resource_lease.models import Resource
from tests.dbstats import open_connections
from tests.holder_helpers import Holder, ReportsStops, Searching, state_of, wait_for


def test_close_and_terminate_release_and_are_idempotent(make_pool: Any, holders: Any) -> None:
    row = make_pool("h", 1)[0]
    holder = holders()
    lease = holder.acquire(timeout=5)
    holder.start()
    assert holder.close() is True and holder.close() is False
    assert state_of(row.pk) == "free" and lease.released and holder.lease is None
    assert not holder.holding and not holder.lost
    assert holder.is_alive()  # closed, not terminated: idle, ready for another acquire
    holder.acquire(timeout=5)
    assert holder.fence == 2
    holder.terminate()
    holder.terminate()
    assert not holder.is_alive() and state_of(row.pk) == "free" and holder not in live_holders()
    with pytest.raises(LeaseError, match="terminated"):
        holder.acquire()


def test_the_context_manager_terminates_on_error(make_pool: Any) -> None:
    row = make_pool("h", 1)[0]
    with pytest.raises(KeyError), Holder() as holder:
        assert holder.holding and holder.is_alive()
        raise KeyError("work failed")
    assert not holder.is_alive() and state_of(row.pk) == "free"


def test_close_stops_the_threads_re_acquire_for_good(make_pool: Any, holders: Any) -> None:
    row = make_pool("h", 1)[0]
    holder = holders(ttl=2, renew_interval=0.8)
    holder.acquire(timeout=5)
    holder.start()
    pool.force_release([row])
    other = acquire("h", ttl=30, timeout=0)  # before the holder's next renewal notices
    assert holder.on_lost_called.wait(10)
    assert holder.lost and not holder.holding  # and it keeps trying to get one
    holder.close()
    other.release()
    time.sleep(1.5)  # longer than the largest backoff pause of an acquire still going on
    assert holder.lease is None and not holder.lost and state_of(row.pk) == "free"
    # At most the one attempt that was already in flight when close() came may have been
    # granted (then let go at once, see the tests below); no attempt after it.
    fence = Resource.objects.get(pk=row.pk).fence
    assert fence in (other.fence, other.fence + 1)
    time.sleep(1.5)
    assert Resource.objects.get(pk=row.pk).fence == fence and state_of(row.pk) == "free"
    assert holder.is_alive()


def _paused_after_grant(cls: type[Holder]) -> type[Holder]:
    """``cls`` whose thread, re-acquiring after a loss, stops right after the grant statement
    returned a fresh lease and before the holder stores it, until ``go_on`` is set."""

    class PausedAfterGrant(ReportsStops, cls):  # type: ignore[valid-type,misc]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.granted = threading.Event()  # the thread holds a grant nobody has seen yet
            self.go_on = threading.Event()
            self.paused_grant: Lease | None = None
            self.checked: list[int] = []  # fences is_valid() was asked about

        def is_valid(self) -> bool:
            lease = self.lease
            self.checked.append(-1 if lease is None else lease.fence)
            return super().is_valid()

        def _grab(self, turn: Turn, *, give_up_if_empty: bool) -> Lease | None:
            lease = super()._grab(turn, give_up_if_empty=give_up_if_empty)
            if lease is not None and threading.current_thread() is self and not self.granted.is_set():
                self.paused_grant = lease
                self.granted.set()
                assert self.go_on.wait(30), "the test never let the thread go on"
            return lease

    return PausedAfterGrant


@pytest.mark.parametrize("stop", ["close", "terminate"])
@pytest.mark.parametrize("cls", [Holder, Searching], ids=["engine", "search"])
def test_close_between_the_threads_re_acquire_grant_and_its_storing_leaves_nothing_held(
    make_pool: Any, holders: Any, cls: type[Holder], stop: str
) -> None:
    row = make_pool("h", 1)[0]
    holder = holders(_paused_after_grant(cls), ttl=2, renew_interval=0.2)
    old = holder.acquire(timeout=5)
    holder.start()
    pool.force_release([row])  # the next renewal is refused: on_lost, then a re-acquire
    assert holder.granted.wait(15), "the thread never re-acquired"
    fresh = holder.paused_grant
    assert fresh is not None and fresh.fence == old.fence + 1
    # The window: the database has granted the row to this holder, the holder does not know.
    assert holder.lease is None and state_of(row.pk) == "held"
    assert Resource.objects.get(pk=row.pk).holder == holder.holder

    stopper = None
    if stop == "close":
        assert holder.close() is False  # nothing stored yet, so nothing of its own to release
    else:  # terminate() from another thread: it joins the thread, which is paused
        stopper = threading.Thread(target=holder.terminate, kwargs={"timeout": 30})
        stopper.start()
        assert holder.closed.wait(10), "terminate() never got through close()"
    holder.go_on.set()
    assert holder.loss_handled.wait(15), "the thread's re-acquire never ended"
    if stopper is not None:
        stopper.join(30)
        assert not stopper.is_alive()
    else:
        assert holder.close() is False and holder.close() is False  # idempotent
        holder.terminate(timeout=30)
    assert not holder.is_alive()

    # The grant made in the window was released, by the database's clock, not left to expire.
    assert fresh.released
    assert holder.checked == [old.fence]  # a closed holder does not go on to check the grant
    assert holder.lease is None and not holder.holding and not holder.lost
    final = Resource.objects.get(pk=row.pk)
    assert state_of(row.pk) == "free" and final.grant_token == ""
    assert final.fence == fresh.fence  # and nothing was granted after it
    assert holder.close() is False


def _renewed_once(cls: type[Holder]) -> type[Holder]:
    class RenewedOnce(cls):  # type: ignore[valid-type,misc]
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.renewed = threading.Event()
            self.first_expiry: dt.datetime | None = None

        def keep_occupation(self) -> float:
            delay = super().keep_occupation()
            lease = self.lease
            if lease is not None and lease.expires_at != self.first_expiry:
                self.renewed.set()
            return delay

    return RenewedOnce


def test_no_thread_or_connection_leak_after_1000_acquire_terminate_cycles(make_pool: Any) -> None:
    make_pool("h", 2)
    holder_class = _renewed_once(Holder)

    def cycle(renew: bool) -> None:
        holder = holder_class(ttl=2, renew_interval=0.001 if renew else 1)
        lease = holder.acquire(timeout=5)
        holder.first_expiry = lease.expires_at
        holder.start()
        if renew:  # the thread has opened its own connection, which it must close
            assert holder.renewed.wait(10), "the thread never renewed"
        holder.terminate(timeout=10)
        assert not holder.is_alive()

    # Warm up: this thread's own connections open, and SQLite keeps (and reuses) the file
    # descriptor of a connection closed while another one held a lock.
    cycle(renew=True)
    cycle(renew=False)
    time.sleep(0.5)  # the server lets go of the warm-up thread's connection
    threads, connections = set(threading.enumerate()), open_connections()
    # Every tenth thread renews over a server connection of its own (~30 ms each on
    # PostgreSQL); the others are terminated while they wait for their first renewal.
    for i in range(1000):
        cycle(renew=i % 10 == 0)
    wait_for(lambda: open_connections() <= connections, timeout=10, what="connections to close")
    # Compared as sets: a thread of an earlier test may end meanwhile, none may be added.
    assert [t.name for t in threading.enumerate() if t not in threads] == []
    assert pool.counts()["h"]["free"] == 2
    assert live_holders() == []
