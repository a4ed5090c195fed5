"""The dispenser's table: ``DispenserItem``, one work item with its claim."""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.db.models import Q

from resource_lease.db.json_text import ExactEncoder


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
    payload = models.JSONField(null=True, blank=True, encoder=ExactEncoder)
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
    result = models.JSONField(null=True, blank=True, encoder=ExactEncoder)
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
