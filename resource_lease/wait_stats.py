"""Waits and time-outs per pool kind across every process, from the audit trail.

The Prometheus histogram ``resource_lease_acquire_wait_seconds`` is per process (or per
host, in multiprocess mode); the pool overview shows the same figures for the whole
deployment from ``LeaseEvent``: each grant event carries how long its caller waited
(``waited``), and each caller that gave up leaves a ``timed_out`` event. So they need
``RESOURCE_LEASE["AUDIT"]``. The quantiles are read off the metrics' buckets, as Prometheus's
``histogram_quantile`` would: "the median wait is at most this bucket's bound".
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Count, DateTimeField, DurationField, ExpressionWrapper, Max, Q, Value

from resource_lease.db.clock import DbNow
from resource_lease.db.connections import database_errors
from resource_lease.metrics import BUCKETS
from resource_lease.models import LeaseEvent

GRANTS = (LeaseEvent.GRANTED, LeaseEvent.TAKEN_OVER)


def quantile(q: float, cumulative: list[tuple[float, int]], total: int) -> float | None:
    """The smallest bucket bound under which at least ``q`` of ``total`` waits fall."""
    if not total:
        return None
    for bound, count in cumulative:
        if count >= q * total:
            return bound
    return float("inf")


def wait_stats(using: str, *, seconds: float = 3600.0) -> dict[str, dict[str, Any]]:
    """Per pool kind, over the last ``seconds`` by the database's clock: ``granted``,
    ``taken_over``, ``timed_out``, ``measured`` (grants with a recorded wait), ``median``,
    ``p95`` (bucket bounds, seconds) and ``longest`` (seconds). Coordination kinds are left out."""
    since = ExpressionWrapper(
        DbNow() - Value(dt.timedelta(seconds=seconds), output_field=DurationField()), output_field=DateTimeField()
    )
    events = LeaseEvent.objects.using(using).filter(at__gte=since).exclude(kind__startswith="@")
    finite = [b for b in BUCKETS if b != float("inf")]
    buckets = {f"le_{i}": Count("id", filter=Q(event__in=GRANTS, waited__lte=b)) for i, b in enumerate(finite)}
    rows = (
        events.filter(event__in=(*GRANTS, LeaseEvent.TIMED_OUT))
        .values("kind")
        .annotate(
            granted=Count("id", filter=Q(event__in=GRANTS)),
            taken_over=Count("id", filter=Q(event=LeaseEvent.TAKEN_OVER)),
            timed_out=Count("id", filter=Q(event=LeaseEvent.TIMED_OUT)),
            measured=Count("id", filter=Q(event__in=GRANTS, waited__isnull=False)),
            longest=Max("waited", filter=Q(event__in=GRANTS)),
            **buckets,
        )
        .order_by("kind")
    )
    result: dict[str, dict[str, Any]] = {}
    with database_errors(using, "reading the waits from the audit trail"):
        for row in rows:
            cumulative = [(b, int(row[f"le_{i}"])) for i, b in enumerate(finite)]
            measured = int(row["measured"])
            result[row["kind"]] = {
                "granted": int(row["granted"]),
                "taken_over": int(row["taken_over"]),
                "timed_out": int(row["timed_out"]),
                "measured": measured,
                "median": quantile(0.5, cumulative, measured),
                "p95": quantile(0.95, cumulative, measured),
                "longest": row["longest"],
            }
    return result
