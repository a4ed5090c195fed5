"""PostgreSQL LISTEN: one thread per process that hears every channel a watch waits on.

A change of a topic or a config namespace is one statement that also calls ``pg_notify`` on
the PostgreSQL vendor (``db/topics.py``), so the wake-up is sent exactly when the change
commits. ``Hub`` is the other side: one dedicated connection per alias, LISTENing on the
channels of every watch of the process, and one thread that waits on all of them at once
and wakes the watches whose channel was notified (the keeper then runs their poll at once).
Polling stays the fallback: a connection that fails is closed and logged (loudly the first
time), and opened again at most once per ``RETRY`` seconds; meanwhile the watches poll.
Other vendors have no LISTEN: ``subscribe`` does nothing there.

A subscriber is woken once per batch of notifications of its channel (``wake()``), or, with
``payload=True``, once per notification with its payload (``wake(payload)``, and
``wake(None)`` when notifications may have been missed: the connection came back after a
failure). The line of waiters uses payloads: one channel for every line, the payload naming
the line a release freed a row of (``resource_lease.line.wakeups``).

The thread's database calls (connect, LISTEN, reading notifications, close) run inside the
fork gate, its wait on the sockets does not: a fork waits for the calls, never for the wait
(docs/pitfalls.md#fork).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from resource_lease.forking import PerProcess, fork_gate

logger = logging.getLogger("resource_lease")

#: Longest single wait on the sockets, so a new subscription is LISTENed to promptly.
SLICE = 0.5
#: Seconds between two attempts to open a LISTEN connection that failed.
RETRY = 1.0
#: Seconds the thread lingers with nothing to listen to before it exits.
IDLE_EXIT = 1.0

Wake = Callable[..., None]


class _Alias:
    """One alias's LISTEN connection and the channels it listens to."""

    def __init__(self) -> None:
        self.conn: Any = None  # a LeaseConnection
        self.listening: set[str] = set()
        self.retry_at = 0.0
        self.failing = False
        #: Whether psycopg may hold notifications it read while this thread ran a LISTEN or
        #: UNLISTEN on the connection (its backlog): the next read goes through ``notifies()``,
        #: which returns those first (``_drain``).
        self.backlog = False


