"""Waking waiters: in this process at once, from other processes by NOTIFY (PostgreSQL).

A waiter of the line (``resource_lease.line``) waits on a ``Waker``; the process's ``Board``
knows them by line, so a release in this process (``wake_row``) or a NOTIFY of the release
statement of another process (the line channel, through the process's one LISTEN thread:
``db/listen.py``) wakes them. Each wake-up is counted: one is a row freed in the line, so
a waiter far back knows when enough have come for it to be first.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable

from resource_lease.db.connections import lease_connection
from resource_lease.db.listen import hub
from resource_lease.keeper import keeper

logger = logging.getLogger("resource_lease")

LineKey = tuple[str, str, str]  # (alias, kind, name)


class Waker:
    """How one waiter is woken: wake-ups are counted (each is a row freed in its line, or a
    waiter ahead of it gone), so a waiter far back in line knows when to look again."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._count = 0
        self._seen = 0

    def wake(self) -> None:
        with self._cond:
            self._count += 1
            self._cond.notify_all()

    def wait(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for a wake-up; the wake-ups since the last wait."""
        with self._cond:
            if self._count == self._seen and timeout > 0:
                self._cond.wait(timeout)
            woken, self._seen = self._count - self._seen, self._count
            return woken


class Board:
    """This process's waiters by line, so a release here (or a NOTIFY) wakes them at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wakers: dict[LineKey, set[Waker]] = {}

    def add(self, key: LineKey, waker: Waker) -> None:
        with self._lock:
            self._wakers.setdefault(key, set()).add(waker)

    def remove(self, key: LineKey, waker: Waker) -> None:
        with self._lock:
            wakers = self._wakers.get(key)
            if wakers is not None:
                wakers.discard(waker)
                if not wakers:
                    del self._wakers[key]

    def wake_row(self, alias: str, kind: str, name: str) -> None:
        """A row (kind, name) may have come free: wake the waiters of its lines (any row of
        the kind, and that row by name)."""
        if not self._wakers:
            return
        with self._lock:
            wakers = [*self._wakers.get((alias, kind, ""), ()), *self._wakers.get((alias, kind, name), ())]
        for waker in wakers:
            waker.wake()

    def wake_alias(self, alias: str) -> None:
        """Wake-ups of ``alias`` may have been missed (the listener reconnected): wake all."""
        with self._lock:
            wakers = [w for key, ws in self._wakers.items() if key[0] == alias for w in ws]
        for waker in wakers:
            waker.wake()

    def waiting(self) -> dict[LineKey, int]:
        """How many callers of this process wait, per line (alias, kind, name)."""
        with self._lock:
            return {key: len(wakers) for key, wakers in self._wakers.items()}


_board = Board()
#: Seconds this process keeps listening on an alias's line channel after its last waiter
#: there stopped waiting (a caller that waits again and again does not LISTEN anew each time).
LINGER = 2.0


class _Subscription:
    """This process's subscription to the line channel of one alias: counted by waiters,
    ended by the keeper LINGER seconds after the last one left (its ``keep`` step)."""

    def __init__(self, alias: str, token: int | None) -> None:
        self.alias = alias
        self.token = token
        self.waiters = 0
        self.idle_since = 0.0

    def keep(self) -> float | None:
        with _subscribers_lock:
            if self.waiters:
                return None  # waited on again: the next unlisten schedules this anew
            left = self.idle_since + LINGER - time.monotonic()
            if left > 0:
                return left
            _subscriptions.pop(self.alias, None)
        hub().unsubscribe(self.token)
        return None


_subscriptions: dict[str, _Subscription] = {}
_subscribers_lock = threading.Lock()


def board() -> Board:
    return _board


def wake_row(alias: str, kind: str, name: str) -> None:
    """A row was freed by this process: its waiters here need not wait for a look."""
    _board.wake_row(alias, kind, name)


def _on_notify(alias: str) -> Callable[[str | None], None]:
    def callback(payload: str | None) -> None:
        if payload is None:
            _board.wake_alias(alias)  # notifications may have been missed: everyone looks
            return
        try:
            kind, name = json.loads(payload)
        except (ValueError, TypeError):
            logger.warning("a line NOTIFY with an unexpected payload: %r", payload)
            return
        _board.wake_row(alias, kind, name)

    return callback


def _channel(alias: str) -> str:
    return lease_connection(alias).dialect.line_channel


def listen(alias: str) -> None:
    """Subscribe this caller to the wake-ups of ``alias`` (PostgreSQL: LISTEN on the line
    channel, set up by the LISTEN thread: nothing waits for it). ``unlisten`` when done."""
    channel = _channel(alias)
    if not channel:
        return  # this database cannot push: the waiters look
    with _subscribers_lock:
        found = _subscriptions.get(alias)
        if found is None:
            token = hub().subscribe(alias, channel, _on_notify(alias), payload=True)
            found = _subscriptions[alias] = _Subscription(alias, token)
        found.waiters += 1


def unlisten(alias: str) -> None:
    """This caller stopped waiting on ``alias``; the subscription lingers a while."""
    with _subscribers_lock:
        found = _subscriptions.get(alias)
        if found is None:
            return
        found.waiters -= 1
        if found.waiters > 0:
            return
        found.idle_since = time.monotonic()
    keeper().schedule(found, LINGER)


def pushed(alias: str) -> bool:
    """Whether a release on ``alias`` wakes this process's waiters now (the LISTEN is in force)."""
    channel = _channel(alias)
    return bool(channel) and hub().listening(alias, channel)


def forget_subscriptions() -> None:
    """Drop every line subscription at once (tests, before their database is dropped)."""
    with _subscribers_lock:
        found = list(_subscriptions.values())
        _subscriptions.clear()
    for each in found:
        keeper().cancel(each)
        hub().unsubscribe(each.token)


def _after_fork_in_child() -> None:
    # The parent's waiters are not the child's; its LISTEN does not reach the child.
    global _board, _subscribers_lock
    _board = Board()
    _subscriptions.clear()
    _subscribers_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
