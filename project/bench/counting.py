"""Counting the statements (database round trips) each contender sends.

Three sources, all counted in the worker process on the client side, so every figure means
the same thing (one ``execute`` = one round trip, whatever the server does with it):

- the engine runs its statements on raw DB-API cursors of its own private connection, out
  of reach of Django's ``execute_wrapper``; ``count_engine_statements()`` wraps the cursors
  that ``LeaseConnection.new_cursor()`` makes (every thread, the renewal thread included; a
  kept cursor is wrapped once and counts each statement);
- the floor, the original algorithm and GET_LOCK go through the worker's Django connection,
  counted with ``connection.execute_wrapper``;
- redis-py commands are counted by a ``Redis`` subclass (``SET NX PX``, ``EVALSHA``, ...).

A statement that raised (a deadlock the engine retried, a lock wait) counts in ``errors`` too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import redis


class Counter:
    """Statements sent and statements that failed, from any thread of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.statements = 0
        self.errors = 0

    def add(self, *, failed: bool = False) -> None:
        with self._lock:
            self.statements += 1
            if failed:
                self.errors += 1

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.statements, self.errors


#: The engine's statements, counted once ``count_engine_statements()`` is installed.
engine_counter = Counter()
#: Statements through the worker's Django connection while ``DjangoCounter`` is active.
django_counter = Counter()
#: redis-py commands sent through ``CountingRedis``.
redis_counter = Counter()


class _CountingCursor:
    """A DB-API cursor that counts its ``execute`` calls and forwards everything else."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def execute(self, sql: Any, params: Any = None) -> Any:
        try:
            # sqlite3 refuses params=None: pass them only when given, as the caller did.
            result = self._cursor.execute(sql) if params is None else self._cursor.execute(sql, params)
        except BaseException:
            engine_counter.add(failed=True)
            raise
        engine_counter.add()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __enter__(self) -> _CountingCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cursor.close()


_installed = False


def count_engine_statements() -> None:
    """Count every statement the engine sends from this process (benchmark workers only)."""
    global _installed
    if _installed:
        return
    from resource_lease.db.connections import LeaseConnection

    # Where the engine makes its cursors: ``new_cursor``; an earlier checkout measured as
    # ``--before`` made each in ``cursor``.
    maker = "new_cursor" if hasattr(LeaseConnection, "new_cursor") else "cursor"
    original: Callable[[LeaseConnection], Any] = getattr(LeaseConnection, maker)

    def counted(self: LeaseConnection) -> Any:
        return _CountingCursor(original(self))

    setattr(LeaseConnection, maker, counted)
    _installed = True


def django_statement_counter(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
    """A ``connection.execute_wrapper`` that counts into ``django_counter``."""
    try:
        result = execute(sql, params, many, context)
    except BaseException:
        django_counter.add(failed=True)
        raise
    django_counter.add()
    return result


class CountingRedis(redis.Redis):
    """A redis client that counts the commands it sends (each one a round trip here)."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            result = super().execute_command(*args, **options)
        except BaseException:
            redis_counter.add(failed=True)
            raise
        redis_counter.add()
        return result
