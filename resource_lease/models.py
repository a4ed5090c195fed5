"""The lease table: one row per resource, whose ``busy_before`` says until when it is taken."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from django.db import models
from django.db.models import Case, CharField, DurationField, ExpressionWrapper, F, Q, Value, When

from resource_lease.db import DbNow

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
    data = models.JSONField(default=dict, blank=True, help_text="What the resource is (e.g. a proxy URL).")
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

    created_at = models.DateTimeField(auto_now_add=True)

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


class LeaseEvent(models.Model):
    """One entry of the audit trail: a grant, a release, a loss or an operator's action.

    Written in batches by a background thread (``resource_lease.audit``), never on the
    acquire path, when ``RESOURCE_LEASE["AUDIT"]`` is on. There is no foreign key to
    ``Resource``: the trail outlives the resources it mentions.
    """

    GRANTED = "granted"
    TAKEN_OVER = "taken_over"
    RELEASED = "released"
    RELEASE_REFUSED = "release_refused"
    LOST = "lost"
    QUARANTINED = "quarantined"
    RESTORED = "restored"
    FORCE_RELEASED = "force_released"
    EVENTS = [
        (GRANTED, "granted"),
        # A grant that took a resource whose previous lease had expired unreleased.
        (TAKEN_OVER, "taken over"),
        (RELEASED, "released"),
        # A release that found the lease already expired or taken by another holder.
        (RELEASE_REFUSED, "release refused"),
        # The holder's process noticed its lease was gone (renewal refused, deadline passed).
        (LOST, "lost"),
        (QUARANTINED, "quarantined"),
        (RESTORED, "restored"),
        (FORCE_RELEASED, "force-released"),
    ]

    at = models.DateTimeField(help_text="When it happened, by the clock of the process that saw it.")
    event = models.CharField(max_length=20, choices=EVENTS)
    # As long as Resource.kind: a semaphore's rows carry its name in their kind.
    kind = models.CharField(max_length=255)
    name = models.CharField(max_length=255)
    resource_id = models.BigIntegerField(null=True, blank=True)
    holder = models.CharField(max_length=255, blank=True, default="")
    fence = models.BigIntegerField(null=True, blank=True)
    previous_holder = models.CharField(
        max_length=255, blank=True, default="", help_text="For a take-over: whose expired lease was taken."
    )
    expires_at = models.DateTimeField(null=True, blank=True, help_text="For a grant: its expiry (database clock).")
    actor = models.CharField(max_length=150, blank=True, default="", help_text="Who did an operator's action.")
    detail = models.CharField(max_length=500, blank=True, default="")

    exact_text_fields: ClassVar[tuple[str, ...]] = ("kind", "name")

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            # Recent events first (the overview, the admin list) and pruning by age.
            models.Index(fields=["at"], name="resource_lease_event_at_idx"),
            # A resource's own history.
            models.Index(fields=["kind", "name", "at"], name="resource_lease_event_res_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.event} {self.kind}:{self.name}"


class PoolOverview(Resource):
    """The admin's pool overview page (per kind: total, free, held, quarantined, utilisation).

    A proxy of ``Resource`` with no data of its own, so the page has an entry on the admin
    index like any model.
    """

    class Meta:
        proxy = True
        verbose_name = "pool overview"
        verbose_name_plural = "pool overview"


class _CoordinationManager(models.Manager["Resource"]):
    """The coordination rows of one family: kind equal to ``kind``, or starting with ``prefix``."""

    def __init__(self, *, kind: str = "", prefix: str = "") -> None:
        super().__init__()
        self.kind, self.prefix = kind, prefix

    def get_queryset(self) -> models.QuerySet[Resource]:
        queryset = super().get_queryset()
        return queryset.filter(kind=self.kind) if self.kind else queryset.filter(kind__startswith=self.prefix)


class LockRow(Resource):
    """The admin's page of named locks (``resource_lease.lock``): the rows of kind ``@lock``."""

    objects: ClassVar[_CoordinationManager] = _CoordinationManager(kind=f"{COORDINATION_PREFIX}lock")  # type: ignore[assignment]

    class Meta:
        proxy = True
        verbose_name = "lock"
        verbose_name_plural = "locks"


class SemaphoreSlot(Resource):
    """The admin's page of semaphores (``resource_lease.semaphore``): one row per slot, of kind
    ``@semaphore:<name>``."""

    objects: ClassVar[_CoordinationManager] = _CoordinationManager(prefix=f"{COORDINATION_PREFIX}semaphore:")  # type: ignore[assignment]

    class Meta:
        proxy = True
        verbose_name = "semaphore slot"
        verbose_name_plural = "semaphores"


class ElectionRow(Resource):
    """The admin's page of leader elections: the rows of kind ``@election``, whose ``data`` is
    the hand-over state the last leader saved."""

    objects: ClassVar[_CoordinationManager] = _CoordinationManager(kind=f"{COORDINATION_PREFIX}election")  # type: ignore[assignment]

    class Meta:
        proxy = True
        verbose_name = "election"
        verbose_name_plural = "elections"


