"""Waking waiters: in this process at once, from other processes by NOTIFY (PostgreSQL).

A waiter of the line (``resource_lease.line``) waits on a ``Waker``; the process's ``Board``
knows them by line and by place, so a release in this process (``after_release``) or a NOTIFY of
the release statement of another process (through the process's one LISTEN thread:
``db/listen.py``) wakes them:

- a release tells the waiter its row may serve that it may be its turn, on the channel of
  that waiter's own process (``turn_channel``, written on its place), naming the place:
  only that waiter wakes, and it tries at once (``Waker.take_turn``). The other processes
  hear nothing (each listening process paid some 55 us of CPU per release when every
  release woke them all: docs/benchmarks.md). A turn that reaches a waiter which no longer
  waits for it (it was served meanwhile, or gave up) is passed on (``pass_turn``).
- the line channel (``LINE_CHANNEL``, every listening process) wakes all of a process's
  waiters of a line: readers of an rwlock (those behind the first are served with it), and
  places without a channel. Those wake-ups are counted: each is a row freed in the line, so
  a waiter far back knows when enough have come for it to be first.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from resource_lease.db.connections import lease_connection
from resource_lease.db.listen import hub
from resource_lease.db.operations import ops
from resource_lease.exceptions import LeaseDatabaseError
from resource_lease.forking import at_fork
from resource_lease.keeper import keeper

logger = logging.getLogger("resource_lease")

LineKey = tuple[str, str, str]  # (alias, kind, name)
#: A row a release handed to a place: (place, row id, what the release said it granted or None).
Handed = tuple[int, int, "tuple[Any, ...] | None"]


class Waker:
    """How one waiter is woken: wake-ups are counted (each is a row freed in its line, or a
    waiter ahead of it gone), so a waiter far back in line knows when to look again."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._count = 0
        self._seen = 0
        self._turn = False
        self._handed: Handed | None = None

    def wake(self, *, turn: bool = False, handed: Handed | None = None) -> None:
        """Wake the waiter; ``turn``: a release told it that it may be its turn (it tries at
        once, however far back its last look saw it); ``handed``: (place, row id, grant) a
        release handed that place of this waiter's that row in its own statement (it takes its
        grant at once; ``grant``: what the release said it granted, or None: it is read).

        A hand-off is not a turn: a turn the waiter does not take is passed on as it leaves
        (``pass_turn``, a statement), and a row handed to it is served by its claim, or given
        back by its own release if it left."""
        with self._cond:
            self._count += 1
            self._turn = self._turn or turn
            if handed is not None:
                self._handed = handed
            self._cond.notify_all()

    def take_handed(self) -> Handed | None:
        """(place, row, grant) a release said it handed this waiter since the last call, or None."""
        with self._cond:
            handed, self._handed = self._handed, None
            return handed

    def take_turn(self) -> bool:
        """Whether a turn was told since the last call (and no longer)."""
        with self._cond:
            turn, self._turn = self._turn, False
            return turn

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
        self._places: dict[tuple[str, int], Waker] = {}

    def add_place(self, alias: str, place: int, waker: Waker) -> None:
        """Place ``place`` of ``alias`` is ``waker``'s: a turn told to it wakes that waiter."""
        with self._lock:
            self._places[alias, place] = waker

    def remove_place(self, alias: str, place: int) -> None:
        with self._lock:
            self._places.pop((alias, place), None)

    def wake_turn(
        self, alias: str, place: int, handed: int | None = None, grant: tuple[Any, ...] | None = None
    ) -> bool:
        """Tell the waiter of ``place`` it may be its turn (``handed``: a release handed it
        that row, ``grant``: and said what it granted); False if no waiter here has it."""
        with self._lock:
            waker = self._places.get((alias, place))
        if waker is None:
            return False
        waker.wake(turn=handed is None, handed=None if handed is None else (place, handed, grant))
        return True

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
        """A row (kind, name) may have come free: wake the waiters of its lines. A waiter of
        the kind's line (any row of it) counts the wake-up as one row freed, and tries once
        enough have come for its place; a waiter of the row's own line (a lock, an rwlock, an
        election) is told its turn, and tries: the line woken on ``LINE_CHANNEL`` is the
        row's whole line (readers of an rwlock behind the first, or a place the release did
        not see), and a count would undercount the releases whose turns were told to one
        waiter alone (a reader behind two writers, woken once, slept until its
        ``LINE_POLL_MAX`` look: lease_bench's liveness scenario, rwlock-mixed at 8 processes)."""
        if not self._wakers:
            return
        with self._lock:
            pool = list(self._wakers.get((alias, kind, ""), ()))
            own = list(self._wakers.get((alias, kind, name), ())) if name else []
        for waker in pool:
            waker.wake()
        for waker in own:
            waker.wake(turn=True)

    def wake_alias(self, alias: str) -> None:
        """Wake-ups of ``alias`` may have been missed (the listener reconnected): everyone
        tries."""
        with self._lock:
            wakers = [w for key, ws in self._wakers.items() if key[0] == alias for w in ws]
        for waker in wakers:
            waker.wake(turn=True)

    def waiting(self) -> dict[LineKey, int]:
        """How many callers of this process wait, per line (alias, kind, name)."""
        with self._lock:
            return {key: len(wakers) for key, wakers in self._wakers.items()}


