"""``Watch``: a poll of the database, run by the keeper, that calls a user's callback.

Every watch of the library is one of these: ``watch(topic)``, ``Config.watch`` and
``Group.watch``. The keeper (``resource_lease.keeper``) runs the watch's ``check`` every
``poll`` seconds, at once when PostgreSQL notifies its channel (``db/listen.py``), and at
once after a callback returns (so changes made during a slow callback are caught up with in
one go). ``check(emit)`` reads the database and calls ``emit(*args)`` for each change;
each becomes a call ``callback(*args)`` on the watch's own callback thread, never on the
keeper's: calls run in order, one at a time, on one thread, and a slow one delays neither
the keeper nor the next poll's read. While calls are pending the watch does not read again
(a change is then delivered once, the latest). A database error is logged (the first of a
run loudly, with its traceback) and the watch goes on polling; once the database answers,
the next ``check`` catches up. A callback that raises is logged and the watch goes on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from resource_lease.db.listen import hub
from resource_lease.keeper import keeper
from resource_lease.offload import in_thread

logger = logging.getLogger("resource_lease")

#: Seconds ``Watch.stop()`` waits at most for a read running now, by default.
STOP_WAIT = 5.0

Emit = Callable[..., None]
Check = Callable[[Emit], None]


class Watch:
    """A running watch: ``stop()`` ends it (see the module's docstring)."""

    def __init__(
        self,
        *,
        name: str,
        using: str,
        poll: float,
        check: Check,
        callback: Callable[..., Any],
        wake_channel: str | None = None,
    ) -> None:
        self.name = name
        self.using = using
        self.poll = poll
        self._check = check
        self._callback = callback
        self._wake_channel = wake_channel
        self._lock = threading.Lock()
        self._pending = 0  # callbacks queued or running
        self._failing = False
        self._subscription: int | None = None
        self._stopping = threading.Event()
        #: Set once the watch has stopped: no callback runs after it is set.
        self.stopped = threading.Event()
        #: Database errors met so far (the watch goes on after each).
        self.errors = 0

    def __repr__(self) -> str:
        state = "stopped" if self.stopped.is_set() else "running"
        return f"<Watch {self.name!r} poll={self.poll:g}s {state}>"

    @property
    def alias(self) -> str:
        """The database alias (``using``), by its older name."""
        return self.using

    def start(self) -> Watch:
        """Start polling (at once, then every ``poll`` seconds)."""
        current = keeper()
        current.callbacks.pin(self)
        if self._wake_channel is not None:
            self._subscription = hub().subscribe(self.using, self._wake_channel, lambda: keeper().wake(self))
        # Held by the keeper until stop(), as a thread runs until it ends: a watch whose handle
        # is dropped goes on (``keeper().held()`` lists the running ones).
        current.schedule(self, 0.0, hold=True)
        logger.info("watch %r started (poll %gs); it runs until stop()", self.name, self.poll)
        return self

    def is_alive(self) -> bool:
        """Whether the watch runs (started, not stopped)."""
        return not self._stopping.is_set() and keeper().scheduled(self)

    @property
    def alive(self) -> bool:
        return self.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Stop watching: no callback starts and no read of the database runs after this
        returns (a read running now is waited for, up to ``timeout`` seconds, ``STOP_WAIT`` by
        default; called from a callback, the callback finishes first)."""
        self._stopping.set()
        current = keeper()
        current.cancel(self)
        # A read running now ends first (up to STOP_WAIT s by default: a read may hang on a
        # server that is down): none starts or runs after.
        current.finish(self, STOP_WAIT if timeout is None else timeout)
        hub().unsubscribe(self._subscription)
        current.callbacks.unpin(self)
        self.stopped.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the watch to have stopped; whether it has."""
        return self.stopped.wait(timeout)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def astop(self, timeout: float | None = None) -> None:
        """``stop()`` for async code (it may wait for a callback that is running)."""

        await in_thread(self.stop, timeout)

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()

    def listener_pid(self) -> int | None:
        """The server process id of the LISTEN connection waking this watch (PostgreSQL)."""
        return hub().backend_pid(self.using) if self._subscription is not None else None

    # -- the keeper's job ---------------------------------------------------------------

    def keep(self) -> float | None:
        """One poll: read and emit the changes; seconds until the next."""
        if self._stopping.is_set():
            return None
        with self._lock:
            if self._pending:
                return self.poll  # the last callback's end wakes us
        try:
            self._check(self._emit)
        except Exception as exc:
            self.errors += 1
            if not self._failing:
                logger.error(
                    "watch %r: cannot read the database, retrying every %gs", self.name, self.poll, exc_info=True
                )
            else:
                logger.debug("watch %r: still failing: %s", self.name, exc)
            self._failing = True
        else:
            if self._failing:
                logger.warning("watch %r: the database answers again; caught up", self.name)
            self._failing = False
        return self.poll

    def _emit(self, *args: Any) -> None:
        with self._lock:
            self._pending += 1
        keeper().callbacks.call(self, self._deliver, args)

    def _deliver(self, args: tuple[Any, ...]) -> None:
        try:
            if not self._stopping.is_set():
                self._callback(*args)
        except Exception:
            logger.exception("watch %r: the callback failed for %r; watching on", self.name, args)
        finally:
            with self._lock:
                self._pending -= 1
                caught_up = not self._pending
            if caught_up and not self._stopping.is_set():
                keeper().wake(self)  # what changed during the callback is read now


__all__ = ["Watch"]
