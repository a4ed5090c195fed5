"""What the prune commands share: a cutoff N days back by the database's clock, and deleting
what is older in small batches (short locks on tables other writers keep using)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import DateTimeField, DurationField, ExpressionWrapper, Q, QuerySet, Value

from resource_lease.db.clock import DbNow

BATCH = 5000


def days_ago(days: float) -> ExpressionWrapper:
    """The database's now less ``days`` (docs/pitfalls.md#database-clock)."""
    age = Value(dt.timedelta(days=days), output_field=DurationField())
    return ExpressionWrapper(DbNow() - age, output_field=DateTimeField())


def delete_in_batches(old: QuerySet[Any], order: str, again: Q | None = None) -> int:
    """Delete the rows of ``old``, ``BATCH`` at a time in ``order``; ``again``: a condition
    judged again in each DELETE (a row changed meanwhile stays). The count deleted."""
    deleted = 0
    while True:
        batch = list(old.order_by(order).values_list("pk", flat=True)[:BATCH])
        if not batch:
            return deleted
        rows = old.model._default_manager.using(old.db).filter(pk__in=batch)
        deleted += (rows if again is None else rows.filter(again)).delete()[0]