class Hub:
    """The process's LISTEN thread (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str, dict[str, dict[int, Wake]]] = {}  # alias -> channel -> {id: wake}
        self._with_payload: set[int] = set()  # subscriptions woken with each payload
        self._ids = 0
        #: Counts the changes of ``_subs``: the thread sets its LISTENs up again only after one
        #: (or while a connection is down), not at every wake-up.
        self._changes = 0
        self._thread: threading.Thread | None = None
        self._aliases: dict[str, _Alias] = {}
        self._pipe: tuple[int, int] | None = None

    def subscribe(self, alias: str, channel: str, wake: Wake, *, payload: bool = False) -> int | None:
        """Call ``wake()`` whenever ``channel`` is notified on ``alias`` (PostgreSQL), or
        ``wake(payload)`` for each notification with ``payload=True``; a token for
        ``unsubscribe``, or None where the database has no LISTEN. The LISTEN itself is set
        up by the thread, a moment later: ``listening`` says when it is in force."""
        if connections[alias].vendor != "postgresql":
            return None
        with self._lock:
            self._ids += 1
            self._subs.setdefault(alias, {}).setdefault(channel, {})[self._ids] = wake
            if payload:
                self._with_payload.add(self._ids)
            self._changes += 1
            if self._pipe is None:
                self._pipe = os.pipe()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="resource-lease-listen", daemon=True)
                self._thread.start()
            token = self._ids
        self._poke()
        return token

    def unsubscribe(self, token: int | None) -> None:
        if token is None:
            return
        with self._lock:
            self._changes += 1
            self._with_payload.discard(token)
            for alias, channels in list(self._subs.items()):
                for channel, wakes in list(channels.items()):
                    wakes.pop(token, None)
                    if not wakes:
                        del channels[channel]
                if not channels:
                    del self._subs[alias]
        self._poke()

    def listening(self, alias: str, channel: str) -> bool:
        """Whether a NOTIFY on ``channel`` of ``alias`` reaches this process now."""
        state = self._aliases.get(alias)
        return state is not None and state.conn is not None and channel in state.listening

    def close(self) -> None:
        """Forget every subscription, stop the thread and close its connections (tests,
        before their database is dropped)."""
        with self._lock:
            self._subs.clear()
            self._with_payload.clear()
            self._changes += 1
            thread = self._thread
        self._poke()
        if thread is not None and thread is not threading.current_thread():
            thread.join(IDLE_EXIT + SLICE + 5)

    def backend_pid(self, alias: str) -> int | None:
        """The LISTEN connection's server process id on ``alias`` (tests, operators)."""
        state = self._aliases.get(alias)
        raw = None if state is None or state.conn is None else state.conn.wrapper.connection
        return None if raw is None else int(raw.info.backend_pid)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _poke(self) -> None:
        pipe = self._pipe
        if pipe is not None:
            try:
                os.write(pipe[1], b"x")
            except OSError:  # the pipe is full: the thread is awake anyway
                pass

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        idle_since: float | None = None
        synced = -1  # the ``_changes`` the LISTENs were last set up for
        try:
            while True:
                if synced != self._changes or self._reconnecting():
                    with self._lock:
                        changes = self._changes
                        wanted = {alias: set(channels) for alias, channels in self._subs.items()}
                        if not wanted:
                            idle_since = idle_since or time.monotonic()
                            if time.monotonic() - idle_since >= IDLE_EXIT:
                                self._thread = None
                                return
                        else:
                            idle_since = None
                    for alias in list(self._aliases):
                        if alias not in wanted:
                            self._close(alias)
                    for alias, channels in wanted.items():
                        self._listen(alias, channels)
                    # Nothing to listen to: looked at again after each wait, until IDLE_EXIT.
                    synced = changes if wanted else -1
                self._wait()
        except BaseException:
            logger.exception("the resource_lease LISTEN thread failed; watches poll")
            with self._lock:
                self._thread = None
            raise
        finally:
            for alias in list(self._aliases):
                self._close(alias)

    def _listen(self, alias: str, channels: set[str]) -> None:
        state = self._aliases.setdefault(alias, _Alias())
        if state.conn is None and time.monotonic() < state.retry_at:
            return
        try:
            with fork_gate.inside():
                self._listen_on(alias, state, channels)
        except Exception as exc:  # noqa: BLE001 (logged by _failed; the watches poll)
            self._failed(alias, state, exc)
            return
        if state.failing:
            state.failing = False
            logger.warning("LISTEN on %r works again; watches there are woken at once", alias)
            self._wake_all(alias)  # what changed meanwhile is read at once

    def _listen_on(self, alias: str, state: _Alias, channels: set[str]) -> None:
        """Connect (unless connected) and LISTEN to exactly ``channels``."""
        if state.conn is None:
            from resource_lease.db.connections import LeaseConnection

            state.conn = LeaseConnection(alias)
            state.conn.wrapper.ensure_connection()
            state.conn.wrapper.connection.autocommit = True
            state.listening = set()
        raw = state.conn.wrapper.connection
        for channel in sorted(channels - state.listening):
            state.backlog = True  # what arrives while it runs is kept by psycopg (``_drain``)
            raw.execute(f'LISTEN "{channel}"')
            state.listening.add(channel)
        for channel in sorted(state.listening - channels):
            state.backlog = True
            raw.execute(f'UNLISTEN "{channel}"')
            state.listening.discard(channel)

    def _reconnecting(self) -> bool:
        """Whether an alias's LISTEN connection is down (it is opened again at its retry)."""
        return any(state.conn is None for state in self._aliases.values())

    def _wait(self) -> None:
        pipe = self._pipe
        assert pipe is not None
        by_fd: dict[int, str] = {}
        for alias, state in self._aliases.items():
            if state.conn is not None and state.conn.wrapper.connection is not None:
                try:
                    by_fd[state.conn.wrapper.connection.fileno()] = alias
                except Exception as exc:  # noqa: BLE001 (logged by _failed; the watches poll)
                    self._failed(alias, state, exc)
        timeout = min(SLICE, RETRY) if self._reconnecting() else SLICE
        ready, _, _ = select.select([pipe[0], *by_fd], [], [], timeout)
        if pipe[0] in ready:
            os.read(pipe[0], 4096)
        for fd in ready:
            if fd not in by_fd:
                continue
            alias = by_fd[fd]
            state = self._aliases[alias]
            try:
                with fork_gate.inside():
                    notes = _drain(state)
            except Exception as exc:  # noqa: BLE001 (logged by _failed; the watches poll)
                self._failed(alias, state, exc)
                continue
            calls: list[tuple[Wake, tuple[str, ...]]] = []
            with self._lock:
                subs = self._subs.get(alias, {})
                for channel in {channel for channel, _ in notes}:
                    for token, wake in subs.get(channel, {}).items():
                        if token not in self._with_payload:
                            calls.append((wake, ()))
                for channel, payload in notes:
                    for token, wake in subs.get(channel, {}).items():
                        if token in self._with_payload:
                            calls.append((wake, (payload,)))
            for wake, args in calls:
                wake(*args)

    def _failed(self, alias: str, state: _Alias, exc: BaseException) -> None:
        if not state.failing:
            logger.warning("LISTEN on %r failed; watches there poll until it is back", alias, exc_info=exc)
        else:
            logger.debug("LISTEN on %r still fails: %s", alias, exc)
        state.failing = True
        state.retry_at = time.monotonic() + RETRY
        self._close(alias, keep_state=True)

    def _close(self, alias: str, *, keep_state: bool = False) -> None:
        state = self._aliases.get(alias)
        if state is None:
            return
        if state.conn is not None:
            try:
                with fork_gate.inside():
                    state.conn.close()
            except Exception:  # already broken
                logger.debug("closing a LISTEN connection failed", exc_info=True)
            state.conn = None
            state.listening = set()
        if not keep_state:
            del self._aliases[alias]

    def _wake_all(self, alias: str) -> None:
        with self._lock:
            calls = [
                (wake, (None,) if token in self._with_payload else ())
                for channel in self._subs.get(alias, {}).values()
                for token, wake in channel.items()
            ]
        for wake, args in calls:
            wake(*args)


def _drain(state: _Alias) -> list[tuple[str, str]]:
    """(channel, payload) of each notification that reached the LISTEN connection of ``state``,
    whose socket ``select`` found readable: read as psycopg's ``notifies()`` reads them
    (``consume_input``, then each parsed notification), without its generator, lock and wait
    (88-91 us of the LISTEN thread's 270 per hand-off here: docs/benchmarks.md, ninth
    session). Only this thread uses the connection. After a LISTEN or UNLISTEN ran on it,
    through ``notifies()`` itself, which first returns what psycopg kept meanwhile."""
    raw = state.conn.wrapper.connection
    if state.backlog:
        state.backlog = False
        return [(note.channel, note.payload) for note in raw.notifies(timeout=0)]
    pgconn = raw.pgconn
    pgconn.consume_input()  # raises if the connection is gone (``_failed``)
    encoding = raw.info.encoding
    notes = []
    while (note := pgconn.notifies()) is not None:
        notes.append((note.relname.decode(encoding), note.extra.decode(encoding)))
    return notes


#: This process's LISTEN thread (a forked child gets its own: docs/pitfalls.md#fork).
hub = PerProcess(Hub)
