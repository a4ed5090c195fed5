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

import functools
import inspect
import string
from collections.abc import Callable
from typing import Any, TypeVar, cast

from resource_lease import named
from resource_lease.conf import lease_settings
from resource_lease.db.connections import run_repeatable
from resource_lease.exceptions import LeaseLost, LockHeld
from resource_lease.lease import (
    Lease,
    OnLost,
    attempt_grant,
    default_holder,
    granted,
    refuse_inside_single_writer_transaction,
)
from resource_lease.models import Resource
from resource_lease.validation import (
    check_alias,
    check_bool,
    check_callable,
    check_holder,
    check_name,
    check_seconds,
    check_timeout,
)
from resource_lease.waiting import wait_for

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


class _Call:
    """The arguments every lock and semaphore takes, checked before anything is written."""

    def __init__(
        self,
        *,
        ttl: Any,
        timeout: Any,
        holder: Any,
        using: Any,
        auto_renew: Any,
        on_lost: Any,
        what: str,
    ) -> None:
        self.ttl = check_seconds(lease_settings.TTL if ttl is None else ttl, "ttl")
        self.timeout = check_timeout(timeout)
        self.holder = check_holder(holder) or default_holder()
        self.alias = check_alias(lease_settings.DATABASE if using is None else using)
        self.auto_renew = check_bool(auto_renew, "auto_renew")
        self.on_lost = cast("OnLost | None", check_callable(on_lost, "on_lost"))
        refuse_inside_single_writer_transaction(self.alias, what)


def lock(
    name: str,
    *,
    ttl: float | None = None,
    timeout: float | None = 0,
    holder: str | None = None,
    using: str | None = None,
    auto_renew: bool = True,
    on_lost: OnLost | None = None,
) -> Lease:
    """Take the named lock ``name`` for ``ttl`` seconds (default: the ``RESOURCE_LEASE`` TTL).

    Returns the same ``Lease`` as ``acquire()`` (a context manager that releases on exit),
    renewed in the background unless ``auto_renew=False``; its ``fence`` is strictly greater
    than every fence granted before for this name. ``timeout``: 0 makes one attempt, > 0 keeps
    trying (backoff with jitter, at most a second apart) up to that many seconds, None waits
    for ever. Held by someone else past the timeout: ``LockHeld`` naming the holder and its
    expiry by the database's clock. Not reentrant. Bad arguments: ``ValueError``, nothing
    written. The lock's row is created on first use, race-safely.
    """
    name = check_name(name)
    call = _Call(
        ttl=ttl, timeout=timeout, holder=holder, using=using, auto_renew=auto_renew, on_lost=on_lost, what="lock()"
    )

    def attempt() -> Lease | None:
        return named.try_grant(call.alias, LOCK_KIND, name, holder=call.holder, ttl=call.ttl, on_lost=call.on_lost)

    def refusal() -> LockHeld | None:
        snapshot = named.read(call.alias, LOCK_KIND, [name])
        row = snapshot.rows.get(name)
        if row is None or not snapshot.is_live(row):
            return None  # deleted or let go since the attempt: try again
        return _held(f"lock {name!r} is held", name=name, kind=LOCK_KIND, row=row, timeout=call.timeout)

    lease = _take(attempt, refusal, timeout=call.timeout, what=f"lock {name!r}", name=name)
    return granted(lease, auto_renew=call.auto_renew)


