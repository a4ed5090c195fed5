"""Read/write locks: many readers or one writer, on one row of the lease table.

``rwlock(name)`` is the row ``(@rwlock, name)``, created on first use. Every grant, a
reader's or a writer's, is one conditional UPDATE of that row's own columns (``RW_READ``,
``RW_WRITE`` in ``db/statements.py``): the row lock orders them, the database's clock judges
them, and each raises the row's one fence, so a grant's fence is above every earlier grant of
the rwlock, readers' and writers' alike. A writer holds the row like a lock. Readers share a
*read period*: counted on the row, lasting while any of them renews, ended by the last
release (or by its expiry, when a reader died).

Readers and writers wait in the row's one line (``resource_lease.line``): a writer waits for
everyone ahead of it; a reader only for the writers ahead of it (``RW_READ_CLEAR``), so a
stream of readers never starves a writer: the readers that come after a waiting writer are
served after it, as in ZooKeeper's and Curator's read/write locks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction

from resource_lease import named
from resource_lease.db.clock import DbNow
from resource_lease.db.line import READ, WRITE, Ask
from resource_lease.db.operations import Operations
from resource_lease.db.rwlock_operations import reader_ops
from resource_lease.exceptions import LeaseLost, LockHeld
from resource_lease.lease import Lease, OnLost
from resource_lease.line import Line, Wait, waiters
from resource_lease.line.aio import Acquiring
from resource_lease.line.granting import Grantor
from resource_lease.models import Resource
from resource_lease.recipes.locks import LockCall, delayed, lock_wait
from resource_lease.validation import check_name

#: The kind of every rwlock's row.
RWLOCK_KIND = named.row_kind("rwlock")

#: How often a failed attempt is retried when what it saw has let go by the time it is named
#: in LockHeld (as for lock()).
_RECHECKS = 3


class ReadLease(Lease):
    """A read grant of an rwlock: the ``Lease`` of ``lock()``, whose renewal, check and
    release are a reader's (the row is shared with the other readers of the read period; the
    grant is known by its fence). ``expires_at`` is the read period's expiry."""

    def __repr__(self) -> str:
        return "<Read" + super().__repr__()[1:]

    def _ops(self) -> Operations:
        return reader_ops(self.using)

    @contextmanager
    def _fenced_transaction(self, alias: str) -> Iterator[None]:
        with transaction.atomic(using=alias):
            current = (
                Resource.objects.using(alias)
                .select_for_update()
                .filter(pk=self.resource.pk, readers__gt=0, read_fence__lte=self.fence, busy_before__gt=DbNow())
                .exists()
            )
            if not current:
                self.mark_lost("a fenced write found the read grant's period over")
                raise LeaseLost(f"{self!r}: {self.lost_reason}")
            yield


