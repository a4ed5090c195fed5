"""The contenders of the cycle benchmarks, as they run inside one worker process.

Each takes one resource (``acquire``) and gives it back (``release``) as fast as it can and
counts in ``lost`` the attempts that got nothing (a lost race, or nothing free):

- ``Engine``: ``resource_lease.acquire(kind, ttl=..., timeout=0)`` and ``Lease.release()``,
  the public API with its defaults (holder, signals, the row handed back as a Resource).
- ``Floor``: what any lease on this table costs at least: two single-row primary-key
  UPDATEs per cycle through the worker's Django connection. It never chooses, so each worker
  writes a row of its own and never loses a race.
- ``Original``: the algorithm this project grew from, faithfully, but without its fixed
  sleeps: SELECT every free row of the kind, take the first, ``UPDATE ... WHERE id = %s AND
  busy_before = %s``, the affected-row count decides the race, a lost race is retried at once.
- ``RedisLocks``: redis-py ``Lock`` on one of N names (from a random start, non-blocking,
  next name on a miss); the lock expires after ttl like a lease.
- ``GetLocks``: MySQL/MariaDB ``GET_LOCK(name, 0)`` / ``RELEASE_LOCK`` on one of N names,
  the same way (only offered on MySQL/MariaDB).

The SQL-writing baselines pass the client's time as parameters, adapted by Django's own
``connection.ops``, so they need no vendor-specific SQL (the original design did the same).
"""

from __future__ import annotations

import datetime as dt
import random
import time
from typing import Any, Protocol

from django.db import connections
from django.utils import timezone

from project.bench.counting import Counter, CountingRedis, django_counter, engine_counter, redis_counter
from resource_lease.db.connections import close_connections
from resource_lease.exceptions import NoResourceAvailable
from resource_lease.lease import acquire, default_holder
from resource_lease.models import Resource


class GaveUp(RuntimeError):
    """A contender kept losing past its deadline (a bug or a livelock, never a figure)."""


class Contender(Protocol):
    name: str
    lost: int
    counter: Counter
    #: ``time.monotonic()`` after which a looping acquire gives up with ``GaveUp``.
    deadline: float

    def acquire(self) -> Any: ...

    def release(self, handle: Any) -> None: ...

    def close(self) -> None: ...


