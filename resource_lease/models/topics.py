"""Notifications and live configuration: ``Topic`` (``notify``/``watch``) and ``ConfigEntry``
(``Config``)."""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.db.models import Q

from resource_lease.db.json_text import ExactEncoder


class Topic(models.Model):
    """A notification topic (``notify``/``watch``): its version and the last payload sent.

    Only ``resource_lease.notify()`` writes it, with one upsert per notification that raises
    ``version`` by one (created at 1 on first use).
    """

    name = models.CharField(max_length=200, unique=True)
    version = models.BigIntegerField(default=0, help_text="Raised by one on every notification; never goes down.")
    payload = models.JSONField(
        null=True, blank=True, encoder=ExactEncoder, help_text="The last notification's payload."
    )
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

    ``type`` is written by the first ``Config`` that declares the key and kept (so the
    admin validates an edit the same way whatever process started last; ``Config.retype``
    changes it), ``default`` by every declaration of that type; ``value`` is NULL while the key has no stored value (its
    default applies). Every change of ``value`` raises ``version`` by one.
    """

    TYPES = [("bool", "bool"), ("int", "int"), ("float", "float"), ("str", "str"), ("list", "list"), ("dict", "dict")]

    namespace = models.CharField(max_length=200)
    key = models.CharField(max_length=200)
    type = models.CharField(max_length=10, choices=TYPES, help_text="The type of the key's default; values keep it.")
    default = models.JSONField(
        null=True, blank=True, encoder=ExactEncoder, help_text="The default declared by the code."
    )
    value = models.JSONField(
        null=True, blank=True, encoder=ExactEncoder, help_text="The stored value; empty: the default applies."
    )
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