class RwLock:
    """The read/write lock ``name``: ``read()`` and ``write()`` take ``lock()``'s keyword
    arguments and return a ``Lease`` (see the module's docstring)."""

    def __init__(self, name: str) -> None:
        self.name = check_name(name)

    def __repr__(self) -> str:
        return f"<RwLock {self.name!r}>"

    def read(self, **lock_kwargs: Any) -> Lease:
        """A read grant: shared with other readers, never with a writer. ``LockHeld`` past the
        timeout (naming the writer that holds it or waits ahead)."""
        return self.reading(**lock_kwargs).run()

    def write(self, **lock_kwargs: Any) -> Lease:
        """A write grant: nobody else, reader or writer, holds the rwlock meanwhile. ``LockHeld``
        past the timeout (naming the writer or a reader that holds it)."""
        return self.writing(**lock_kwargs).run()

    def reading(self, **lock_kwargs: Any) -> Wait[Lease]:
        """``read()``'s arguments, checked (``ValueError``, nothing written), as the wait that
        ``read()`` runs and ``arwlock(name).read`` awaits."""
        return self._waiting(shared=True, **lock_kwargs)

    def writing(self, **lock_kwargs: Any) -> Wait[Lease]:
        """``write()``'s arguments, checked, as the wait that ``write()`` runs."""
        return self._waiting(shared=False, **lock_kwargs)

    def _waiting(
        self,
        *,
        shared: bool,
        ttl: float | None = None,
        timeout: float | None = 0,
        holder: str | None = None,
        using: str | None = None,
        auto_renew: bool = True,
        on_lost: OnLost | None = None,
        priority: int = 0,
        lock_delay: float = 0.0,
    ) -> Wait[Lease]:
        what = f"rwlock({self.name!r}).{'read' if shared else 'write'}()"
        call = LockCall(
            ttl=ttl,
            timeout=timeout,
            holder=holder,
            using=using,
            auto_renew=auto_renew,
            on_lost=on_lost,
            priority=priority,
            what=what,
            lock_delay=lock_delay,
        )
        name, kind = self.name, RWLOCK_KIND
        line = Line(call.using, kind, name)
        ask = Ask(kind, call.holder, call.ttl, rows=READ if shared else WRITE, name=name, lock_delay=call.lock_delay)

        def attempt(grant: Grantor[Lease]) -> Lease | None:
            named.ensure(call.using, kind, [name])
            lease = grant(ask)
            if lease is None and name not in named.read(call.using, kind, [name]).rows:
                named.forget(call.using, kind, name)  # deleted by an operator: made again
            return lease

        return lock_wait(
            line,
            attempt,
            lambda: self._refusal(call, shared=shared),
            call=call,
            what=what,
            name=name,
            shared=shared,
            lease_class=ReadLease if shared else Lease,
        )

    def _refusal(self, call: LockCall, *, shared: bool) -> LockHeld | None:
        """Why the last attempt was refused, naming who holds the rwlock or waits ahead; None
        if it is free to us now (try again)."""
        snapshot = named.read(call.using, RWLOCK_KIND, [self.name])
        stored = snapshot.rows.get(self.name)
        if stored is not None and (until := snapshot.delayed_until(stored)) is not None:
            what = f"rwlock {self.name!r}"
            return delayed(what, name=self.name, kind=RWLOCK_KIND, row=stored, until=until, timeout=call.timeout)
        row = snapshot.live(self.name)
        waited = "" if not call.timeout else f" (waited {call.timeout:g}s)"
        if row is not None and (row.readers == 0 or not shared):
            how = f"for reading by {row.readers} reader(s), the last" if row.readers else "for writing"
            return LockHeld(
                f"rwlock {self.name!r} is held {how} by {row.holder!r} until"
                f" {row.busy_before:%Y-%m-%d %H:%M:%S.%f} UTC (database clock){waited}",
                name=self.name,
                holder=row.holder,
                expires_at=row.busy_before,
                kind=RWLOCK_KIND,
            )
        ahead = waiters(Line(call.using, RWLOCK_KIND, self.name), limit=1)
        if not ahead:
            return None
        return LockHeld(
            f"rwlock {self.name!r} is open to us but callers wait in line for it, served first:"
            f" {ahead[0].holder!r} since {ahead[0].since:%Y-%m-%d %H:%M:%S.%f} UTC (database clock){waited}",
            name=self.name,
            holder=ahead[0].holder,
            kind=RWLOCK_KIND,
        )


def rwlock(name: str) -> RwLock:
    """The read/write lock ``name`` (its row is created on first use): ``rwlock(name).read(...)``
    and ``.write(...)`` take ``lock()``'s keyword arguments (``ttl``, ``timeout``, ``holder``,
    ``using``, ``auto_renew``, ``on_lost``, ``priority``, ``lock_delay``) and return a ``Lease``, a context
    manager, fenced: its fence is above every earlier grant of the rwlock, readers' and
    writers' alike. Many readers or one writer; a waiting writer is served before the readers
    that came after it. Bad name: ``ValueError``."""
    return RwLock(name)


class ARwLock:
    """``rwlock(name)`` for async code: ``await arwlock(name).read(...)``, ``async with
    arwlock(name).write(...) as lease``; the same ``Lease`` as the sync rwlock's."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<ARwLock {self.name!r}>"

    def read(self, **kwargs: Any) -> Acquiring[Lease]:
        """``rwlock(name).read()`` for async code."""
        return Acquiring(lambda: RwLock(self.name).reading(**kwargs))

    def write(self, **kwargs: Any) -> Acquiring[Lease]:
        """``rwlock(name).write()`` for async code."""
        return Acquiring(lambda: RwLock(self.name).writing(**kwargs))


def arwlock(name: str) -> ARwLock:
    """``rwlock()`` for async code: ``.read(...)`` and ``.write(...)`` are awaitable and async
    context managers, taking ``lock()``'s keyword arguments."""
    return ARwLock(name)


__all__ = ["RWLOCK_KIND", "ARwLock", "ReadLease", "RwLock", "arwlock", "rwlock"]
