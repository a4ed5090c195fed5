"""Operations on the pool as a whole: states, counts, quarantine, restore, force release.

All of them are single conditional UPDATEs judged by the database's clock (``DbNow``), so
they are safe to run while workers lease: none can hand a resource to two holders. Their
filters stay on the lease table's own columns, so Django keeps each UPDATE one statement on
MySQL too (see docs/pitfalls.md#split-update); the counts they return are matched rows
(docs/pitfalls.md#found-rows).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.db import connections
from django.db.models import (
    Case,
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Q,
    QuerySet,
    Value,
    When,
)
from django.dispatch import Signal

from resource_lease import signals
from resource_lease.db.clock import DbNow, read_clock
from resource_lease.db.connections import database_errors
from resource_lease.models import (
    COORDINATION_PREFIX,
    DISABLED,
    EXPIRED,
    FREE,
    HELD,
    QUARANTINED,
    STATES,
    Resource,
    Waiter,
    live_q,
    quarantined_q,
    state_annotations,
)
from resource_lease.validation import check_alias, check_aware, check_kind, check_reason, check_seconds, resolve_using

__all__ = [
    "DISABLED",
    "EXPIRED",
    "FREE",
    "HELD",
    "QUARANTINED",
    "STATES",
    "counts",
    "database_now",
    "force_release",
    "quarantine",
    "releasable",
    "restorable",
    "restore",
    "waiting",
    "with_state",
]

ResourceSet = QuerySet[Resource] | Iterable[Resource | int]


def _queryset(resources: ResourceSet, using: str | None) -> QuerySet[Resource]:
    alias = None if using is None else check_alias(using)
    if isinstance(resources, QuerySet):
        _check_queryset(resources, "resources")
        return resources if alias is None else resources.using(alias)
    if isinstance(resources, (str, bytes)) or not isinstance(resources, Iterable):
        raise ValueError(
            f"resources must be a QuerySet of Resource or an iterable of Resource objects or primary keys,"
            f" got {resources!r}"
        )
    pks = []
    for item in resources:
        if isinstance(item, Resource):
            pks.append(item.pk)
        elif isinstance(item, int) and not isinstance(item, bool):
            pks.append(item)
        else:
            raise ValueError(f"resources must hold Resource objects or integer primary keys, got {item!r}")
    return Resource.objects.using(alias or resolve_using(None)).filter(pk__in=pks)


def _check_queryset(queryset: Any, name: str) -> None:
    # Resource or one of its proxies (the admin's pages of locks, semaphores, elections).
    if not isinstance(queryset, QuerySet) or not issubclass(queryset.model, Resource):
        raise ValueError(f"{name} must be a QuerySet of Resource, got {queryset!r}")


def _matched(signal: Signal, queryset: QuerySet[Resource]) -> list[Resource]:
    # What an operation is about to change, for its signal's receivers (the audit trail).
    # Read only when someone listens, so the operation itself stays one UPDATE.
    if not signal.has_listeners(Resource):
        return []
    return list(queryset.only("pk", "kind", "name", "holder", "fence"))


def with_state(queryset: QuerySet[Resource]) -> QuerySet[Resource]:
    """Annotate ``state`` (one of STATES) and ``time_left`` (lease time left), by the DB's clock
    (``ResourceQuerySet.with_state``, for any queryset of ``Resource`` or its proxies)."""
    _check_queryset(queryset, "queryset")
    return queryset.annotate(**state_annotations())


def counts(queryset: QuerySet[Resource] | None = None, *, using: str | None = None) -> dict[str, dict[str, int]]:
    """``{kind: {state: n, ..., "total": n}}`` for every kind in ``queryset`` (default: every
    pool, without the coordination rows of locks, elections and groups), on ``using``
    (default: the queryset's database, else the lease database)."""
    if queryset is None:
        queryset = Resource.objects.using(resolve_using(using)).pools()
    else:
        _check_queryset(queryset, "queryset")
        if using is not None:
            queryset = queryset.using(check_alias(using))
    result: dict[str, dict[str, int]] = {}
    rows = with_state(queryset).order_by().values("kind", "state").annotate(n=Count("pk"))  # type: ignore[misc]
    with database_errors(queryset.db, "counting the pool's resources"):
        for row in rows:
            per_kind = result.setdefault(row["kind"], {state: 0 for state in STATES} | {"total": 0})
            per_kind[row["state"]] += row["n"]
            per_kind["total"] += row["n"]
    return dict(sorted(result.items()))


def waiting(kind: str | None = None, *, using: str | None = None) -> dict[str, list[Waiter]]:
    """``{kind: [Waiter, ...]}``: who waits in the line of each pool (or of ``kind``), in the
    order they will be served, each with ``place`` (1 is next) and ``waited`` (a timedelta,
    by the database's clock). Lines of coordination rows (locks, elections) are not pools and
    are left out."""
    alias = resolve_using(using)
    places = Waiter.objects.using(alias).live().filter(name="").exclude(kind__startswith=COORDINATION_PREFIX)
    if kind is not None:
        places = places.filter(kind=check_kind(kind))
    lines: dict[str, list[Waiter]] = {}
    for waiter in places.with_waited().in_order():
        line = lines.setdefault(waiter.kind, [])
        waiter.place = len(line) + 1  # type: ignore[attr-defined]
        line.append(waiter)
    return lines


def quarantine(
    resources: ResourceSet,
    *,
    reason: str,
    seconds: float | None = None,
    until: dt.datetime | None = None,
    using: str | None = None,
) -> int:
    """Take resources out of service for ``seconds`` (or ``until`` an aware time) with a
    reason (required: a non-blank string, shown to operators and kept in the audit trail).

    A free resource is pushed out of the acquire's reach at once; a held one stays with its
    holder until released, and is then kept out until the quarantine ends. Returns the count.
    """
    reason = check_reason(reason)
    if not reason.strip():
        raise ValueError(f"reason must say why the resources are taken out of service, got {reason!r}")
    if (seconds is None) == (until is None):
        raise ValueError("quarantine needs exactly one of seconds or until")
    end: Any
    if seconds is not None:
        length = Value(dt.timedelta(seconds=check_seconds(seconds, "seconds")), output_field=DurationField())
        end = ExpressionWrapper(DbNow() + length, output_field=DateTimeField())
    else:
        end = Value(check_aware(until, "until"), output_field=DateTimeField())
    # Not leased now (never leased, given back or expired), whatever its quarantine.
    free = Q(busy_before__lte=DbNow())
    queryset = _queryset(resources, using)
    with database_errors(queryset.db, "quarantining resources"):
        matched = _matched(signals.resources_quarantined, queryset)
        # MySQL assigns left to right with updated values: decide on grant_token before
        # busy_before moves (see docs/pitfalls.md#set-order).
        count = queryset.update(
            grant_token=Case(When(free, then=Value("")), default=F("grant_token")),
            busy_before=Case(When(free, then=end), default=F("busy_before")),
            quarantined_until=end,
            quarantine_reason=reason,
        )
    signals.resources_quarantined.send(
        sender=Resource, resources=matched, count=count, reason=reason, seconds=seconds, until=until, using=queryset.db
    )
    return count


def restorable(queryset: QuerySet[Resource]) -> QuerySet[Resource]:
    """The resources of ``queryset`` that ``restore()`` would change: those with a quarantine."""
    return queryset.filter(quarantined_until__isnull=False)


def releasable(queryset: QuerySet[Resource]) -> QuerySet[Resource]:
    """The resources of ``queryset`` that ``force_release()`` would free: those with a live
    lease, by the database's clock."""
    return queryset.filter(live_q())


def restore(resources: ResourceSet, *, using: str | None = None) -> int:
    """End the quarantine of resources now, and forget their health (error score and backoff
    level back to 0: healthy, no probation). Returns how many were quarantined."""
    now = DbNow()
    queryset = restorable(_queryset(resources, using))
    with database_errors(queryset.db, "restoring resources"):
        matched = _matched(signals.resources_restored, queryset)
        count = queryset.update(
            quarantined_until=None,
            quarantine_reason="",
            health_score=0.0,
            backoff_level=0,
            backoff_seconds=0.0,
            # Only a quarantine pushed busy_before of a row with no live grant; undo just that.
            busy_before=Case(When(Q(grant_token="") & Q(busy_before__gt=now), then=now), default=F("busy_before")),
        )
    signals.resources_restored.send(sender=Resource, resources=matched, count=count, using=queryset.db)
    return count


def force_release(resources: ResourceSet, *, using: str | None = None) -> int:
    """Free resources whose lease is live, whoever holds them (an operator's action).

    The holder's next renewal or fenced write is refused. Returns how many were freed.
    """
    now = DbNow()
    queryset = releasable(_queryset(resources, using))
    with database_errors(queryset.db, "force-releasing resources"):
        matched = _matched(signals.resources_force_released, queryset)
        count = queryset.update(
            busy_before=Case(When(quarantined_q(), then=F("quarantined_until")), default=now),
            released_at=now,
            grant_token="",
        )
    signals.resources_force_released.send(sender=Resource, resources=matched, count=count, using=queryset.db)
    return count


def database_now(using: str | None = None) -> dt.datetime:
    """The database's current time (UTC), read on the caller's own Django connection to
    ``using`` (default: the lease database, ``RESOURCE_LEASE["DATABASE"]``)."""
    alias = resolve_using(using)
    with database_errors(alias, "reading the database's clock"):
        return read_clock(connections[alias])
