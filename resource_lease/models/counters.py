"""Shared counters: ``Counter`` (``resource_lease.counter``)."""

from __future__ import annotations

from typing import ClassVar

from django.db import models


class Counter(models.Model):
    """A named shared counter (``resource_lease.counter``): a BIGINT that every process adds to.

    Only the engine writes it: one upsert per ``add`` that creates the row on first use (at 0,
    plus what was added) and hands back the new value from the same statement.
    """

    name = models.CharField(max_length=200, unique=True)
    value = models.BigIntegerField(default=0, help_text="The counter's value: the sum of everything added.")
    updated_at = models.DateTimeField(help_text="When the value last changed (database clock).")

    # Made exact by migration 0011 (ExactCollation); check W010 keeps watching it.
    exact_text_fields: ClassVar[tuple[str, ...]] = ("name",)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