class DispenserItem(models.Model):
    """One work item of a dispenser (``resource_lease.Dispenser``): a key, its JSON payload
    and its claim.

    Only the dispenser engine writes ``state``, ``worker``, ``expires_at``, ``fence``,
    ``claim_token`` and ``attempts``, always with a conditional UPDATE judged by the
    database's clock. An item in state ``assigned`` whose ``expires_at`` has passed is free
    to be claimed again (its claim counted as an attempt).
    """

    PENDING = "pending"
    ASSIGNED = "assigned"
    DONE = "done"
    FAILED = "failed"
    STATES = [(PENDING, "pending"), (ASSIGNED, "assigned"), (DONE, "done"), (FAILED, "failed")]

    dispenser = models.CharField(max_length=200, help_text="The dispenser (pool of work) this item belongs to.")
    # "key" is a reserved word in MySQL: the column has another name.
    key = models.CharField(max_length=255, db_column="item_key", help_text="Unique within its dispenser.")
    payload = models.JSONField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=STATES, default=PENDING)
    worker = models.CharField(
        max_length=200, blank=True, default="", help_text="The worker that holds (or last held) the item."
    )
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="End of the current claim (database clock); NULL unless assigned."
    )
    fence = models.BigIntegerField(default=0, help_text="Raised by one on every claim; never goes down.")
    claim_token = models.CharField(
        max_length=32, blank=True, default="", help_text="Random key of the assign that made the current claim."
    )
    attempts = models.IntegerField(default=0, help_text="Claims made since the item was last queued afresh.")
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # Made exact by migration 0005 (db/dispenser.py); check W010 keeps watching them.
    exact_text_fields: ClassVar[tuple[str, ...]] = ("dispenser", "key", "worker")

    class Meta:
        ordering = ["dispenser", "id"]
        constraints = [
            models.UniqueConstraint(fields=["dispenser", "key"], name="resource_lease_item_key_uniq"),
            models.CheckConstraint(condition=Q(fence__gte=0), name="resource_lease_item_fence_not_negative"),
        ]
        indexes = [
            # "Next pending items" (state pending, expires_at NULL, oldest id first) and
            # "expired claims" (state assigned, expires_at in the past): one range each.
            models.Index(fields=["dispenser", "state", "expires_at", "id"], name="resource_lease_item_next_idx"),
            # "This worker's items": its claims, renewed and returned first by assign.
            models.Index(fields=["dispenser", "worker", "state"], name="resource_lease_item_worker_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.dispenser}:{self.key}"


class GroupMember(Resource):
    """The admin's page of group members: the ``@group:<name>`` rows (a proxy, no data of its own)."""

    class Meta:
        proxy = True
        verbose_name = "group member"
        verbose_name_plural = "group members"


class BarrierOverview(Resource):
    """The admin's page of barriers: round, frozen cohort, who is inside and who waits."""

    class Meta:
        proxy = True
        verbose_name = "barrier"
        verbose_name_plural = "barriers"


class Topic(models.Model):
    """A notification topic (``notify``/``watch``): its version and the last payload sent.

    Only ``resource_lease.notify()`` writes it, with one upsert per notification that raises
    ``version`` by one (created at 1 on first use).
    """

    name = models.CharField(max_length=200, unique=True)
    version = models.BigIntegerField(default=0, help_text="Raised by one on every notification; never goes down.")
    payload = models.JSONField(null=True, blank=True, help_text="The last notification's payload.")
    updated_at = models.DateTimeField(help_text="When the last notification was sent (database clock).")

    # Made exact by migration 0008 (ExactCollation); check W010 keeps watching it.
    exact_text_fields: ClassVar[tuple[str, ...]] = ("name",)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(version__gte=0), name="resource_lease_topic_version_not_negative")
        ]

    def __str__(self) -> str:
        return self.name


class ConfigEntry(models.Model):
    """One key of a live configuration namespace (``resource_lease.Config``).

    ``type`` and ``default`` are written by every ``Config`` that declares the key (so the
    admin can validate an edit); ``value`` is NULL while the key has no stored value (its
    default applies). Every change of ``value`` raises ``version`` by one.
    """

    TYPES = [("bool", "bool"), ("int", "int"), ("float", "float"), ("str", "str"), ("list", "list"), ("dict", "dict")]

    namespace = models.CharField(max_length=200)
    key = models.CharField(max_length=200)
    type = models.CharField(max_length=10, choices=TYPES, help_text="The type of the key's default; values keep it.")
    default = models.JSONField(null=True, blank=True, help_text="The default declared by the code.")
    value = models.JSONField(null=True, blank=True, help_text="The stored value; empty: the default applies.")
    version = models.BigIntegerField(default=0, help_text="Raised by one on every change of the value.")
    updated_at = models.DateTimeField(help_text="When the value (or the declaration) last changed (database clock).")

    # Made exact by migration 0008 (ExactCollation); check W010 keeps watching them.
    exact_text_fields: ClassVar[tuple[str, ...]] = ("namespace", "key")

    class Meta:
        ordering = ["namespace", "key"]
        verbose_name = "config entry"
        verbose_name_plural = "config entries"
        constraints = [
            models.UniqueConstraint(fields=["namespace", "key"], name="resource_lease_config_key_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}:{self.key}"
