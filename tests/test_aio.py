"""asyncio (resource_lease.aio), with pytest-asyncio on every database: the same grants as the
sync API, waiting in line without blocking the event loop (a negative control that calls the
sync API on the loop is caught blocking it), a cancelled waiter leaving the line at once, and
@synchronized on coroutine functions."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.exceptions import SynchronousOnlyOperation

from resource_lease import (
    Config,
    Election,
    Group,
    LeaseError,
    LockHeld,
    SyncCallFromAsync,
    aacquire,
    acquire,
    alock,
    asemaphore,
    counter,
    lock,
    synchronized,
    watch,
)
from resource_lease.exceptions import NoResourceAvailable
from resource_lease.line import Line, waiters
from resource_lease.line import places as line_places
from resource_lease.offload import in_thread
from resource_lease.recipes.locks import LOCK_KIND

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


class Ticker:
    """Counts how often the event loop gets to run a coroutine ticking every 10 ms."""

    def __init__(self) -> None:
        self.ticks = 0
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            self.ticks += 1

    def __enter__(self) -> Ticker:
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()


async def places(kind: str, name: str) -> int:
    # Through the engine's own connections (closed after each test, whichever thread opened
    # them), not the ORM's, which a worker thread would keep open past the test database.
    return len(await in_thread(waiters, Line("default", kind, name), 100))


@pytest.fixture(autouse=True)
def _collect_ended_threads() -> Iterator[None]:
    # The event loop's worker threads end with it; their engine connections (thread-locals)
    # close once collected, which must happen before the test database is dropped.
    yield
    gc.collect()


@pytest.fixture
def pools(make_pool: Callable[..., Any]) -> None:
    """The pools these tests lease from, made before the event loop runs the test."""
    make_pool("aio", 1)
    make_pool("aio-mixed", 1)


async def until_in_line(kind: str, name: str) -> None:
    for _ in range(3000):
        if await places(kind, name):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"nobody took a place in line {kind}:{name}")


@pytest.mark.usefixtures("pools")
async def test_aacquire_gives_the_same_lease_and_its_async_methods() -> None:
    lease = await aacquire("aio", ttl=30)
    assert lease.resource.kind == "aio" and lease.fence >= 1
    assert await lease.ais_held()
    before = lease.expires_at
    assert await lease.arenew() >= before
    with pytest.raises(NoResourceAvailable):
        await aacquire("aio", ttl=30, timeout=0)
    assert await lease.arelease()
    assert not await lease.ais_held()
    async with aacquire("aio", ttl=30) as again:  # released on the way out
        assert again.fence > lease.fence
    assert not await again.ais_held()


async def test_a_bad_argument_is_a_value_error_and_writes_nothing() -> None:
    with pytest.raises(ValueError, match="ttl"):
        await alock("aio-bad", ttl=-1)
    with pytest.raises(ValueError, match="where"):
        await aacquire("aio-bad", where={"x": 1.5})
    assert await places(LOCK_KIND, "aio-bad") == 0


async def test_waiting_in_line_never_blocks_the_event_loop() -> None:
    held = await in_thread(lock, "aio-wait", ttl=30, timeout=0)
    with Ticker() as ticker:
        waiter = asyncio.get_running_loop().create_task(_take("aio-wait"))
        await until_in_line(LOCK_KIND, "aio-wait")
        ticks = ticker.ticks
        await asyncio.sleep(0.5)
        assert ticker.ticks - ticks >= 10  # the loop ran all along (50 would be perfect)
        assert await held.arelease()
        got = await asyncio.wait_for(waiter, 30)  # woken by the release in this process
    assert got.fence > held.fence
    await got.arelease()


async def _take(name: str) -> Any:
    return await alock(name, ttl=30, timeout=30)


async def test_negative_control_the_sync_api_on_the_loop_blocks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same wait through the sync API, called on the event loop: the ticker is starved,
    so the check above would catch a wait that blocks the loop. (Django refuses a database
    call from async code unless told otherwise, which is what this control must do.)"""
    held = await in_thread(lock, "aio-blocking", ttl=30, timeout=0)
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with Ticker() as ticker:
        await asyncio.sleep(0.05)
        ticks = ticker.ticks
        started = time.monotonic()
        with pytest.raises(LockHeld):
            lock("aio-blocking", ttl=30, timeout=0.5)  # blocks the loop for half a second
        assert time.monotonic() - started >= 0.5
        assert ticker.ticks - ticks <= 1
    await held.arelease()


