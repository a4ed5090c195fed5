"""The line of waiters: ``Waiter``, one row per caller waiting for a grant.

A caller that waits (``acquire(timeout=...)``, ``lock``, ``semaphore``, a holder, an election
campaign) takes a place in the line of what it waits for: ``(kind, "")`` for any row of a
kind (a pool, a semaphore's slots), ``(kind, name)`` for one named row (a lock, an election).
The place is itself leased: ``expires_at`` (the database's clock) is pushed on by the
process's background renewal, so a waiter that dies or is paused past its ttl drops out of
the line by itself and nobody has to clean up. Every grant statement refuses a row that a
live waiter ahead of the caller could take (see ``resource_lease.db.statements.LINE_CLEAR``);
the order is ``priority`` (higher first), then ``id`` (who asked first).

Only the engine writes these rows; the admin shows them read-only.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.db.models import DurationField, ExpressionWrapper, F

from resource_lease.db.clock import DbNow


class WaiterQuerySet(models.QuerySet["Waiter"]):
    """Places in line as operators see them (the engine reads its own statements)."""

    def live(self) -> WaiterQuerySet:
        """Places not expired by the database's clock: waiters that count."""
        return self.filter(expires_at__gt=DbNow())

    def in_order(self) -> WaiterQuerySet:
        """Line by line, in the order of service: higher priority, then who asked first."""
        return self.order_by("kind", "name", "-priority", "id")

    def with_waited(self) -> WaiterQuerySet:
        """Annotate ``waited``: how long each has been in line (database clock)."""
        return self.annotate(waited=ExpressionWrapper(DbNow() - F("since"), output_field=DurationField()))


class Waiter(models.Model):
    """A caller's place in the line of a kind (or of one named row of it)."""

    kind = models.CharField(max_length=255, help_text="The kind waited for (a pool, or a coordination kind).")
    name = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text="The one row waited for (a lock, an election); empty: any row of the kind.",
    )
    holder = models.CharField(max_length=255, help_text="Who waits: the holder the grant will record.")
    priority = models.IntegerField(default=0, help_text="Higher is served first; equal: first come, first served.")
    filter = models.JSONField(
        null=True,
        blank=True,
        help_text="The where= the waiter asked for, as the database compares it ([key, type, text] per key).",
    )
    target = models.CharField(
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text="The target the waiter asked for (acquire(target=...)): rows cooling down for it do not serve it."
        " Empty: none.",
    )
    shared = models.BooleanField(
        default=False,
        db_default=False,
        help_text="A reader of an rwlock: served alongside the readers ahead of it, never before a writer ahead.",
    )
    token = models.CharField(max_length=32, unique=True, help_text="Random key of this place, to settle a lost answer.")
    channel = models.CharField(
        max_length=63,
        blank=True,
        default="",
        db_default="",
        help_text="PostgreSQL: the NOTIFY channel of the waiter's process, where a release tells it its turn."
        " Empty: woken with its whole line.",
    )
    grant_ttl = models.FloatField(
        default=0.0,
        db_default=0.0,
        help_text="PostgreSQL: the ttl (seconds) of the grant a release may hand this waiter in its own statement"
        " (it then holds the row under its place's token). 0: it takes no hand-off and tries its own grants.",
    )
    since = models.DateTimeField(help_text="When the caller took its place (database clock).")
    expires_at = models.DateTimeField(
        help_text="The place is lost after this (database clock) unless its process renews it."
    )

    # Made exact by migrations 0010 and 0020 (ExactCollation); check W010 keeps watching them.
    exact_text_fields: ClassVar[tuple[str, ...]] = ("kind", "name", "target")

    objects = WaiterQuerySet.as_manager()

    class Meta:
        ordering = ["kind", "name", "-priority", "id"]
        verbose_name = "place in line"
        verbose_name_plural = "waiting in line"
        indexes = [
            # Every grant asks "is a live waiter of this line ahead of me?": the line's rows,
            # live ones, in order of service.
            models.Index(fields=["kind", "name", "expires_at"], name="resource_lease_line_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.holder} waiting for {self.line}"

    @property
    def line(self) -> str:
        """The line's name: the kind, or ``kind:name`` for one named row."""
        return f"{self.kind}:{self.name}" if self.name else self.kind

    @property
    def where(self) -> dict[str, object] | None:
        """The ``where=`` this waiter asked for (decoded from ``filter``)."""
        return None if not self.filter else decode_where(self.filter)


#: How each vendor's JSON functions name a where= value's type (``Dialect.where_types``).
_WHERE_TYPES = {
    "string": str,
    "text": str,
    "STRING": str,
    "number": int,
    "integer": int,
    "INTEGER": int,
    "boolean": bool,
    "BOOLEAN": bool,
    "true": bool,
    "false": bool,
    "null": type(None),
    "NULL": type(None),
}


def decode_where(entries: list[dict[str, str]]) -> dict[str, object]:
    """A waiter's ``filter`` (``Dialect.encode_where``'s entries) as the ``where=`` it was."""
    where: dict[str, object] = {}
    for entry in entries:
        kind, text = _WHERE_TYPES.get(entry.get("t", ""), str), entry.get("s", "")
        if kind is bool:
            where[entry["k"]] = text == "true" or entry.get("t") == "true"
        elif kind is int:
            where[entry["k"]] = int(text)
        elif kind is type(None):
            where[entry["k"]] = None
        else:
            where[entry["k"]] = text
    return where
