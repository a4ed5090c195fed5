"""``PoolPolicy``: how a pool learns (``resource_lease.pool_policy``), one row per kind."""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.db.models import Q


class PoolPolicy(models.Model):
    """A pool's policy: when a resource is quarantined automatically and for how long, when it
    retires, and the defaults of targets and sessions. A kind without a row has the defaults
    (``resource_lease.health.DEFAULTS``); ``pool_policy(kind, ...)`` and the admin write it."""

    kind = models.CharField(max_length=100, unique=True, help_text="The pool this policy is for.")
    error_threshold = models.FloatField(
        default=3.0, help_text="An error score this high quarantines the resource automatically."
    )
    error_decay = models.FloatField(
        default=0.5, help_text="Each report of 'ok' multiplies the error score by this (0 <= decay < 1)."
    )
    backoff_base = models.FloatField(default=60.0, help_text="Seconds of the first automatic quarantine.")
    backoff_cap = models.FloatField(default=3600.0, help_text="The longest automatic quarantine, in seconds.")
    target_rate_n = models.PositiveIntegerField(
        null=True, blank=True, help_text="Grants of one resource for one target per window (empty: no limit)."
    )
    target_rate_per = models.FloatField(null=True, blank=True, help_text="The window of target_rate_n, in seconds.")
    cooldown = models.FloatField(default=0.0, help_text="Seconds: the default cooldown of a release with a target.")
    session_idle = models.FloatField(
        default=600.0, help_text="Seconds after its last grant that a session's binding lives."
    )
    max_uses = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Grants after which a resource retires (empty: never)."
    )
    max_age = models.FloatField(
        null=True, blank=True, help_text="Seconds after its creation that a resource retires (empty: never)."
    )
    updated_at = models.DateTimeField(auto_now=True)

    # Made exact by the migration that creates it (ExactCollation); check W010 keeps watching it.
    exact_text_fields: ClassVar[tuple[str, ...]] = ("kind",)

    class Meta:
        ordering = ["kind"]
        verbose_name = "pool policy"
        verbose_name_plural = "pool policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(backoff_base__lte=models.F("backoff_cap")), name="resource_lease_policy_backoff"
            ),
        ]

    def __str__(self) -> str:
        return self.kind
