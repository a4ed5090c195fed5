"""The engine's own database connections: one per thread and alias, never the caller's.

A grant must not be undone by the caller's rollback (a grant made inside the caller's
``atomic()`` would vanish with it while the caller believed it held), and the lease
statements want session settings (UTC, READ COMMITTED, a bounded lock wait) that are not
ours to impose on the caller's connection. So every lease statement runs in autocommit on a
private copy of the alias's Django connection, owned by the calling thread (see
docs/pitfalls.md#own-connection).

A process that forks keeps its parent's sockets (docs/pitfalls.md#fork): a child must never
use, nor close, them (closing would send the server a goodbye on the parent's behalf).
Connections are tagged with the pid that opened them; a child drops them into a graveyard
that is never collected, and points its copy of their sockets at /dev/null, because the
graveyard does not outlive the child's interpreter shutdown, nor do the thread-locals of
threads that did not survive fork.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections
from django.db import Error as DjangoDatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

from resource_lease.conf import lease_settings
from resource_lease.db import dialect_class
from resource_lease.db.base import Dialect, Failure
from resource_lease.db.picking import Picker
from resource_lease.exceptions import DatabaseUnavailable, LeaseDatabaseError, OutcomeUnknown, SyncCallFromAsync
from resource_lease.forking import at_fork, fork_gate

logger = logging.getLogger("resource_lease")

T = TypeVar("T")

_local = threading.local()
# Connections inherited across fork(): kept referenced forever so their destructors never
# run in the child and close the parent's sockets.
_inherited: list[Any] = []
# Every open lease connection of every thread, so that a forked child can find them all.
_live: weakref.WeakSet[LeaseConnection] = weakref.WeakSet()
# Strong references taken just before fork(): the child clears the thread states of threads
# that did not survive fork (dropping their thread-locals) before its after-fork hooks run.
_forking: list[LeaseConnection] = []


class Disconnected(Exception):
    """The connection died during a statement whose outcome is therefore unknown
    (docs/pitfalls.md#unknown-outcome)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class LockWaitTimeout(LeaseDatabaseError):
    """A statement waited the whole bounded lock wait and was rolled back: nothing changed."""


class LeaseConnection:
    """A private connection to one alias, owned by one thread of one process."""

    def __init__(self, alias: str) -> None:
        base = connections[alias]
        settings_dict = dict(base.settings_dict)
        settings_dict["OPTIONS"] = dict(settings_dict.get("OPTIONS") or {})
        self.dialect_class = dialect_class(base.vendor)
        io_timeout = float(lease_settings.LOCK_WAIT_TIMEOUT) + 5.0
        self.dialect_class.connect_options(
            settings_dict["OPTIONS"], io_timeout, prepared=bool(lease_settings.PREPARED_STATEMENTS)
        )
        self.wrapper: BaseDatabaseWrapper = type(base)(settings_dict, alias)
        self.dialect: Dialect = self.dialect_class(self.wrapper)
        #: Which rows this thread's acquires try first (kept across reconnects).
        self.picker = Picker()
        self.pid = os.getpid()
        self._session_of: Any = None
        #: The cursor kept for the statements of this session (``Dialect.keeps_cursor``).
        self._kept: Any = None
        _live.add(self)

    def ensure(self) -> None:
        """Open the connection (and set its session up) unless it is open already; nothing is
        sent on an open one (a dead session is found by the statement that uses it)."""
        wrapper = self.wrapper
        if wrapper.connection is None or self._session_of is not wrapper.connection:
            self._kept = None  # the old session's, if any
            self.dialect.connect(float(lease_settings.LOCK_WAIT_TIMEOUT))
            self._session_of = wrapper.connection

    def cursor(self) -> Any:
        """A new cursor of this connection (opened if need be); the caller closes it."""
        self.ensure()
        return self.new_cursor()

    def new_cursor(self) -> Any:
        """A new cursor of the open session (every cursor the engine uses is made here)."""
        return self.wrapper.connection.cursor()

    def statement_cursor(self) -> Any:
        """The cursor for one statement of ``run``: the session's kept one where the dialect
        keeps one (``Dialect.keeps_cursor``), else a new one; hand it to ``done_with``."""
        self.ensure()
        if not self.dialect.keeps_cursor:
            return self.new_cursor()
        if self._kept is None:
            self._kept = self.new_cursor()
        return self._kept

    def done_with(self, cursor: Any, *, failed: bool) -> None:
        """A statement's cursor is done with: closed unless it is the kept one, and the kept
        one too after a statement that failed (the next statement starts from a new one)."""
        if cursor is self._kept:
            if not failed:
                return
            self._kept = None
        try:
            cursor.close()
        except Exception:  # the statement's own error (if any) is the one that matters
            logger.debug("closing a lease cursor failed", exc_info=True)

    def discard(self) -> None:
        """Forget a connection that failed; the next statement opens a new one."""
        self._kept = None  # the session's: closed with it
        raw, self.wrapper.connection, self._session_of = self.wrapper.connection, None, None
        self.dialect.disconnected()
        if raw is not None:
            try:
                raw.close()
            except Exception:  # already broken: nothing more to do with it
                logger.debug("closing a broken lease connection failed", exc_info=True)
        self.wrapper.closed_in_transaction = False

    def close(self) -> None:
        self.discard()

    def disown(self) -> None:
        """In a forked child: make closing this connection harmless to the parent.

        The child's copy of the socket is pointed at /dev/null, so whatever closes it later
        (a destructor, interpreter shutdown) says goodbye to /dev/null, not to the server.
        """
        raw = self.wrapper.connection
        if raw is None or not hasattr(raw, "fileno"):
            return  # not connected, or no socket (SQLite)
        try:
            fd = raw.fileno()
        except Exception:  # already closed: nothing left to protect
            logger.debug("no socket to disown", exc_info=True)
            return
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)