def semaphore(
    name: str,
    slots: int,
    *,
    ttl: float | None = None,
    timeout: float | None = 0,
    holder: str | None = None,
    using: str | None = None,
    auto_renew: bool = True,
    on_lost: OnLost | None = None,
) -> Lease:
    """Take one of ``slots`` slots of the semaphore ``name``: at most ``slots`` holders at once.

    The arguments and the returned ``Lease`` are ``lock()``'s; the fence is per slot. Each
    call puts its own ``slots`` in force for new grants: slots above it are not granted again
    once their holders release them, and new ones are created as needed. When every slot is
    held past the timeout: ``LockHeld`` naming the holder whose slot frees first.
    """
    name = check_name(name)
    slots = _check_slots(slots)
    call = _Call(
        ttl=ttl,
        timeout=timeout,
        holder=holder,
        using=using,
        auto_renew=auto_renew,
        on_lost=on_lost,
        what="semaphore()",
    )
    kind = semaphore_kind(name)
    names = [slot_name(i) for i in range(slots)]

    def configure() -> None:
        named.ensure(call.alias, kind, names)
        limit = slot_name(slots)
        run_repeatable(
            call.alias, lambda d, c: d.limit_slots(c, kind=kind, below=limit), what=f"setting the slots of {kind}"
        )

    configure()

    def attempt() -> Lease | None:
        # The pool's acquire over the slot rows: one conditional statement picks a free,
        # enabled slot (disabled ones, above the count in force, are never granted).
        return attempt_grant(kind, ttl=call.ttl, holder=call.holder, alias=call.alias, on_lost=call.on_lost)

    def refusal() -> LockHeld | None:
        snapshot = named.read(call.alias, kind)
        if any(n not in snapshot.rows for n in names):  # deleted behind the cache's back
            for n in names:
                named.forget(call.alias, kind, n)
            configure()
            return None
        live = [row for row in snapshot.rows.values() if snapshot.is_live(row)]
        in_use = [row for row in live if row.enabled] or live
        if len(in_use) < slots:
            return None  # a slot freed since the attempt: try again
        first = min(in_use, key=lambda row: row.busy_before)
        return _held(
            f"semaphore {name!r}: all {slots} slots are held; the first to free is held",
            name=name,
            kind=kind,
            row=first,
            timeout=call.timeout,
        )

    lease = _take(attempt, refusal, timeout=call.timeout, what=f"semaphore {name!r}", name=name)
    return granted(lease, auto_renew=call.auto_renew)


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


def _take(
    attempt: Callable[[], Lease | None],
    refusal: Callable[[], LockHeld | None],
    *,
    timeout: float | None,
    what: str,
    name: str,
) -> Lease:
    """Wait for a grant up to ``timeout``; then ``LockHeld`` naming who holds it. If the holder
    let go between the last attempt and the read that would name it, try again (briefly)."""
    lease = wait_for(attempt, timeout=timeout)
    for _ in range(_RECHECKS):
        if lease is not None:
            return lease
        error = refusal()
        if error is not None:
            raise error
        lease = attempt()
    if lease is not None:
        return lease
    raise LockHeld(f"{what} was taken again each time it was seen free; gave up", name=name)


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
    returns: its work was not exclusive.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string, got {key!r}")
    fields = _fields(key)
    if ttl is not None:
        check_seconds(ttl, "ttl")
    check_timeout(timeout)
    if using is not None:
        check_alias(using)

    def decorate(func: F) -> F:
        if not callable(func):
            raise ValueError(f"synchronized decorates a function, got {func!r}")
        if inspect.iscoroutinefunction(func):
            raise ValueError(f"synchronized cannot hold a lock across awaits of coroutine function {func!r}")
        signature = inspect.signature(func)
        _check_fields(key, fields, signature)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            try:
                formatted = key.format(*bound.args, **{**bound.arguments, **bound.kwargs})
            except (IndexError, KeyError, AttributeError) as exc:
                raise ValueError(f"key {key!r} cannot be formatted from this call's arguments: {exc!r}") from exc
            name = check_name(formatted, "key")
            with lock(name, ttl=ttl, timeout=timeout, using=using, auto_renew=True) as lease:
                result = func(*args, **kwargs)  # an error releases the lock on the way out
                released = lease.release()  # only our own grant: holder and fence checked
            if not released:
                raise LeaseLost(
                    f"the lock {name!r} was lost while {func.__qualname__} ran: {lease.lost_reason or 'expired or taken'}"
                )
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


__all__ = ["LOCK_KIND", "MAX_SLOTS", "LockHeld", "lock", "semaphore", "semaphore_kind", "slot_name", "synchronized"]
