"""Prometheus metrics, when ``prometheus_client`` is installed (the ``[metrics]`` extra).

The names, types and labels are the public contract (docs/operations.md#metrics):

- ``resource_lease_acquire_wait_seconds`` (histogram; kind, outcome): from the call to a
  grant (``granted``) or to giving up (``timeout``: ``NoResourceAvailable``/``LockHeld``;
  ``error``: anything else), measured by ``waiting()`` at the public entry points.
- ``resource_lease_grants_total``, ``resource_lease_takeovers_total``,
  ``resource_lease_lost_total`` (counters; kind): from the engine's signals.
- ``resource_lease_waiters`` (gauge; kind): callers of this process inside ``waiting()``.
- ``resource_lease_resources`` (gauge; kind, state): the pools' rows by state, read from the
  database when scraped (``ResourcesCollector``), coordination rows left out.
- ``resource_lease_leader`` (gauge; election): 1 while this process leads the election.
- ``resource_lease_reports_total`` (counter; kind, outcome): reports the database took
  (``Lease.report``: ok, error, blocked); ``resource_lease_auto_quarantines_total`` (counter;
  kind): the automatic quarantines those reports started (``resource_lease.health``).

Coordination rows are labelled by their reserved kind without the name (``@lock``,
``@semaphore``, ``@election``, ``@group``, ...), so a label's values stay few.

Without prometheus_client nothing is registered or connected: ``waiting()`` only reads the
monotonic clock twice (the wait is also recorded on the lease for the audit trail).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from resource_lease import signals
from resource_lease.exceptions import LeaseDatabaseError, NoResourceAvailable
from resource_lease.models import Resource

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

    from resource_lease.lease import Lease

try:
    import prometheus_client
except ImportError:  # the [metrics] extra is not installed: nothing to measure into
    prometheus_client = None  # type: ignore[assignment]

logger = logging.getLogger("resource_lease")

#: Whether the metrics are on (prometheus_client importable).
ENABLED = prometheus_client is not None

ELECTION_KIND = "@election"
#: Waits of a few milliseconds (a free resource) to minutes (a waiter in line).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, float("inf"))

_wait: Any = None
_grants: Any = None
_takeovers: Any = None
_lost: Any = None
_waiters: Any = None
_leader: Any = None
_reports: Any = None
_auto_quarantines: Any = None
_collector: ResourcesCollector | None = None
# Label children by label values: labels() takes a lock and builds a tuple every call.
_children: dict[tuple[Any, ...], Any] = {}

if prometheus_client is not None:
    _wait = prometheus_client.Histogram(
        "resource_lease_acquire_wait_seconds",
        "Seconds from the call to a grant or giving up, by kind and outcome (granted, timeout, error).",
        ["kind", "outcome"],
        buckets=BUCKETS,
    )
    _grants = prometheus_client.Counter("resource_lease_grants_total", "Grants, by kind.", ["kind"])
    _takeovers = prometheus_client.Counter(
        "resource_lease_takeovers_total", "Grants of a row whose last lease expired unreleased, by kind.", ["kind"]
    )
    _lost = prometheus_client.Counter("resource_lease_lost_total", "Leases found lost, by kind.", ["kind"])
    _waiters = prometheus_client.Gauge(
        "resource_lease_waiters",
        "Callers of this process waiting for a grant now.",
        ["kind"],
        multiprocess_mode="livesum",
    )
    _leader = prometheus_client.Gauge(
        "resource_lease_leader", "1 while this process leads the election.", ["election"], multiprocess_mode="livesum"
    )
    _reports = prometheus_client.Counter(
        "resource_lease_reports_total",
        "Reports of how a leased resource did, by kind and outcome.",
        ["kind", "outcome"],
    )
    _auto_quarantines = prometheus_client.Counter(
        "resource_lease_auto_quarantines_total",
        "Resources quarantined automatically by their reports, by kind.",
        ["kind"],
    )


def _child(metric: Any, *values: str) -> Any:
    key = (id(metric), *values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


def metric_kind(kind: str) -> str:
    """The kind label: a pool's kind as it is; a coordination row's reserved kind without
    its name (``@semaphore:exports`` -> ``@semaphore``)."""
    return kind.split(":", 1)[0] if kind.startswith("@") else kind


# -- waiting -----------------------------------------------------------------------------------


class WaitMeasure:
    """One caller's wait for a grant: ``with waiting(kind) as wait: ...; wait.granted(lease)``.

    On exit the wait is observed under its outcome: ``granted`` once ``granted(lease)`` was
    called, ``timeout`` when ``NoResourceAvailable`` (``LockHeld`` included) escapes,
    ``error`` for any other exception. A wait that ends without a grant is also sent as
    ``signals.lease_not_granted`` (the audit trail records timeouts from it).
    """

    __slots__ = ("holder", "kind", "outcome", "seconds", "started", "using", "waits")

    def __init__(self, kind: str, using: str, holder: str) -> None:
        self.kind = kind
        self.using = using
        self.holder = holder
        #: Whether the caller waits: only then is it counted in the ``resource_lease_waiters``
        #: gauge, from ``queued`` (its first attempt granted nothing) until the wait ends. A
        #: grant at the first attempt never shows in it: no scrape could see it, and the
        #: uncontended cycle need not pay two gauge updates for it.
        self.waits = False
        self.outcome: str | None = None
        self.seconds = 0.0
        self.started = 0.0

    def __enter__(self) -> WaitMeasure:
        self.started = time.monotonic()
        return self

    def queued(self) -> None:
        """The caller waits now (its first attempt granted nothing): counted in the
        ``resource_lease_waiters`` gauge until the wait ends, once however often it is told."""
        if _waiters is not None and not self.waits:
            _child(_waiters, self.kind).inc()
        self.waits = True

    def granted(self, lease: Lease) -> Lease:
        """Record the grant that ends the wait; the lease keeps how long it took (``waited``)."""
        self.outcome = "granted"
        lease.waited = time.monotonic() - self.started
        return lease

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.seconds = time.monotonic() - self.started
        if exc_type is None:
            outcome = self.outcome or "granted"
        elif self.outcome is not None and self.outcome != "granted":
            outcome = self.outcome  # the entry point knows better (a cancelled wait: "timeout")
        else:
            outcome = "timeout" if issubclass(exc_type, NoResourceAvailable) else "error"
        self.outcome = outcome
        if _waiters is not None:
            if self.waits:
                _child(_waiters, self.kind).dec()
            _child(_wait, self.kind, outcome).observe(self.seconds)
        if outcome != "granted":
            signals.lease_not_granted.send(
                sender=Resource,
                kind=self.kind,
                outcome=outcome,
                seconds=self.seconds,
                using=self.using,
                holder=self.holder,
            )


def waiting(kind: str, *, using: str, holder: str = "") -> WaitMeasure:
    """Measure a public entry point's wait for a grant of ``kind`` (see ``WaitMeasure``; tell
    it ``queued()`` once the caller waits)."""
    return WaitMeasure(metric_kind(kind), using, holder)


# -- the engine's signals ----------------------------------------------------------------------


def _on_granted(sender: Any, lease: Lease, **kwargs: Any) -> None:
    kind = metric_kind(lease.kind)
    _child(_grants, kind).inc()
    if lease.resource.took_over:
        _child(_takeovers, kind).inc()
    if lease.kind == ELECTION_KIND:
        _child(_leader, lease.resource.name).set(1)


def _on_reported(sender: Any, lease: Lease, outcome: str, quarantined: bool, **kwargs: Any) -> None:
    kind = metric_kind(lease.kind)
    _child(_reports, kind, outcome).inc()
    if quarantined:
        _child(_auto_quarantines, kind).inc()


def _on_released(sender: Any, lease: Lease, **kwargs: Any) -> None:
    if lease.kind == ELECTION_KIND:
        _child(_leader, lease.resource.name).set(0)


def _on_lost(sender: Any, lease: Lease, **kwargs: Any) -> None:
    _child(_lost, metric_kind(lease.kind)).inc()
    if lease.kind == ELECTION_KIND:
        _child(_leader, lease.resource.name).set(0)


# -- the pools, read when scraped ----------------------------------------------------------------


class ResourcesCollector:
    """``resource_lease_resources{kind, state}``: the pools' rows by state, read from the
    database (``pool.counts``) each time the registry is collected. A database that cannot
    be read is logged and the metric left out of that scrape (the scrape itself succeeds)."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def _family(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        return GaugeMetricFamily(
            "resource_lease_resources",
            "Pool rows by state (database clock), read at scrape time.",
            labels=["kind", "state"],
        )

    def describe(self) -> Iterator[Any]:
        yield self._family()  # no database read when registered

    def collect(self) -> Iterator[Any]:
        from resource_lease import pool

        try:
            counts = pool.counts(using=self.using)
        except LeaseDatabaseError as exc:  # a scrape must not fail with the database
            logger.warning("metrics: reading the pools' states failed: %s", exc)
            return
        family = self._family()
        for kind, states in counts.items():
            for state in pool.STATES:
                family.add_metric([kind, state], states[state])
        yield family