class _ClosedWithThread:
    """Closes a thread's lease connections when the thread ends.

    A thread's thread-locals are dropped as it ends, but a ``LeaseConnection`` sits in
    reference cycles (its wrapper and dialect), so it would only be closed by the next garbage
    collection, keeping a server connection open meanwhile (a pool of user threads that come
    and go held dozens). This object, kept beside them in the thread-local and in no cycle,
    is freed the moment the thread ends, and closes them then. In a forked child (a thread
    that did not survive fork) it closes nothing: those sockets are the parent's."""

    def __init__(self, conns: dict[str, LeaseConnection]) -> None:
        self.conns = conns

    def __del__(self) -> None:
        conns = self.conns
        if any(conn.pid != os.getpid() for conn in conns.values()):
            _inherited.append(conns.copy())  # the parent's: never closed here
            return
        for conn in list(conns.values()):
            try:
                conn.close()
            except Exception:  # a destructor must not raise; the server times the session out
                logger.debug("closing an ended thread's lease connection failed", exc_info=True)


def _connections() -> dict[str, LeaseConnection]:
    conns: dict[str, LeaseConnection] | None = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = {}
        _local.closer = _ClosedWithThread(conns)
    return conns


def lease_connection(alias: str = DEFAULT_DB_ALIAS) -> LeaseConnection:
    conns = _connections()
    conn = conns.get(alias)
    if conn is not None and conn.pid != os.getpid():
        _inherited.append(conns.copy())
        conns.clear()
        conn = None
    if conn is None:
        conn = conns[alias] = LeaseConnection(alias)
    return conn


def close_connections() -> None:
    """Close this thread's lease connections (threads that end should call it; ours do)."""
    conns = _connections()
    if any(conn.pid != os.getpid() for conn in conns.values()):
        _inherited.append(conns.copy())
    else:
        with fork_gate.inside():
            for conn in conns.values():
                conn.close()
    conns.clear()


#: Seconds ``close_every_connection`` waits for the statements other threads run now.
CLOSE_WAIT = 10.0


def close_every_connection() -> None:
    """Close the lease connections of every thread of this process (tests, before their
    database is dropped: the worker threads of async code keep theirs open). It closes the
    fork gate first, as a fork does: a statement another thread runs now (the keeper renewing
    a lease in the background) ends first, and the next one waits until the connections are
    closed, then opens its own. Closing a connection under a statement that runs on it crashed
    the SQLite driver (a segfault, in a rehearsal of tests/test_leader_only.py)."""
    fork_gate.close(CLOSE_WAIT)
    try:
        for conn in list(_live):
            if conn.pid == os.getpid():
                conn.close()
    finally:
        fork_gate.open()


