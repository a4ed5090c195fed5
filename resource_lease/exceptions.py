"""The errors resource_lease raises: one base class and a few precise subclasses."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import ImproperlyConfigured, SynchronousOnlyOperation


class LeaseError(Exception):
    """Base class of every error raised by resource_lease."""


class NoResourceAvailable(LeaseError):
    """No resource of the requested kind could be leased in time."""

    def __init__(self, message: str, *, kind: str = "", exists: bool = True) -> None:
        super().__init__(message)
        self.kind = kind
        #: False when the kind has no resources at all (so waiting would be pointless).
        self.exists = exists

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled across processes (multiprocessing, Celery's prefork pool) with its fields;
        # result backends that rebuild it from the message alone get the defaults.
        return (type(self), self.args, {"kind": self.kind, "exists": self.exists})


class LockHeld(NoResourceAvailable):
    """A named lock (or every slot of a semaphore) is held by someone else past the timeout.

    ``holder`` and ``expires_at`` (the database's clock) say who holds it and until when; for
    a semaphore, the holder whose slot frees first. Both are in the message.
    """

    def __init__(
        self, message: str, *, name: str = "", holder: str = "", expires_at: dt.datetime | None = None, kind: str = ""
    ) -> None:
        super().__init__(message, kind=kind, exists=True)
        self.name = name
        self.holder = holder
        self.expires_at = expires_at

    def __reduce__(self) -> tuple[Any, ...]:
        state = {"kind": self.kind, "exists": self.exists, "name": self.name, "holder": self.holder}
        return (type(self), self.args, {**state, "expires_at": self.expires_at})


class LeaseLost(LeaseError):
    """The lease is no longer ours: it expired, was released, or another holder took it."""


class LeaseDatabaseError(LeaseError):
    """The database failed in a way the engine could not retry away."""


class DatabaseUnavailable(LeaseDatabaseError):
    """The database alias could not be connected to: nothing was sent, nothing written.

    ``alias`` names it, ``what`` says what was being done; both are in the message."""

    def __init__(self, message: str, *, alias: str = "", what: str = "") -> None:
        super().__init__(message)
        self.alias = alias
        self.what = what

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self.args, {"alias": self.alias, "what": self.what})


class OutcomeUnknown(LeaseDatabaseError):
    """The connection was lost while a write that cannot be repeated safely was under way
    (``counter.add``, ``Config.compare_and_set``): it may or may not have been applied, and
    the engine does not guess (docs/pitfalls.md#unknown-outcome). Read the state and decide."""


class SyncCallFromAsync(SynchronousOnlyOperation):
    """A blocking call of the library made from async code (an event loop runs in this
    thread): a programming error, not an outage (it is no ``LeaseError``, so nothing that
    handles a database outage mistakes it for one). The message names the async twin to use
    (``aacquire``, ``lease.arelease()``, ``election.aleader()``, ...). A Django
    ``SynchronousOnlyOperation``, as Django raises for its own blocking calls."""


class LeaseConfigError(LeaseError, ImproperlyConfigured):
    """A ``RESOURCE_LEASE`` setting has a value the app cannot use; the message names it.

    The system checks ``resource_lease.E010``/``E011`` report the same at start-up."""


class MemberTaken(LeaseError):
    """A group or barrier member name is held by another live process (two live processes
    must never share one member name)."""

    def __init__(self, message: str, *, member: str = "", holder: str = "") -> None:
        super().__init__(message)
        self.member = member
        #: Who holds the name now (``"<host>:<pid>#<id>"``), as recorded on its row.
        self.holder = holder

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self.args, {"member": self.member, "holder": self.holder})


class BarrierTimeout(LeaseError):
    """``DoubleBarrier.enter`` or ``leave`` did not complete within its timeout. After a timed-out
    ``enter`` the member has been withdrawn: nothing of it is left behind."""


class RateLimited(NoResourceAvailable):
    """``rate_limit(key, n, per=...).acquire()`` found no acquisition allowed within its
    timeout: ``n`` had already been made in the last ``per`` seconds. ``key`` names the rate
    limit; ``available_at`` (the database's clock, or None if unknown) is when the first of
    its slots frees; both are in the message."""

    def __init__(self, message: str, *, key: str = "", available_at: dt.datetime | None = None, kind: str = "") -> None:
        super().__init__(message, kind=kind, exists=True)
        self.key = key
        self.available_at = available_at

    def __reduce__(self) -> tuple[Any, ...]:
        state = {"kind": self.kind, "exists": self.exists, "key": self.key}
        return (type(self), self.args, {**state, "available_at": self.available_at})
