"""The lease table: one row per resource, whose ``busy_before`` says until when it is taken,
and the lease states (free, held, expired, quarantined, disabled) written once over it."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from django.db import models
from django.db.models import Case, CharField, DurationField, ExpressionWrapper, F, Q, Value, When

from resource_lease.db.clock import DbNow
from resource_lease.db.json_text import ExactEncoder

#: ``busy_before`` of a resource that was never leased: long past, so it is free.
NEVER = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _never() -> dt.datetime:
    return NEVER


#: Kinds starting with this character are the engine's own rows for named locks,
#: semaphores, elections, groups and barriers (``@lock``, ``@group:<name>``, ...): leased
#: like any resource, never part of a pool. ``acquire()`` refuses such kinds.
COORDINATION_PREFIX = "@"


#: A resource's states, as ``ResourceQuerySet.with_state()`` names them.
FREE, HELD, EXPIRED, QUARANTINED, DISABLED = "free", "held", "expired", "quarantined", "disabled"
STATES = (FREE, HELD, EXPIRED, QUARANTINED, DISABLED)


# The lease states, written once. Every condition is judged by the database's clock
# (``DbNow``), never the client's (docs/pitfalls.md#database-clock), and is on the row's own
# columns (docs/pitfalls.md#split-update). Each is the ORM twin of the lease statements' SQL in
# ``resource_lease/db/base.py`` (``Dialect.free``, ``Dialect.ours``); tests/test_states.py
# proves on each database that both select the same rows.


def free_q() -> Q:
    """Grantable now: enabled, not leased by the database's clock, no quarantine running
    (the acquire's condition, ``Dialect.free``, without its kind)."""
    now = DbNow()
    return Q(enabled=True, busy_before__lte=now) & (Q(quarantined_until__isnull=True) | Q(quarantined_until__lte=now))


def live_q() -> Q:
    """A live grant: not given back (a release or force release clears the token and may
    leave ``busy_before`` in the future, at the end of a quarantine) and not yet expired."""
    return Q(busy_before__gt=DbNow()) & ~Q(grant_token="")


def expired_q() -> Q:
    """A grant never given back whose time ran out: the next grant takes it over."""
    return Q(busy_before__lte=DbNow()) & ~Q(grant_token="")


def quarantined_q() -> Q:
    """Out of service now: a quarantine that has not ended by the database's clock."""
    return Q(quarantined_until__gt=DbNow())


def state_annotations() -> dict[str, Any]:
    """``state`` (one of ``STATES``, the first that applies: disabled, quarantined, held,
    expired, free) and ``time_left`` (of a live grant, else None), by the database's clock;
    for ``QuerySet.annotate`` on any queryset of ``Resource`` or its proxies."""
    return {
        "state": Case(
            When(enabled=False, then=Value(DISABLED)),
            When(quarantined_q(), then=Value(QUARANTINED)),
            When(live_q(), then=Value(HELD)),
            When(~Q(grant_token=""), then=Value(EXPIRED)),
            default=Value(FREE),
            output_field=CharField(),
        ),
        "time_left": Case(
            When(live_q(), then=ExpressionWrapper(F("busy_before") - DbNow(), output_field=DurationField())),
            default=None,
            output_field=DurationField(),
        ),
    }


class ResourceQuerySet(models.QuerySet["Resource"]):
    """The one ORM statement of the lease states (see ``free_q`` and its siblings)."""

    def free(self, kind: str) -> ResourceQuerySet:
        """The resources of ``kind`` that a grant may take now (enabled, expired or never
        leased, not quarantined), by the database's clock."""
        return self.filter(free_q(), kind=kind)

    def live(self) -> ResourceQuerySet:
        """Resources under a live grant (held now, whatever their quarantine or ``enabled``),
        by the database's clock."""
        return self.filter(live_q())

    def expired(self) -> ResourceQuerySet:
        """Resources whose grant ran out without being given back (whatever their quarantine
        or ``enabled``), by the database's clock: the next grant takes them over."""
        return self.filter(expired_q())

    def quarantined(self) -> ResourceQuerySet:
        """Resources under a quarantine that has not ended, by the database's clock."""
        return self.filter(quarantined_q())

    def with_state(self) -> ResourceQuerySet:
        """Annotate ``state`` and ``time_left`` (see ``state_annotations``)."""
        return self.annotate(**state_annotations())

    def pools(self) -> ResourceQuerySet:
        """The pools' resources: everything but the coordination rows."""
        return self.exclude(kind__startswith=COORDINATION_PREFIX)

    def coordination(self) -> ResourceQuerySet:
        """Only the coordination rows (locks, semaphores, elections, groups, barriers)."""
        return self.filter(kind__startswith=COORDINATION_PREFIX)


class Resource(models.Model):
    """A leasable resource (a proxy, an API account, a licence, a GPU).

    Only the lease engine writes ``busy_before``, ``holder``, ``fence``, ``grant_token``,
    ``acquired_at`` and ``renewed_at``, always with a conditional UPDATE judged by the
    database's clock.
    """

    # 255 rather than a pool name's 100: coordination rows carry their group's or
    # semaphore's name (up to 200 characters) in the kind, behind a reserved prefix.
    kind = models.CharField(max_length=255, help_text="The pool this resource belongs to.")
    name = models.CharField(max_length=255, help_text="Unique within its kind.")
    data = models.JSONField(
        default=dict, blank=True, encoder=ExactEncoder, help_text="What the resource is (e.g. a proxy URL)."
    )
    enabled = models.BooleanField(default=True, help_text="A disabled resource is never granted.")

    busy_before = models.DateTimeField(
        default=_never, help_text="Lease expiry; the resource is free when this is in the past."
    )
    holder = models.CharField(max_length=255, blank=True, default="", help_text="Who holds (or last held) it.")
    fence = models.BigIntegerField(default=0, help_text="Raised by one on every grant; never goes down.")
    grant_token = models.CharField(
        max_length=32,
        blank=True,
        default="",
        help_text="Random key of the current grant (empty once released), to settle unknown outcomes.",
    )
    acquired_at = models.DateTimeField(null=True, blank=True)
    renewed_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)

    quarantined_until = models.DateTimeField(
        null=True, blank=True, help_text="Out of service until this time (never granted before it)."
    )
    quarantine_reason = models.CharField(max_length=500, blank=True, default="")

    took_over = models.BooleanField(
        default=False, help_text="The last grant took the resource from a holder whose lease had expired unreleased."
    )
    previous_holder = models.CharField(max_length=255, blank=True, default="")

    # An rwlock's row (kind ``@rwlock``, recipes/rwlock.py) is held either by one writer (the
    # grant columns above, readers 0) or by readers: a read period that lasts while its
    # readers renew, ``busy_before`` the latest expiry any of them asked for.
    readers = models.IntegerField(
        default=0, db_default=0, help_text="An rwlock's read grants not given back in its current read period."
    )
    lock_delay = models.FloatField(
        default=0.0,
        db_default=0.0,
        help_text="Seconds after the last grant expired unreleased before the row is granted again"
        " (the lock delay its holder asked for); a released grant is free at once.",
    )
    read_fence = models.BigIntegerField(
        default=0, db_default=0, help_text="The fence of the first read grant of an rwlock's current read period."
    )

    # Shared health (``Lease.report``, resource_lease/health.py): written only by a report's
    # fenced statement and an operator's restore.
    health_score = models.FloatField(
        default=0.0,
        db_default=0.0,
        help_text="Errors reported, decayed by each success; at the policy's threshold the resource is quarantined.",
    )
    backoff_level = models.IntegerField(
        default=0,
        db_default=0,
        help_text="Automatic quarantines since it was last healthy; above 0 the next grant is a probation grant.",
    )
    backoff_seconds = models.FloatField(
        default=0.0,
        db_default=0.0,
        help_text="The backoff of the last automatic quarantine, before its jitter (doubles each time, to the cap).",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    line_until = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text=(
            "Someone may be waiting in line for this row until then: a grant then checks the line"
            " (written by the waiters; docs/waiting.md#marks)."
        ),
    )

    #: Text columns compared exactly on every database (migration ``ExactCollation``,
    #: system check ``resource_lease.W010``): "PROXY" and "proxy " are not "proxy"
    #: (docs/pitfalls.md#collation).
    exact_text_fields: ClassVar[tuple[str, ...]] = ("kind", "name")

    objects = ResourceQuerySet.as_manager()

    class Meta:
        ordering = ["kind", "name"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "name"], name="resource_lease_kind_name_uniq"),
            models.CheckConstraint(condition=Q(fence__gte=0), name="resource_lease_fence_not_negative"),
        ]
        indexes = [
            # The acquire scans free rows of one kind, oldest expiry first, and stops at the
            # first; this index keeps that scan (and the rows it locks) short at any pool size
            # (docs/pitfalls.md#index-locks and docs/pitfalls.md#dead-index-entries).
            models.Index(fields=["kind", "busy_before"], name="resource_lease_acquire_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"
