"""Following an election without campaigning: ``Election.observe`` and ``Election.watch``.

Every change of leadership is reported, in order, none skipped: ``callback(leader, fence)``
for each term (the fence the election row's grant gave it), and ``(None, fence)`` when the
observer finds nobody leading (``fence`` then is the last term's). A one-off read of the
current leader (``Election.leader()``) cannot promise that: two terms that begin and end
between two reads are never seen. So the winner of each term writes it down in the
leadership log (``models.LeadershipTerm``, ``db/terms.py``) right after its grant and before
it acts as leader, together with the term before it, and only while its grant is live.

An observer (a ``watching.Watch``, polled by the keeper every ``poll`` seconds, woken at
once on PostgreSQL by the NOTIFY of the statement that wrote the term or of a resignation)
reads, in this order:

1. the election's row: its current fence ``F``, who holds it and who held ``F - 1`` (the
   grant's ``previous_holder``), and whether ``F`` is live, by the database's clock. These
   are facts about terms ``F`` and ``F - 1`` even if their winners died before writing them
   down (so a term the observer saw is reported);
2. the log's terms after the last one reported. Once the row is at ``F``, no term before
   ``F - 1`` can be written any more (a term is written only while it or the next one is
   live), so the log read second holds every term before ``F - 1`` that will ever be there.

It reports the terms up to ``F`` in fence order, then ``None`` if ``F`` is not live. A term
whose winner and whose successor both died before writing anything, while no observer was
looking, was never acted on and is not in the log: it cannot be reported, and nothing else
is skipped.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from resource_lease import named
from resource_lease.db.operations import ops
from resource_lease.db.terms import TERMS_READ
from resource_lease.db.topics import channel
from resource_lease.offload import in_thread
from resource_lease.watching import Watch

logger = logging.getLogger("resource_lease")

OnChange = Callable[[str | None, int], Any]


def observers_channel(name: str) -> str:
    """The NOTIFY channel that wakes the observers of election ``name`` (PostgreSQL)."""
    return channel("election", name)


class Observer:
    """The check of one observing ``Watch``: what it has reported, and the next look."""

    def __init__(self, kind: str, name: str, using: str) -> None:
        self.kind, self.name, self.using = kind, name, using
        #: The last term reported (None before the first look), and whether nobody led then.
        self.fence: int | None = None
        self.vacant = True

    def check(self, emit: Callable[..., None]) -> None:
        snapshot = named.read(self.using, self.kind, [self.name])  # first the row ...
        row = snapshot.rows.get(self.name)
        top = row.fence if row is not None else 0
        live = snapshot.live(self.name) is not None
        if self.fence is None:  # the first look: the state now
            self.fence, self.vacant = top, not live
            emit(row.holder if live and row is not None else None, top)
            return
        if top < self.fence:
            logger.warning(
                "election %r: its row's fence went down (%d < %d): was the row deleted? Waiting for it to pass %d",
                self.name,
                top,
                self.fence,
                self.fence,
            )
            return
        terms: dict[int, str] = {}
        if top > self.fence:
            written = ops(self.using).terms.terms_after(self.name, self.fence)  # ... then the log
            terms.update(written)
            if len(written) >= TERMS_READ and written[-1][0] < top - 1:
                # More terms than one read: report these; the rest at the next look, which
                # comes at once (the watch looks again when the calls are done).
                top, live = written[-1][0], True
            else:
                assert row is not None
                terms[top] = row.holder
                if top - 1 > self.fence and row.previous_holder:
                    terms[top - 1] = row.previous_holder
        for fence in sorted(f for f in terms if f <= top):
            emit(terms[fence], fence)
            self.fence, self.vacant = fence, False
        if not live and not self.vacant:
            emit(None, self.fence)
            self.vacant = True


def observe(kind: str, name: str, using: str, callback: OnChange, *, poll: float) -> Watch:
    """Start an observing ``Watch`` of the election row ``(kind, name)`` (see the module)."""
    observer = Observer(kind, name, using)
    return Watch(
        name=f"election:{name}",
        using=using,
        poll=poll,
        check=observer.check,
        callback=callback,
        wake_channel=observers_channel(name),
    ).start()


_STOP = object()


class LeadershipFeed:
    """``Election.watch()``: the changes of leadership as an iterator of ``(leader, fence)``
    (``for`` blocks the thread, ``async for`` only the task), the current state first. Ends
    after ``stop()`` (also on leaving ``with`` / ``async with``)."""

    def __init__(self, kind: str, name: str, using: str, *, poll: float) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._watch = observe(kind, name, using, self._put, poll=poll)

    def __repr__(self) -> str:
        return f"<LeadershipFeed {self._watch.name!r}>"

    def _put(self, item: Any, fence: int | None = None) -> None:
        self._queue.put(item if item is _STOP else (item, fence))
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    def stop(self) -> None:
        """End the feed: iteration stops after the changes already delivered."""
        self._watch.stop()
        self._put(_STOP)

    def __iter__(self) -> LeadershipFeed:
        return self

    def __next__(self) -> tuple[str | None, int]:
        item = self._queue.get()
        if item is _STOP:
            self._queue.put(_STOP)  # every later next() ends too
            raise StopIteration
        return item  # type: ignore[no-any-return]

    def __aiter__(self) -> LeadershipFeed:
        return self

    async def __anext__(self) -> tuple[str | None, int]:
        event = asyncio.Event()
        waiter = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.append(waiter)
        try:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    await event.wait()
                    event.clear()
                    continue
                if item is _STOP:
                    self._queue.put(_STOP)
                    raise StopAsyncIteration
                return item  # type: ignore[no-any-return]
        finally:
            with self._lock:
                self._waiters.remove(waiter)

    def __enter__(self) -> LeadershipFeed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> LeadershipFeed:
        return self

    async def __aexit__(self, *exc: object) -> None:

        await in_thread(self.stop)


__all__ = ["LeadershipFeed", "Observer", "observe", "observers_channel"]
