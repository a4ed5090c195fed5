"""Shared rate limits: ``rate_limit(key, n, per=seconds)``, across every process.

A rate limit of ``n`` per ``per`` seconds is ``n`` slot rows of kind ``@ratelimit:<key>``
(named ``0000``, ``0001``, ... as a semaphore's), each granted for ``per`` seconds and never
given back: an acquisition is the pool's own grant of any free slot (one conditional
statement, judged by the database's clock), and the slot it took stays busy until ``per``
seconds after that grant. A slot's next grant therefore comes ``per`` seconds or more after
its last one, so any window of ``per`` seconds (by the database's clock) holds at most one
grant of each slot: at most ``n`` acquisitions in all. Waiters wait in the slots' line, first
come first served (a higher ``priority`` first); the first of them looks again when the
first slot's grant runs out (``line``: a held row's expiry wakes the first waiter).

A slot's next grant takes over its expired grant (``took_over``, the takeovers metric of
``@ratelimit``): that is how a rate limit works, not a holder that died.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from resource_lease import named
from resource_lease.conf import lease_settings
from resource_lease.db.line import Ask
from resource_lease.db.operations import ops
from resource_lease.exceptions import RateLimited
from resource_lease.lease import Lease, default_holder, granted, keep_until_expiry, making
from resource_lease.line import Line, Wait
from resource_lease.line.aio import arun
from resource_lease.line.granting import Grantor
from resource_lease.offload import in_thread
from resource_lease.recipes.locks import MAX_SLOTS, slot_name
from resource_lease.validation import Options, check_holder, check_name, check_priority, check_seconds, check_timeout


def rate_limit_kind(key: str) -> str:
    """The kind of the slot rows of the rate limit ``key``."""
    return named.row_kind("ratelimit", key)


def _check_n(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SLOTS:
        raise ValueError(f"n must be an integer from 1 to {MAX_SLOTS}, got {value!r}")
    return value


class RateLimit:
    """At most ``n`` acquisitions of ``key`` in any ``per`` seconds, across every process
    (``rate_limit()``). Safe to share between threads; cheap to make (nothing is written
    until the first acquisition, which creates the slot rows and puts ``n`` in force)."""

    def __init__(
        self,
        key: str,
        n: int,
        *,
        per: float,
        using: str | None = None,
        holder: str | None = None,
        priority: int = 0,
    ) -> None:
        self.key = check_name(key, "key")
        self.n = _check_n(n)
        self.per = check_seconds(per, "per")
        options = Options.of(using=using)
        self.using = options.using
        self._holder = check_holder(holder)
        self.priority = check_priority(priority)
        self.kind = rate_limit_kind(self.key)
        self._options = options

    def __repr__(self) -> str:
        return f"<RateLimit {self.key!r} {self.n} per {self.per:g}s>"

    def acquire(self, timeout: float | None = None) -> None:
        """Wait (in line, up to ``timeout`` seconds; None: for ever, 0: one attempt) until an
        acquisition is allowed, and count it. ``RateLimited`` when none was in time."""
        self.waiting(timeout).run()

    def try_acquire(self) -> bool:
        """One attempt, never waiting: True if the acquisition was allowed (and counted).
        It never takes a slot that a waiter in line is waiting for."""
        try:
            self.waiting(0).run()
        except RateLimited:
            return False
        return True

    async def aacquire(self, timeout: float | None = None) -> None:
        """``acquire()`` for async code: waits without blocking the event loop."""
        wait = await in_thread(self.waiting, timeout)
        await arun(wait)

    async def atry_acquire(self) -> bool:
        """``try_acquire()`` for async code."""
        try:
            await self.aacquire(0)
        except RateLimited:
            return False
        return True

    def waiting(self, timeout: float | None) -> Wait[Lease]:
        """The wait that ``acquire`` runs and ``aacquire`` awaits (the slots created, ``n`` put
        in force); ``timeout`` checked first (``ValueError``, nothing written)."""
        wait = check_timeout(timeout)
        holder = self._holder or default_holder()
        self._options.refuse_in_transaction("rate_limit().acquire()")
        alias, kind, per = self.using, self.kind, self.per
        named.ensure(alias, kind, [slot_name(i) for i in range(self.n)])
        ops(alias).limit_slots(kind, below=slot_name(self.n))

        ask = Ask(kind, holder, per)

        def attempt(grant: Grantor[Lease]) -> Lease | None:
            return grant(ask)

        def conclude(lease: Lease | None) -> Lease:
            if lease is None:
                raise self._refusal(wait)
            keep_until_expiry(lease)  # the slot stays busy for ``per`` seconds: never given back
            return granted(lease, auto_renew=False)

        # The place in line is leased for the default TTL (its renewal is the keeper's); the
        # slot for ``per`` seconds.
        return Wait(
            Line(alias, kind),
            attempt,
            conclude,
            timeout=wait,
            holder=holder,
            ttl=float(lease_settings.TTL),
            make=making(alias=alias),
            priority=self.priority,
        )

    def _refusal(self, timeout: float | None) -> RateLimited:
        snapshot = named.read(self.using, self.kind)
        ends = [row.busy_before for row in snapshot.rows.values() if row.enabled and row.busy_before > snapshot.now]
        first: dt.datetime | None = min(ends) if ends else None
        waited = "" if not timeout else f" within {timeout:g}s"
        when = "" if first is None else f"; the first slot frees at {first:%Y-%m-%d %H:%M:%S.%f} UTC (database clock)"
        return RateLimited(
            f"rate limit {self.key!r} ({self.n} per {self.per:g}s): no acquisition allowed{waited}{when}",
            key=self.key,
            available_at=first,
            kind=self.kind,
        )


def rate_limit(
    key: str,
    n: int,
    *,
    per: float,
    using: str | None = None,
    holder: str | None = None,
    priority: int = 0,
) -> RateLimit:
    """A rate limit of at most ``n`` acquisitions of ``key`` in any ``per`` seconds, shared by
    every process on the database (``using``): ``.acquire(timeout=None)`` waits in line and
    raises ``RateLimited`` past its timeout, ``.try_acquire()`` never waits, ``.aacquire()``
    and ``.atry_acquire()`` are their asyncio twins. ``key``: a name (non-empty, at most 200
    characters); ``n``: an int from 1 to 1000; ``per``: finite seconds > 0. Bad input:
    ``ValueError`` naming the argument, nothing written. Changing ``n`` for a key takes effect
    for new acquisitions."""
    return RateLimit(key, n, per=per, using=using, holder=holder, priority=priority)


__all__ = ["RateLimit", "RateLimited", "rate_limit", "rate_limit_kind"]