def _unwrap(exc: BaseException) -> BaseException:
    # Django wraps driver errors raised while connecting; the driver's error says why.
    cause = exc.__cause__
    return cause if cause is not None and type(exc).__module__.startswith("django.") else exc


def run(alias: str, statement: Callable[[Dialect, Any], T], *, what: str) -> T:
    """Run one lease statement in autocommit on this thread's lease connection.

    Transient failures (deadlock, serialization failure: docs/pitfalls.md#read-committed) are
    rolled back by the database and retried here, briefly and with jitter, so callers never
    see them. A statement that waited out the bounded lock wait raises ``LockWaitTimeout``
    (nothing changed) at once (docs/pitfalls.md#lock-wait). A lost connection is discarded and
    reported as ``Disconnected``: only the caller knows whether the statement can be repeated
    or must be settled by reading back (docs/pitfalls.md#dropped-connections,
    docs/pitfalls.md#unknown-outcome). It runs inside the fork gate: a fork waits for it to
    end (docs/pitfalls.md#fork).
    """
    refuse_on_event_loop(what)
    with fork_gate.inside():
        return _run(alias, statement, what=what)


def _run(alias: str, statement: Callable[[Dialect, Any], T], *, what: str) -> T:
    conn = lease_connection(alias)
    retries = int(lease_settings.TRANSIENT_RETRIES)
    for attempt in range(retries + 1):
        try:
            conn.ensure()
        except Exception as exc:
            # Not even connected: the statement was never sent, so there is no outcome to
            # settle. Say so, rather than "lost the connection" (a server never reachable).
            error = _unwrap(exc)
            transient = conn.dialect.classify(error) is Failure.TRANSIENT
            conn.discard()
            if transient and attempt < retries:
                time.sleep(random.uniform(0.0, 0.002 * 2**attempt))  # a Galera node not ready yet
                continue
            raise unavailable(alias, what, error) from exc
        try:
            cursor = conn.statement_cursor()
            try:
                answer = statement(conn.dialect, cursor)
            except BaseException:
                conn.done_with(cursor, failed=True)
                raise
            conn.done_with(cursor, failed=False)
            return answer
        except Exception as exc:
            error = _unwrap(exc)
            failure = conn.dialect.classify(error)
            if failure is Failure.TRANSIENT and attempt < retries:
                logger.debug("%s: transient database error, retrying: %s", what, error)
                time.sleep(random.uniform(0.0, 0.002 * 2**attempt))
                continue
            if failure is Failure.DISCONNECT:
                conn.discard()
                raise Disconnected(error) from exc
            if failure is Failure.LOCK_TIMEOUT:
                # Already waited LOCK_WAIT_TIMEOUT: retrying here would multiply the wait
                # past any ttl; the caller decides (docs/pitfalls.md#lock-wait).
                raise LockWaitTimeout(f"{what} waited too long for a row lock on {alias!r}: {error}") from exc
            raise LeaseDatabaseError(f"{what} failed on database {alias!r}: {error}") from exc
    raise AssertionError("unreachable")  # pragma: no cover


#: The async twin of each public blocking call (by its qualified name), for the message of
#: ``SyncCallFromAsync``; a call not listed is told of ``a<name>`` and ``sync_to_async``.
ASYNC_TWINS = {
    "acquire": "await aacquire(...) (or async with aacquire(...))",
    "lock": "await alock(...) (or async with alock(...))",
    "semaphore": "await asemaphore(...) (or async with asemaphore(...))",
    "RwLock.read": "await arwlock(name).read(...)",
    "RwLock.write": "await arwlock(name).write(...)",
    "Lease.release": "await lease.arelease()",
    "Lease.renew": "await lease.arenew()",
    "Lease.is_held": "await lease.ais_held()",
    "Lease.__exit__": "async with (await aacquire(...)), or async with aacquire(...)",
    "Lease.__enter__": "async with aacquire(...)",
    "Election.campaign": "await election.acampaign()",
    "Election.resign": "await election.aresign()",
    "Election.is_leader": "await election.ais_leader()",
    "Election.leader": "await election.aleader()",
    "Election.record": "await election.arecord()",
    "Election.state": "await election.astate()",
    "Election.save_state": "await election.asave_state(state)",
    "Config.__getitem__": "await config.aget(key)",
    "Config.get": "await config.aget(key)",
}