def _check(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise GaveUp("no resource could be had long after the window ended")


class Engine:
    """The public API of resource_lease."""

    name = "engine"
    counter = engine_counter

    def __init__(self, *, kind: str, ttl: float, **_: Any) -> None:
        self.kind = kind
        self.ttl = ttl
        self.lost = 0
        self.deadline = time.monotonic() + 60

    def acquire(self) -> Any:
        while True:
            try:
                return acquire(self.kind, ttl=self.ttl, timeout=0)
            except NoResourceAvailable:
                self.lost += 1
                _check(self.deadline)

    def release(self, handle: Any) -> None:
        handle.release()

    def close(self) -> None:
        close_connections()


class _DjangoSQL:
    """Shared by the baselines that send plain SQL through the worker's Django connection."""

    counter = django_counter

    def __init__(self, alias: str = "default") -> None:
        self.connection = connections[alias]
        self.table = self.connection.ops.quote_name(Resource._meta.db_table)
        self.cursor = self.connection.cursor()
        self.holder = default_holder()
        self.lost = 0
        self.deadline = time.monotonic() + 60

    def when(self, value: dt.datetime) -> Any:
        return self.connection.ops.adapt_datetimefield_value(value)

    def close(self) -> None:
        self.cursor.close()
        self.connection.close()


class Floor(_DjangoSQL):
    """Two primary-key UPDATEs of ``holder`` per cycle: the least any write-per-step lock on this
    table can cost (no indexed column moves, so no index entry is rewritten)."""

    name = "floor"

    def __init__(self, *, pk: int, **_: Any) -> None:
        super().__init__()
        self.pk = pk
        self.take_sql = f"UPDATE {self.table} SET holder = %s WHERE id = %s"
        self.free_sql = f"UPDATE {self.table} SET holder = '' WHERE id = %s"

    def acquire(self) -> Any:
        self.cursor.execute(self.take_sql, (self.holder, self.pk))
        return self.pk

    def release(self, handle: Any) -> None:
        self.cursor.execute(self.free_sql, (handle,))


class LeaseFloor(_DjangoSQL):
    """Two primary-key UPDATEs that move ``busy_before`` (and set ``holder``): the least a lease
    on this table can cost, since a lease must move its expiry, which the acquire index holds."""

    name = "lease-floor"

    def __init__(self, *, ttl: float, pk: int, **_: Any) -> None:
        super().__init__()
        self.ttl = dt.timedelta(seconds=ttl)
        self.pk = pk
        self.take_sql = f"UPDATE {self.table} SET busy_before = %s, holder = %s WHERE id = %s"
        self.free_sql = f"UPDATE {self.table} SET busy_before = %s WHERE id = %s"

    def acquire(self) -> Any:
        self.cursor.execute(self.take_sql, (self.when(timezone.now() + self.ttl), self.holder, self.pk))
        return self.pk

    def release(self, handle: Any) -> None:
        self.cursor.execute(self.free_sql, (self.when(timezone.now()), handle))


class Original(_DjangoSQL):
    """The original design's search and lock statements, retried at once on a lost race."""

    name = "original"

    def __init__(self, *, kind: str, ttl: float, **_: Any) -> None:
        super().__init__()
        self.kind = kind
        self.ttl = dt.timedelta(seconds=ttl)
        self.search_sql = f"SELECT id, busy_before FROM {self.table} WHERE kind = %s AND busy_before < %s"
        self.lock_sql = f"UPDATE {self.table} SET busy_before = %s, holder = %s WHERE id = %s AND busy_before = %s"
        self.free_sql = f"UPDATE {self.table} SET busy_before = %s WHERE id = %s"

    def acquire(self) -> Any:
        while True:
            now = timezone.now()
            self.cursor.execute(self.search_sql, (self.kind, self.when(now)))
            free = self.cursor.fetchall()
            if free:
                pk, busy_before = free[0]
                self.cursor.execute(self.lock_sql, (self.when(now + self.ttl), self.holder, pk, busy_before))
                if self.cursor.rowcount == 1:
                    return pk
            self.lost += 1
            _check(self.deadline)

    def release(self, handle: Any) -> None:
        self.cursor.execute(self.free_sql, (self.when(timezone.now()), handle))


class _NamedLocks:
    """One of N named locks: start at a random name, take the first that is free."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.lost = 0
        self.deadline = time.monotonic() + 60

    def try_lock(self, name: str) -> Any:
        raise NotImplementedError

    def acquire(self) -> Any:
        n = len(self.names)
        start = random.randrange(n)
        while True:
            for i in range(n):
                handle = self.try_lock(self.names[(start + i) % n])
                if handle is not None:
                    return handle
                self.lost += 1
            _check(self.deadline)


class RedisLocks(_NamedLocks):
    """redis-py ``Lock`` (SET NX PX to take, a Lua script to give back), expiring after ttl."""

    name = "redis"
    counter = redis_counter

    def __init__(self, *, names: list[str], ttl: float, redis_url: str, **_: Any) -> None:
        super().__init__(names)
        self.client = CountingRedis.from_url(redis_url)
        self.locks = {name: self.client.lock(name, timeout=ttl) for name in names}

    def try_lock(self, name: str) -> Any:
        lock = self.locks[name]
        return lock if lock.acquire(blocking=False) else None

    def release(self, handle: Any) -> None:
        handle.release()

    def close(self) -> None:
        self.client.close()


class GetLocks(_NamedLocks, _DjangoSQL):
    """MySQL/MariaDB named locks, ``GET_LOCK(name, 0)``, held by the session until released."""

    name = "getlock"
    counter = django_counter

    def __init__(self, *, names: list[str], **_: Any) -> None:
        _DjangoSQL.__init__(self)
        _NamedLocks.__init__(self, names)

    def try_lock(self, name: str) -> Any:
        self.cursor.execute("SELECT GET_LOCK(%s, 0)", (name,))
        return name if self.cursor.fetchone()[0] == 1 else None

    def release(self, handle: Any) -> None:
        self.cursor.execute("SELECT RELEASE_LOCK(%s)", (handle,))
        self.cursor.fetchall()


CONTENDERS: dict[str, type[Engine | Floor | LeaseFloor | Original | RedisLocks | GetLocks]] = {
    cls.name: cls for cls in (Engine, Floor, LeaseFloor, Original, RedisLocks, GetLocks)
}


def make_contender(name: str, **options: Any) -> Contender:
    return CONTENDERS[name](**options)