def install() -> None:
    """Connect the signal receivers and register ``ResourcesCollector`` on the default
    registry, once (the app's ``ready()``); nothing without prometheus_client."""
    global _collector
    if prometheus_client is None or _collector is not None:
        return
    for signal, receiver in (
        (signals.lease_granted, _on_granted),
        (signals.lease_released, _on_released),
        (signals.lease_lost, _on_lost),
        (signals.lease_reported, _on_reported),
    ):
        signal.connect(receiver, sender=Resource, dispatch_uid=f"resource_lease.metrics.{receiver.__name__}")
    _collector = ResourcesCollector()
    prometheus_client.REGISTRY.register(_collector)


def registry() -> Any:
    """The registry to expose: the default one; in prometheus_client's multiprocess mode
    (``PROMETHEUS_MULTIPROC_DIR`` set) a fresh one that adds up every process's files, plus
    the pools read now."""
    import os

    if prometheus_client is None:
        raise RuntimeError("prometheus_client is not installed: pip install 'django-resource-lease[metrics]'")
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return prometheus_client.REGISTRY
    from prometheus_client import multiprocess

    collected = prometheus_client.CollectorRegistry()
    multiprocess.MultiProcessCollector(collected)
    collected.register(ResourcesCollector())
    return collected


def metrics_view(request: HttpRequest) -> HttpResponse:
    """A Django view serving the metrics in Prometheus's text format (``registry()``).
    Route it where only your Prometheus can reach it."""
    from django.http import HttpResponse

    if prometheus_client is None:
        return HttpResponse("prometheus_client is not installed\n", status=501, content_type="text/plain")
    return HttpResponse(
        prometheus_client.generate_latest(registry()), content_type=prometheus_client.CONTENT_TYPE_LATEST
    )
