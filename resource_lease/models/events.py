"""The audit trail: ``LeaseEvent``, one row per grant, release, loss or operator's action."""

from __future__ import annotations

from typing import ClassVar

from django.db import models


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
    TIMED_OUT = "timed_out"
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
        # A caller gave up waiting: none could be had within its timeout.
        (TIMED_OUT, "timed out"),
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
    waited = models.FloatField(
        null=True, blank=True, help_text="For a grant or a time-out: seconds the caller waited (from its call)."
    )
    detail = models.CharField(max_length=500, blank=True, default="")

    exact_text_fields: ClassVar[tuple[str, ...]] = ("kind", "name")

    #: Events an operator (or a holder's ``lease.quarantine``) caused: ``actor`` says who.
    OPERATIONS: ClassVar[frozenset[str]] = frozenset({QUARANTINED, RESTORED, FORCE_RELEASED})

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

    @property
    def who(self) -> str:
        """Who caused it: the operator for an operator's action, else the lease's holder."""
        if self.event in self.OPERATIONS:
            return self.actor or "-"
        return self.holder or "-"

    @property
    def summary(self) -> str:
        """The detail in words: whom a take-over or a force release cut off, how long a
        caller waited, the operator's reason."""
        parts = []
        if self.event == self.TAKEN_OVER and self.previous_holder:
            parts.append(f"took over from {self.previous_holder}")
        if self.event == self.FORCE_RELEASED and self.holder:
            parts.append(f"cut off {self.holder}")
        elif self.detail:
            parts.append(self.detail)
        if self.waited is not None:
            parts.append(f"waited {self.waited:.3f}s")
        return "; ".join(parts)