_board = Board()
#: Seconds this process keeps listening on an alias's line channel after its last waiter
#: there stopped waiting (a caller that waits again and again does not LISTEN anew each time).
LINGER = 2.0


class _Subscription:
    """This process's subscription to the line channel of one alias and to its own turn
    channel there: counted by waiters, ended by the keeper LINGER seconds after the last one
    left (its ``keep`` step)."""

    def __init__(self, alias: str, tokens: list[int | None]) -> None:
        self.alias = alias
        self.tokens = tokens
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
        for token in self.tokens:
            hub().unsubscribe(token)
        return None


_subscriptions: dict[str, _Subscription] = {}
_subscribers_lock = threading.Lock()


def board() -> Board:
    return _board


def release(engine: Any, alias: str, kind: str, name: str, *, pk: int, holder: str, fence: int) -> bool:
    """Give a grant of this process back (``engine.release_to_line``: a lease's operations)
    and wake the waiters of this process it may serve (``after_release``); whether it was
    released (or handed to a place in line). The hand-off stays the line's business."""
    released, handed_to = engine.release_to_line(pk=pk, holder=holder, fence=fence)
    after_release(alias, kind, name, pk, released=released, handed_to=handed_to)
    return bool(released)


def after_release(alias: str, kind: str, name: str, pk: int, *, released: bool, handed_to: int) -> None:
    """This process released the row ``pk`` (``kind``, ``name``): if the release handed it to
    a place in line (``handed_to``), nothing is free for the others, and a waiter of this
    process that was handed it reads it at once (the release's NOTIFY tells one of another
    process); if it freed it, the waiters here need not wait for their next look."""
    if handed_to:
        _board.wake_turn(alias, handed_to, handed=pk)
    elif released:
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


def _on_turn(alias: str) -> Callable[[str | None], None]:
    def callback(payload: str | None) -> None:
        if payload is None:
            return  # the listener reconnected: the line channel's callback wakes everyone
        try:
            told = json.loads(payload)
            place, kind, name, *handed = told
            place = int(place)
            row = int(handed[0]) if handed else None
        except (ValueError, TypeError):
            logger.warning("a turn NOTIFY with an unexpected payload: %r", payload)
            return
        if row is not None:
            # A release handed the row to this place: its waiter takes it; one that left
            # meanwhile gives back what its place was handed as it leaves (``Waiting.cleanup``).
            _board.wake_turn(alias, place, handed=row, grant=tuple(told) if len(handed) > 1 else None)
            return
        if not _board.wake_turn(alias, place):
            # Its waiter was served meanwhile, or gave up: the turn goes to whoever is first
            # now (not from the LISTEN thread: it runs a statement).
            keeper().callbacks.call(_passing, pass_turn, alias, kind, name)

    return callback


class _Passing:
    """The keeper's owner of the turns passed on from the LISTEN thread."""


_passing = _Passing()

#: This process's own NOTIFY channel: releases tell its waiters their turn there.
_turn_channel = ""


def _channel(alias: str) -> str:
    return lease_connection(alias).dialect.line_channel


def turn_channel(alias: str) -> str:
    """Where this process hears that it may be one of its waiters' turn on ``alias`` (a
    place's ``channel``), or '' if ``alias`` cannot push (its waiters look)."""
    global _turn_channel
    if not _channel(alias):
        return ""
    if not _turn_channel:
        _turn_channel = f"rl_turn_{os.getpid()}_{secrets.token_hex(4)}"
    return _turn_channel


def pass_turn(alias: str, kind: str, name: str) -> None:
    """Tell the first waiters of the line (kind, name) that it may be their turn: a turn told
    to a waiter of this process that did not take it. Best effort: if the database cannot be
    told, the waiters find the free row at their next look."""
    try:
        ops(alias).line.pass_turn(kind, name)
    except LeaseDatabaseError as exc:
        logger.info("could not pass a turn in line %s on (its waiters look): %s", kind, exc)


def listen(alias: str) -> None:
    """Subscribe this caller to the wake-ups of ``alias`` (PostgreSQL: LISTEN on the line
    channel and on this process's turn channel, set up by the LISTEN thread: nothing waits for
    it). ``unlisten`` when done."""
    channel = _channel(alias)
    if not channel:
        return  # this database cannot push: the waiters look
    with _subscribers_lock:
        found = _subscriptions.get(alias)
        if found is None:
            tokens = [
                hub().subscribe(alias, channel, _on_notify(alias), payload=True),
                hub().subscribe(alias, turn_channel(alias), _on_turn(alias), payload=True),
            ]
            found = _subscriptions[alias] = _Subscription(alias, tokens)
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
    return bool(channel) and hub().listening(alias, channel) and hub().listening(alias, turn_channel(alias))


def forget_subscriptions() -> None:
    """Drop every line subscription at once (tests, before their database is dropped)."""
    with _subscribers_lock:
        found = list(_subscriptions.values())
        _subscriptions.clear()
    for each in found:
        keeper().cancel(each)
        for token in each.tokens:
            hub().unsubscribe(token)


def _after_fork_in_child() -> None:
    # The parent's waiters are not the child's; its LISTEN does not reach the child.
    global _board, _subscribers_lock, _turn_channel
    _board = Board()
    _subscriptions.clear()
    _subscribers_lock = threading.Lock()
    _turn_channel = ""  # the parent's: its turns are not the child's


at_fork(after_in_child=_after_fork_in_child)