def refuse_on_event_loop(what: str) -> None:
    """Raise ``SyncCallFromAsync`` if an event loop runs in this thread (unless Django's
    ``DJANGO_ALLOW_ASYNC_UNSAFE`` is set): every statement checks, and a call that changes
    its own state before its statement (``Lease.release``) checks first."""
    if asyncio._get_running_loop() is not None and not os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE"):
        # Django's own guard would only say so when the connection opens, and as an error
        # connecting (an outage, to whoever handles one): say what is wrong, and what to use.
        raise sync_call_from_async(what)


def sync_call_from_async(what: str) -> SyncCallFromAsync:
    """The error for a blocking call made on a thread that runs an event loop, naming the
    public call (the outermost frame of this library) and its async twin."""
    called = what
    frame = sys._getframe(2)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    while frame is not None:
        if os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
            called = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
        else:
            break
        frame = frame.f_back  # type: ignore[assignment]
    name = called.rsplit(".", 1)[-1]
    twin = ASYNC_TWINS.get(called) or f"its async twin a{name}() if it has one"
    return SyncCallFromAsync(
        f"{called}() was called from async code (an event loop runs in this thread), where a blocking"
        f" database call would stall the loop: use {twin}, or run it in a thread (asgiref's sync_to_async)"
    )


def unavailable(alias: str, what: str, error: BaseException) -> DatabaseUnavailable:
    """The one error for a database that could not be connected to."""
    return DatabaseUnavailable(f"cannot connect to database {alias!r} ({what}): {error}", alias=alias, what=what)


def database_error(alias: str, what: str, exc: BaseException) -> LeaseDatabaseError:
    """A Django database error raised on the alias's ordinary connection, as the engine's
    error naming the alias: ``DatabaseUnavailable`` when that connection never opened (the
    server is down, unreachable or refuses us), ``LeaseDatabaseError`` otherwise."""
    if isinstance(exc, LeaseDatabaseError):
        return exc
    error = _unwrap(exc)
    if connections[alias].connection is None:
        return unavailable(alias, what, error)
    return LeaseDatabaseError(f"{what} failed on database {alias!r}: {error}")


@contextmanager
def database_errors(alias: str, what: str) -> Iterator[None]:
    """Raise the database errors of the ORM code inside as ``database_error`` does."""
    try:
        yield
    except DjangoDatabaseError as exc:
        raise database_error(alias, what, exc) from exc


def run_once(alias: str, statement: Callable[[Dialect, Any], T], *, what: str) -> T:
    """``run`` for a write that must not be repeated blindly and has no token to settle it
    by: a lost answer is ``OutcomeUnknown`` (docs/pitfalls.md#unknown-outcome)."""
    try:
        return run(alias, statement, what=what)
    except Disconnected as exc:
        raise OutcomeUnknown(
            f"{what}: the connection to {alias!r} was lost during the statement; it may or may not have"
            f" been applied: {exc}"
        ) from exc.cause


def run_repeatable(alias: str, statement: Callable[[Dialect, Any], T], *, what: str) -> T:
    """``run`` for statements that are safe to repeat (renew, release, reads): one reconnect
    (also after a failed connect: a restarting server, another Galera node)."""
    try:
        return run(alias, statement, what=what)
    except (Disconnected, DatabaseUnavailable):
        try:
            return run(alias, statement, what=what)
        except Disconnected as again:
            raise LeaseDatabaseError(f"{what}: lost the connection to {alias!r}: {again}") from again.cause


def _before_fork() -> None:
    _forking[:] = list(_live)


def _after_fork_in_parent() -> None:
    _forking.clear()


def _after_fork_in_child() -> None:
    for conn in _forking:
        conn.disown()
    _inherited.append(list(_forking))
    _forking.clear()


at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