async def test_a_cancelled_waiter_leaves_the_line_at_once() -> None:
    held = await in_thread(lock, "aio-cancel", ttl=30, timeout=0)
    waiter = asyncio.get_running_loop().create_task(_take("aio-cancel"))
    await until_in_line(LOCK_KIND, "aio-cancel")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await places(LOCK_KIND, "aio-cancel") == 0  # gone when the cancellation returned
    # Nothing of it is left holding the lock either: once released, a newcomer gets it.
    assert await held.arelease()
    again = await alock("aio-cancel", ttl=30, timeout=0)
    await again.arelease()


async def test_a_waiter_cancelled_while_its_place_is_being_taken_leaves_the_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cancellation arrives after the place was inserted and committed, while the thread
    that took it has not answered yet (held up here for 0.5 s): the place is still left at
    once, not after its ttl (CI found one left behind)."""
    held = await in_thread(lock, "aio-cancel-enter", ttl=30, timeout=0)
    taking = line_places.enter

    def slowly(*args: Any, **kwargs: Any) -> Any:
        place = taking(*args, **kwargs)
        time.sleep(0.5)
        return place

    monkeypatch.setattr(line_places, "enter", slowly)
    waiter = asyncio.get_running_loop().create_task(_take("aio-cancel-enter"))
    await until_in_line(LOCK_KIND, "aio-cancel-enter")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await places(LOCK_KIND, "aio-cancel-enter") == 0
    assert await held.arelease()


async def test_asemaphore_and_an_async_with_lock() -> None:
    first = await asemaphore("aio-sem", 2, ttl=30)
    second = await asemaphore("aio-sem", 2, ttl=30)
    with pytest.raises(LockHeld):
        await asemaphore("aio-sem", 2, ttl=30, timeout=0)
    await first.arelease()
    await second.arelease()
    async with alock("aio-with", ttl=30) as lease:
        assert await lease.ais_held()
    assert not await lease.ais_held()


async def test_synchronized_holds_the_lock_across_a_coroutines_awaits() -> None:
    inside: list[str] = []

    @synchronized("aio-sync:{0}", ttl=30, timeout=0)
    async def job(key: str) -> str:
        inside.append(key)
        await asyncio.sleep(0.3)
        return key

    running = asyncio.get_running_loop().create_task(job("a"))
    while not inside:
        await asyncio.sleep(0.01)
    with pytest.raises(LockHeld):  # the first still holds it, across its await
        await job("a")
    assert await job("b") == "b"  # another key is another lock
    assert await running == "a"
    assert await job("a") == "a"  # released when it returned


async def test_election_and_watch_with_async_with() -> None:
    seen: list[int] = []
    async with Election("aio-election", ttl=30) as election:
        assert await in_thread(election.is_leader)
    assert not await in_thread(election.is_leader)
    async with await in_thread(watch, "aio-topic", lambda payload, version: seen.append(version), poll=0.1) as w:
        assert not w.stopped.is_set()
    assert w.stopped.is_set()


@pytest.mark.usefixtures("pools")
async def test_a_coroutine_granted_at_its_first_attempt_pays_for_no_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller pays for the line only when there is one, on the loop as in a thread: on a
    free pool, ``aacquire`` builds no ``AsyncWaker`` and makes its attempt and its grant in one
    worker-thread hop after its arguments' (the line's steps took five). The control: a
    coroutine that has to wait builds its waker, and is served once the pool frees up."""
    from resource_lease.line import aio as line_aio

    hops: list[str] = []
    wakers: list[object] = []
    real_in_thread, real_waker_init = line_aio.in_thread, line_aio.AsyncWaker.__init__

    def counting(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__name__", repr(fn)))
        return real_in_thread(fn, *args, **kwargs)

    def recording(self: Any) -> None:
        wakers.append(self)
        real_waker_init(self)

    monkeypatch.setattr(line_aio, "in_thread", counting)
    monkeypatch.setattr(line_aio.AsyncWaker, "__init__", recording)
    lease = await aacquire("aio", ttl=30, timeout=30)
    assert (len(hops), wakers) == (2, [])  # the arguments' hop, then the attempt's and grant's
    waiter = asyncio.get_running_loop().create_task(aacquire("aio", ttl=30, timeout=30)._get())
    await until_in_line("aio", "")
    assert len(wakers) == 1  # the control: it waits, with a waker
    assert await lease.arelease()
    served = await asyncio.wait_for(waiter, 30)
    assert served.fence > lease.fence
    await served.arelease()


@pytest.mark.usefixtures("pools")
async def test_aacquire_waits_in_line_behind_a_sync_waiter() -> None:
    """Async and thread waiters share one line: served in the order they asked."""
    held = await in_thread(acquire, "aio-mixed", ttl=30)
    first = asyncio.get_running_loop().create_task(in_thread(acquire, "aio-mixed", ttl=30, timeout=30))
    await until_in_line("aio-mixed", "")
    second = asyncio.get_running_loop().create_task(aacquire("aio-mixed", ttl=30, timeout=30)._get())
    while await places("aio-mixed", "") < 2:
        await asyncio.sleep(0.01)
    assert await held.arelease()
    got_first = await asyncio.wait_for(first, 30)
    assert not second.done()
    await got_first.arelease()
    got_second = await asyncio.wait_for(second, 30)
    assert got_second.fence > got_first.fence
    await got_second.arelease()


async def test_arwlock_readers_share_and_a_waiting_writer_is_woken_without_blocking_the_loop() -> None:
    from resource_lease import arwlock
    from resource_lease.recipes.rwlock import RWLOCK_KIND

    rw = arwlock("aio-rw")
    first = await rw.read(ttl=30)
    second = await rw.read(ttl=30)
    with pytest.raises(LockHeld):
        await rw.write(ttl=30, timeout=0)
    with Ticker() as ticker:
        writer = asyncio.get_running_loop().create_task(_write(rw))
        await until_in_line(RWLOCK_KIND, "aio-rw")
        ticks = ticker.ticks
        await asyncio.sleep(0.3)
        assert ticker.ticks - ticks >= 5  # the loop ran while the writer waited
        await first.arelease()
        await second.arelease()
        got = await asyncio.wait_for(writer, 30)
    assert got.fence == second.fence + 1
    await got.arelease()
    async with rw.read(ttl=30) as lease:
        assert await lease.ais_held()
    assert not await lease.ais_held()


async def _write(rw: Any) -> Any:
    return await rw.write(ttl=30, timeout=30)


# -- a sync call on the loop is a programming error naming the twin; twins of every read ------


@pytest.mark.usefixtures("pools")
async def test_a_sync_call_on_the_loop_is_a_programming_error_naming_the_async_twin() -> None:
    # Before: DatabaseUnavailable "cannot connect ... You cannot call this from an async
    # context", an outage-class error (a LeaseError) for what is a bug in the caller.
    with pytest.raises(SyncCallFromAsync, match=r"acquire\(\) was called from async code.*aacquire") as caught:
        acquire("aio", ttl=30)
    assert not isinstance(caught.value, LeaseError)
    assert isinstance(caught.value, SynchronousOnlyOperation)
    with pytest.raises(SyncCallFromAsync, match=r"lock\(\) .*alock"):
        lock("aio-sync", ttl=30)
    lease = await aacquire("aio", ttl=30)
    with pytest.raises(SyncCallFromAsync, match=r"Lease\.release\(\) .*lease\.arelease\(\)"):
        lease.release()
    election = Election("aio-sync")
    with pytest.raises(SyncCallFromAsync, match=r"Election\.leader\(\) .*election\.aleader\(\)"):
        election.leader()
    assert await lease.arelease()


@pytest.mark.usefixtures("pools")
async def test_create_task_accepts_the_async_entry_points() -> None:
    # Before: TypeError, "a coroutine was expected, got <Acquiring ...>".
    task = asyncio.create_task(aacquire("aio", ttl=30))
    lease = await asyncio.wait_for(task, 30)
    assert await lease.arelease()
    locked = await asyncio.ensure_future(alock("aio-task", ttl=30))
    assert await locked.arelease()
    async with alock("aio-task", ttl=30) as again:  # still an async context manager
        assert again.fence > locked.fence


async def test_every_read_of_a_primitive_has_its_async_twin() -> None:
    election = Election("aio-reads")
    assert await election.aleader() is None and not await election.ais_leader()
    assert await election.astate() == {}
    await election.acampaign(timeout=0)
    assert await election.aleader() == election.lease.holder and await election.ais_leader()  # type: ignore[union-attr]
    await election.asave_state({"day": 3})
    assert (await election.astate()) == {"day": 3} == (await election.arecord())["state"]
    assert await election.aresign()

    group = Group("aio-reads", member="m1")
    assert await group.ajoin() is group
    assert await group.amembers() == ["m1"] and await group.asize() == 1 and await group.aindex() == 0
    assert await group.aview() == (["m1"], 0)
    assert await group.aowns("k") and await group.aowned(["a", "b"]) == ["a", "b"]
    assert await group.amembers(with_data=True) == {"m1": {}}
    assert await group.aleave()

    config = await in_thread(Config, "aio-reads", {"n": 1}, poll=0.01)
    assert await config.aget("n") == 1
    await config.aset("n", 2)
    assert await config.acompare_and_set("n", 2, 3)
    assert await config.aas_dict() == {"n": 3}
    await config.areset("n")
    assert await config.aget("n") == 1

    hits = counter("aio-reads")
    assert await hits.aadd(2) == 2 and await hits.avalue() == 2


async def test_every_dispenser_call_has_an_async_twin_that_runs_off_the_loop() -> None:
    """Issue 37 point 13: every read (and write) of a primitive has its async twin."""
    from resource_lease import Dispenser

    d = Dispenser("aio-twins", ttl=30)

    async def main() -> dict[str, object]:
        seen: dict[str, object] = {}
        seen["put"] = await d.aput({"k1": {"n": 1}, "k2": None})
        items = await d.aassign("w", limit=2)
        seen["assigned"] = sorted(item.key for item in items)
        seen["check"] = await d.acheck("w", items)
        seen["renew"] = await d.arenew("w", items)
        seen["done"] = await d.adone("w", items[:1])
        seen["release"] = await d.arelease("w", items[1:])
        seen["counts"] = await d.acounts()
        seen["empty"] = await d.ais_empty()
        seen["unfinished"] = await d.aunfinished()
        seen["finished"] = await d.afinished(["k1", "k2"])
        seen["items"] = len(await d.aitems())
        again = await d.aassign("w", limit=1)
        seen["fail"] = await d.afail("w", again)
        seen["retry"] = await d.aretry_failed()
        seen["recreate"] = await d.arecreate({"k3": None})
        return seen

    seen = await main()
    assert seen["put"] == 2 and seen["assigned"] == ["k1", "k2"] and seen["check"] is True
    assert seen["done"] == 1 and seen["release"] == 1
    assert seen["counts"] == {"pending": 1, "assigned": 0, "done": 1, "failed": 0}
    assert seen["empty"] is False and seen["finished"] == [("k1", "done")] and seen["items"] == 2
    assert seen["fail"] == 1 and seen["retry"] == 0
    assert seen["recreate"]["added"] == 1
