"""Named locks, semaphores and ``@synchronized``: leases on rows created on first use.

A lock is one row of kind ``@lock`` named by the lock's name; a semaphore of ``slots`` is
``slots`` rows of kind ``@semaphore:<name>`` named ``0000``, ``0001``, ... Both are granted,
renewed, released and fenced by the engine's own statements (``named.try_grant`` for a lock,
the pool's acquire for a slot: one conditional UPDATE picks a free slot), so they keep every
guarantee of ``acquire()``: the database's clock, a fence that only goes up (per lock name,
per slot), a holder that dies loses the lock after its ttl with nobody cleaning up, and loss
is loud.

Neither is reentrant: the grant's condition is "free by the database's clock", which a
lock its own process holds is not, so asking again waits like anyone else.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import string
from collections.abc import Callable
from typing import Any, TypeVar, cast

from resource_lease import named
from resource_lease.db.line import Ask
from resource_lease.db.operations import ops
from resource_lease.exceptions import LeaseLost, LockHeld
from resource_lease.lease import Lease, OnLost, default_holder, granted, making
from resource_lease.line import Line, Wait, waiters
from resource_lease.line.aio import awaits
from resource_lease.line.granting import Grantor, newcomer
from resource_lease.line.threads import runs
from resource_lease.models import Resource
from resource_lease.validation import (
    Options,
    check_bool,
    check_callable,
    check_name,
    check_priority,
    check_seconds,
    check_timeout,
)

#: The kind of every named lock's row.
LOCK_KIND = named.row_kind("lock")
#: The most slots a semaphore may have (each slot is a row, created on first use).
MAX_SLOTS = 1000
_SLOT_DIGITS = 4  # slot names sort like their numbers, so "name < limit" picks the slots in use

#: How often a failed attempt is retried when the holder it saw has let go by the time it is
#: named in LockHeld (a timeout of 0 then still gives an honest answer).
_RECHECKS = 3

F = TypeVar("F", bound=Callable[..., Any])


def semaphore_kind(name: str) -> str:
    """The kind of the slot rows of the semaphore ``name``."""
    return named.row_kind("semaphore", name)


def slot_name(index: int) -> str:
    """The row name of slot ``index`` (0-based), zero-padded so names sort like numbers."""
    return f"{index:0{_SLOT_DIGITS}d}"


def _check_slots(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SLOTS:
        raise ValueError(f"slots must be an integer from 1 to {MAX_SLOTS}, got {value!r}")
    return value


class LockCall:
    """The arguments every lock, semaphore and rwlock grant takes, checked before anything is
    written."""

    def __init__(
        self,
        *,
        ttl: Any,
        timeout: Any,
        holder: Any,
        using: Any,
        auto_renew: Any,
        on_lost: Any,
        priority: Any,
        what: str,
        lock_delay: Any = 0.0,
    ) -> None:
        options = Options.of(ttl=ttl, using=using, holder=holder, default_holder=default_holder)
        self.ttl, self.using, self.holder = options.ttl, options.using, options.holder
        self.timeout = check_timeout(timeout)
        self.auto_renew = check_bool(auto_renew, "auto_renew")
        self.on_lost = cast("OnLost | None", check_callable(on_lost, "on_lost"))
        self.priority = check_priority(priority)
        self.lock_delay = check_seconds(lock_delay, "lock_delay", allow_zero=True)
        options.refuse_in_transaction(what)


def locking(
    name: str,
    *,
    ttl: float | None = None,
    timeout: float | None = 0,
    holder: str | None = None,
    using: str | None = None,
    auto_renew: bool = True,
    on_lost: OnLost | None = None,
    priority: int = 0,
    lock_delay: float = 0.0,
) -> Wait[Lease]:
    """Take the named lock ``name`` for ``ttl`` seconds (default: the ``RESOURCE_LEASE`` TTL).

    Returns the same ``Lease`` as ``acquire()`` (a context manager that releases on exit),
    renewed in the background unless ``auto_renew=False``; its ``fence`` is strictly greater
    than every fence granted before for this name. ``timeout``: 0 makes one attempt (and never
    takes the lock from a waiter in line), > 0 waits in line up to that many seconds, None
    waits for ever: first come, first served (a higher ``priority`` first), woken when the
    holder releases (``resource_lease.line``). ``lock_delay``: seconds (default 0) for which
    the lock is granted to nobody if this grant expires without being released (its holder
    vanished: Chubby's and Consul's lock-delay); a release frees it at once. Held by someone
    else past the timeout:
    ``LockHeld`` naming the holder and its expiry by the database's clock. Not reentrant. Bad
    arguments: ``ValueError``, nothing written. The lock's row is created on first use,
    race-safely.

    ``locking`` checks the arguments and builds the wait that ``lock`` runs in this thread
    and ``alock`` awaits: one signature for the three.
    """
    name = check_name(name)
    call = LockCall(
        ttl=ttl,
        timeout=timeout,
        holder=holder,
        using=using,
        auto_renew=auto_renew,
        on_lost=on_lost,
        priority=priority,
        what="lock()",
        lock_delay=lock_delay,
    )

    def attempt(grant: Grantor[Lease]) -> Lease | None:
        return named.try_grant(
            call.using, LOCK_KIND, name, holder=call.holder, ttl=call.ttl, lock_delay=call.lock_delay, grant=grant
        )

    def refusal() -> LockHeld | None:
        snapshot = named.read(call.using, LOCK_KIND, [name])
        row = snapshot.rows.get(name)
        if row is not None and (until := snapshot.delayed_until(row)) is not None:
            return delayed(f"lock {name!r}", name=name, kind=LOCK_KIND, row=row, until=until, timeout=call.timeout)
        if row is None or not snapshot.is_live(row):
            return _in_line(Line(call.using, LOCK_KIND, name), f"lock {name!r}", name=name, timeout=call.timeout)
        return _held(f"lock {name!r} is held", name=name, kind=LOCK_KIND, row=row, timeout=call.timeout)

    return lock_wait(Line(call.using, LOCK_KIND, name), attempt, refusal, call=call, what=f"lock {name!r}", name=name)


lock = runs(locking, "lock")
alock = awaits(locking, "alock")


def semaphoring(
    name: str,
    slots: int,
    *,
    ttl: float | None = None,
    timeout: float | None = 0,
    holder: str | None = None,
    using: str | None = None,
    auto_renew: bool = True,
    on_lost: OnLost | None = None,
    priority: int = 0,
    lock_delay: float = 0.0,
) -> Wait[Lease]:
    """Take one of ``slots`` slots of the semaphore ``name``: at most ``slots`` holders at once.

    The arguments and the returned ``Lease`` are ``lock()``'s; the fence is per slot. Each
    call puts its own ``slots`` in force for new grants: slots above it are not granted again
    once their holders release them, and new ones are created as needed. When every slot is
    held past the timeout: ``LockHeld`` naming the holder whose slot frees first.

    ``semaphoring`` checks the arguments, creates the slot rows (and puts the slot count in
    force), and builds the wait that ``semaphore`` runs and ``asemaphore`` awaits.
    """
    name = check_name(name)
    slots = _check_slots(slots)
    call = LockCall(
        ttl=ttl,
        timeout=timeout,
        holder=holder,
        using=using,
        auto_renew=auto_renew,
        on_lost=on_lost,
        priority=priority,
        what="semaphore()",
        lock_delay=lock_delay,
    )
    kind = semaphore_kind(name)
    names = [slot_name(i) for i in range(slots)]

    def configure() -> None:
        named.ensure(call.using, kind, names)
        ops(call.using).limit_slots(kind, below=slot_name(slots))

    configure()

    # The pool's acquire over the slot rows: one conditional statement picks a free, enabled
    # slot (disabled ones, above the count in force, are never granted).
    ask = Ask(kind, call.holder, call.ttl, lock_delay=call.lock_delay)

    def attempt(grant: Grantor[Lease]) -> Lease | None:
        return grant(ask)

    def refusal() -> LockHeld | None:
        snapshot = named.read(call.using, kind)
        if any(n not in snapshot.rows for n in names):  # deleted behind the cache's back
            for n in names:
                named.forget(call.using, kind, n)
            configure()
            return None
        live = [row for row in snapshot.rows.values() if snapshot.is_live(row)]
        in_use = [row for row in live if row.enabled] or live
        delays = [(until, row) for row in snapshot.rows.values() if (until := snapshot.delayed_until(row)) is not None]
        if len(in_use) < slots and delays and len(in_use) + len(delays) >= slots:
            until, row = min(delays, key=lambda pair: pair[0])
            what = f"semaphore {name!r}: every slot is held or in its lock delay; the first"
            return delayed(what, name=name, kind=kind, row=row, until=until, timeout=call.timeout)
        if len(in_use) < slots:
            # A slot is free: for a waiter in line, or freed since the attempt (try again).
            return _in_line(Line(call.using, kind), f"semaphore {name!r}", name=name, timeout=call.timeout)
        first = min(in_use, key=lambda row: row.busy_before)
        return _held(
            f"semaphore {name!r}: all {slots} slots are held; the first to free is held",
            name=name,
            kind=kind,
            row=first,
            timeout=call.timeout,
        )

    return lock_wait(Line(call.using, kind), attempt, refusal, call=call, what=f"semaphore {name!r}", name=name)


semaphore = runs(semaphoring, "semaphore")
asemaphore = awaits(semaphoring, "asemaphore")


def _held(what: str, *, name: str, kind: str, row: Resource, timeout: float | None) -> LockHeld:
    expires = row.busy_before
    waited = "" if not timeout else f" (waited {timeout:g}s)"
    return LockHeld(
        f"{what} by {row.holder!r} until {expires:%Y-%m-%d %H:%M:%S.%f} UTC (database clock){waited}",
        name=name,
        holder=row.holder,
        expires_at=expires,
        kind=kind,
    )


def delayed(what: str, *, name: str, kind: str, row: Resource, until: dt.datetime, timeout: float | None) -> LockHeld:
    """The refusal while a row is in its lock delay: its grant expired unreleased."""
    waited = "" if not timeout else f" (waited {timeout:g}s)"
    return LockHeld(
        f"{what} is in its lock delay until {until:%Y-%m-%d %H:%M:%S.%f} UTC (database clock): {row.holder!r}"
        f" let its grant expire without releasing it{waited}",
        name=name,
        holder=row.holder,
        expires_at=until,
        kind=kind,
    )


def _in_line(line: Line, what: str, *, name: str, timeout: float | None) -> LockHeld | None:
    """The refusal of a newcomer when what it asked for is free but callers wait in line for
    it (they are served first); None if nobody waits (it was let go since: try again)."""
    first = waiters(line, limit=1)
    if not first:
        return None
    waited = "" if not timeout else f" (waited {timeout:g}s)"
    return LockHeld(
        f"{what} is free but callers wait in line for it, served first: {first[0].holder!r} since"
        f" {first[0].since:%Y-%m-%d %H:%M:%S.%f} UTC (database clock){waited}",
        name=name,
        holder=first[0].holder,
        kind=line.kind,
    )


def lock_wait(
    line: Line,
    attempt: Callable[[Grantor[Lease]], Lease | None],
    refusal: Callable[[], LockHeld | None],
    *,
    call: LockCall,
    what: str,
    name: str,
    shared: bool = False,
    lease_class: type[Lease] = Lease,
) -> Wait[Lease]:
    """The wait in ``line`` for a grant up to the call's timeout; past it, ``LockHeld`` naming
    who holds it. If the holder let go between the last attempt and the read that would name
    it, try again (briefly, as a newcomer). ``shared``: a reader of an rwlock (served with the
    readers ahead of it; it takes no hand-off, and is woken instead). ``lease_class``: the
    grant's (an rwlock's ``ReadLease``)."""
    make = making(alias=call.using, on_lost=call.on_lost, lease_class=lease_class)

    def conclude(lease: Lease | None) -> Lease:
        for _ in range(_RECHECKS):
            if lease is not None:
                break
            error = refusal()
            if error is not None:
                raise error
            lease = attempt(newcomer(call.using, make))
        if lease is None:
            raise LockHeld(f"{what} was taken again each time it was seen free; gave up", name=name)
        return granted(lease, auto_renew=call.auto_renew)

    return Wait(
        line,
        attempt,
        conclude,
        timeout=call.timeout,
        holder=call.holder,
        ttl=call.ttl,
        priority=call.priority,
        shared=shared,
        make=make,
        # A release may hand the row to the head of the line in its own statement (PostgreSQL's
        # RELEASE, a plain grant: no lock delay, and for an rwlock a write grant, readers 0).
        handed=None if shared or call.lock_delay else make,
    )


# -- @synchronized ---------------------------------------------------------------------


def synchronized(
    key: str, *, ttl: float | None = None, timeout: float | None = 0, using: str | None = None
) -> Callable[[F], F]:
    """Run the decorated function under the named lock ``key``, formatted from the call's
    arguments (``"{0}"`` by position, ``"{worker}"`` by name, defaults applied).

    Raises ``LockHeld`` when the key is held past ``timeout`` (0: one attempt). The lock is
    renewed in the background while the function runs and released after it, only if the
    grant is still ours (another holder's lock is never released). If the lock was lost while
    the function ran (its release finds the grant gone), ``LeaseLost`` is raised after it
    returns: its work was not exclusive. On a coroutine function the lock is held across its
    awaits and taken and given back without blocking the event loop (``alock``).
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string, got {key!r}")
    fields = _fields(key)
    if ttl is not None or using is not None:
        Options.of(ttl=ttl, using=using)
    check_timeout(timeout)

    def decorate(func: F) -> F:
        if not callable(func):
            raise ValueError(f"synchronized decorates a function, got {func!r}")
        signature = inspect.signature(func)
        _check_fields(key, fields, signature)

        def lock_name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            try:
                formatted = key.format(*bound.args, **{**bound.arguments, **bound.kwargs})
            except (IndexError, KeyError, AttributeError) as exc:
                raise ValueError(f"key {key!r} cannot be formatted from this call's arguments: {exc!r}") from exc
            return check_name(formatted, "key")

        def lost(name: str, lease: Lease) -> LeaseLost:
            return LeaseLost(
                f"the lock {name!r} was lost while {func.__qualname__} ran: {lease.lost_reason or 'expired or taken'}"
            )

        if inspect.iscoroutinefunction(func):
            # A coroutine function holds the lock across its awaits, taken and given back
            # without blocking the event loop (resource_lease.aio).
            @functools.wraps(func)
            async def coroutine_wrapper(*args: Any, **kwargs: Any) -> Any:
                name = lock_name(args, kwargs)
                async with alock(name, ttl=ttl, timeout=timeout, using=using, auto_renew=True) as lease:
                    result = await func(*args, **kwargs)  # an error releases the lock on the way out
                    released = await lease.arelease()  # only our own grant: holder and fence checked
                if not released:
                    raise lost(name, lease)
                return result

            coroutine_wrapper.lock_key = key  # type: ignore[attr-defined]
            return cast(F, coroutine_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            name = lock_name(args, kwargs)
            with lock(name, ttl=ttl, timeout=timeout, using=using, auto_renew=True) as lease:
                result = func(*args, **kwargs)  # an error releases the lock on the way out
                released = lease.release()  # only our own grant: holder and fence checked
            if not released:
                raise lost(name, lease)
            return result

        wrapper.lock_key = key  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate


def _fields(key: str) -> list[str]:
    """The argument each replacement field of ``key`` names (``""`` for ``{}``)."""
    try:
        parsed = list(string.Formatter().parse(key))
    except ValueError as exc:
        raise ValueError(f"key is not a valid format string: {exc}: {key!r}") from exc
    fields = []
    for _, field, _, _ in parsed:
        if field is not None:
            fields.append(field.split(".", 1)[0].split("[", 1)[0])
    return fields


def _check_fields(key: str, fields: list[str], signature: inspect.Signature) -> None:
    """Every field of ``key`` must name a parameter (by name or position) of the function."""
    params = list(signature.parameters.values())
    kinds = inspect.Parameter
    positional = [p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    var_args = any(p.kind is kinds.VAR_POSITIONAL for p in params)
    var_kwargs = any(p.kind is kinds.VAR_KEYWORD for p in params)
    names = {p.name for p in params if p.kind is not kinds.VAR_POSITIONAL}
    auto = 0
    for field in fields:
        if field == "":
            index, auto = auto, auto + 1
            field = str(index)
        if field.isdigit():
            if int(field) >= len(positional) and not var_args:
                raise ValueError(
                    f"key {key!r}: {{{field}}} is past the function's {len(positional)} positional arguments"
                )
        elif field not in names and not var_kwargs:
            raise ValueError(f"key {key!r}: {{{field}}} names no argument of the function")


__all__ = [
    "LOCK_KIND",
    "MAX_SLOTS",
    "LockHeld",
    "alock",
    "asemaphore",
    "lock",
    "semaphore",
    "semaphore_kind",
    "slot_name",
    "synchronized",
]
