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
