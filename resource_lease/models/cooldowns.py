"""``Cooldown``: when a resource may next be granted for one target (``acquire(kind,
target=...)``), one row per resource and target that ever had a cooldown or a rate cap."""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from resource_lease.models.resource import Resource

#: The longest target a caller may name (``acquire(..., target=...)``).
TARGET_MAX = 200


class Cooldown(models.Model):
    """A resource's cooldown for one target: a targeted grant of the resource waits until
    ``until`` (the database's clock). Written by ``lease.release(cooldown=s)``,
    ``lease.report("blocked", retry_after=s)`` and, where the kind's policy caps grants per
    target (``target_rate``), by each targeted grant (``recent``); read by every targeted
    grant statement and by the line of waiters (``resource_lease.db.statements``)."""

    resource = models.ForeignKey(Resource, on_delete=models.CASCADE, related_name="cooldowns")
    target = models.CharField(max_length=TARGET_MAX, help_text="What the resource was used for (a site, an API).")
    until = models.DateTimeField(help_text="A grant of the resource for this target waits until then (database clock).")
    recent = models.JSONField(
        default=list,
        blank=True,
        help_text="The policy's target_rate: the times (database clock, epoch seconds) of the latest grants for this"
        " target, at most n.",
    )

    # Made exact by the migration that creates it (ExactCollation); check W010 keeps watching it.
    exact_text_fields: ClassVar[tuple[str, ...]] = ("target",)

    class Meta:
        ordering = ["resource", "target"]
        constraints = [models.UniqueConstraint(fields=["target", "resource"], name="resource_lease_cooldown_once")]

    def __str__(self) -> str:
        return f"{self.resource_id} for {self.target}"
