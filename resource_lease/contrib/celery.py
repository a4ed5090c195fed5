"""Celery tasks that hold a leased resource while they run: ``LeaseTask``.

.. code-block:: python

    from resource_lease.contrib.celery import LeaseTask

    @app.task(bind=True, base=LeaseTask, lease_kind="proxy", lease_ttl=60, acks_late=True)
    def crawl(self, url):
        proxy_url = self.lease.resource.data["url"]
        ...

The lease is taken before the body runs (``self.lease``), renewed in the background while it
runs and released when it returns, raises or retries. When no resource is free the task is
retried later (a countdown with jitter) instead of keeping a worker slot busy; once
``max_retries`` is exhausted it fails with ``NoResourceAvailable``.

A worker process stopped by SIGTERM gives back every lease it holds at once: importing this
module connects ``worker_init`` and ``worker_process_init`` to
``resource_lease.install_sigterm_handler()`` (which chains to a handler installed before it,
and gives back what is still held when the process exits normally, as after Celery's warm
shutdown). A worker that dies (SIGKILL, a hard time limit, a lost machine) releases nothing: its
renewals stop with it, so the lease expires ``lease_ttl`` seconds later by the database's
clock, and a redelivered task (``acks_late``) gets a resource again then.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any, ClassVar

from celery import Task, signals

from resource_lease.exceptions import LeaseDatabaseError, NoResourceAvailable
from resource_lease.validation import (
    check_alias,
    check_kind,
    check_priority,
    check_seconds,
    check_timeout,
    check_where,
)

if TYPE_CHECKING:
    from resource_lease.lease import Lease

logger = logging.getLogger("resource_lease")

__all__ = ["LeaseTask"]


class LeaseTask(Task):
    """A task base class whose body runs while holding a lease on one resource of a kind.

    Options (class attributes, or keyword arguments of ``@app.task``):

    - ``lease_kind``: the pool to lease from (required).
    - ``lease_ttl``: seconds the lease lasts without renewal; default ``RESOURCE_LEASE["TTL"]``.
      It is renewed every ttl/3 while the body runs; a dead worker's lease frees after it.
    - ``lease_timeout``: seconds to wait for a free resource inside the worker before
      retrying the task instead (default 0: one attempt). ``None`` waits in the worker
      until one is free, holding the worker slot.
    - ``lease_retry_countdown``: seconds before the first retry when none was free; it doubles
      with every retry up to ``lease_retry_countdown_max``, and each countdown is drawn at
      random between half of that and all of it so waiting tasks spread out.
    - ``lease_retry_countdown_max``: the ceiling of that countdown.
    - ``lease_using``: the database alias; default ``RESOURCE_LEASE["DATABASE"]``.
    - ``lease_where``: keys and values the resource's ``data`` must have, as
      ``acquire(where=...)`` (e.g. ``{"region": "eu"}``); default None.
    - ``lease_priority``: place among the waiters when ``lease_timeout`` waits in line, as
      ``acquire(priority=...)``; default 0.
    - ``lease_lock_delay``: seconds the resource stays ungranted after this task's lease
      expired unreleased (its worker died), as ``acquire(lock_delay=...)``; default 0.
    - ``lease_quarantine_seconds``: how long a resource ``lease_is_valid`` refuses stays out
      of service; default ``RESOURCE_LEASE["QUARANTINE_SECONDS"]``.

    Override ``lease_is_valid(lease)`` (or pass ``lease_is_valid=function`` to ``@app.task``)
    to check a resource before the body runs, as ``ResourceHolder.is_valid`` does: False
    quarantines it (unless the hook called ``lease.quarantine(reason, seconds)`` itself, with
    its own reason) and another is leased in its place.
    - ``max_retries``: Celery's own limit, shared with retries the body asks for
      (``None`` retries for ever).
    """

    lease_kind: ClassVar[str | None] = None
    lease_ttl: ClassVar[float | None] = None
    lease_timeout: ClassVar[float | None] = 0
    lease_retry_countdown: ClassVar[float] = 1.0
    lease_retry_countdown_max: ClassVar[float] = 30.0
    lease_using: ClassVar[str | None] = None
    lease_where: ClassVar[dict[str, Any] | None] = None
    lease_priority: ClassVar[int] = 0
    lease_quarantine_seconds: ClassVar[float | None] = None
    lease_lock_delay: ClassVar[float] = 0.0

    _lease_options: ClassVar[frozenset[str]] = frozenset(
        {
            "lease_kind",
            "lease_ttl",
            "lease_timeout",
            "lease_retry_countdown",
            "lease_retry_countdown_max",
            "lease_using",
            "lease_where",
            "lease_priority",
            "lease_quarantine_seconds",
            "lease_lock_delay",
        }
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # @app.task(base=LeaseTask, ...) builds a subclass whose class dict holds the
        # options: a bad one is refused when the task is declared, not at 3 a.m.
        _validate_options(cls)

    # -- the lease of the current run ------------------------------------------------

    @property
    def lease(self) -> Lease:
        """The ``Lease`` held by the current run of this task (only inside the body)."""
        leases = self._running_leases()
        if not leases:
            raise RuntimeError(f"{self.name}: self.lease is only available while the task body runs")
        return leases[-1]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        lease = self._take_lease()
        leases = self._running_leases()
        leases.append(lease)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            leases.pop()
            self._give_back(lease)

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's ``retry``, giving the resource back before the retry is sent."""
        leases = self._running_leases()
        if leases:
            self._give_back(leases[-1])
        return super().retry(*args, **kwargs)

    def lease_is_valid(self, lease: Lease) -> bool:
        """Whether the leased resource works, checked before the body runs (default: True).

        False: it is quarantined for ``lease_quarantine_seconds`` and another is leased in
        its place (the hook may call ``lease.quarantine(reason, seconds)`` itself to record
        its own reason). An exception releases the resource and fails the task, so a bug in
        the check cannot quarantine the whole pool."""
        return True

    def lease_retry_delay(self, retries: int) -> float:
        """Seconds to wait before retry number ``retries + 1`` of a task that found none free."""
        ceiling = min(
            float(self.lease_retry_countdown_max), float(self.lease_retry_countdown) * 2.0 ** min(retries, 32)
        )
        return random.uniform(ceiling / 2, ceiling)

    # -- internals ---------------------------------------------------------------------

    def _running_leases(self) -> list[Lease]:
        # One task object serves every thread of a worker (threads pool): the leases of its
        # runs are kept per thread (a stack, for a task that calls itself directly). Not on
        # the Celery request: its unknown attributes travel as message headers on retry.
        local = self.__dict__.get("_lease_local")
        if local is None:
            local = self.__dict__.setdefault("_lease_local", threading.local())
        leases: list[Lease] | None = getattr(local, "leases", None)
        if leases is None:
            leases = local.leases = []
        return leases

    def _take_lease(self) -> Lease:
        from resource_lease.lease import acquire, default_holder

        kind = self.lease_kind
        if kind is None:
            raise ValueError(f"{self.name}: lease_kind must be set on a LeaseTask")
        using = None if self.lease_using is None else check_alias(self.lease_using, "lease_using")
        request = self.request
        task_id = request.id or "called-directly"
        try:
            while True:
                lease = acquire(
                    kind,
                    ttl=self.lease_ttl,
                    timeout=self.lease_timeout,
                    holder=f"{default_holder()} task {task_id}"[:255],
                    using=using,
                    auto_renew=True,
                    on_lost=functools.partial(_log_loss, self.name, task_id),
                    where=self.lease_where,
                    priority=self.lease_priority,
                    lock_delay=self.lease_lock_delay,
                )
                if self._checks_out(lease, task_id):
                    return lease
                # Quarantined: the next one now (each refusal takes one out of the pool).
        except NoResourceAvailable as exc:
            if not exc.exists or request.called_directly:
                raise  # nothing to wait for (a misconfiguration must fail loudly), or no worker
            attempt = request.retries + 1
            matching = "" if self.lease_where is None else f" matching {self.lease_where!r}"
            if self.max_retries is not None and request.retries >= self.max_retries:
                logger.warning(
                    "%s[%s]: no %r resource%s free (attempt %d), giving up", self.name, task_id, kind, matching, attempt
                )
                raise
            countdown = self.lease_retry_delay(request.retries)
            logger.info(
                "%s[%s]: no %r resource%s free (attempt %d), retrying in %.2fs",
                self.name,
                task_id,
                kind,
                matching,
                attempt,
                countdown,
            )
            if request.is_eager:
                # apply() re-runs a retry at once: wait here, or it would spin.
                time.sleep(countdown)
            raise self.retry(exc=exc, countdown=countdown) from None

    def _checks_out(self, lease: Lease, task_id: str) -> bool:
        """Ask ``lease_is_valid``; quarantine (and give back) the resource when it says no."""
        try:
            ok = self.lease_is_valid(lease)
        except BaseException:
            self._give_back(lease)
            raise
        if ok:
            return True
        if not lease.released:  # the hook did not quarantine it with its own reason
            lease.quarantine(f"{self.name}: lease_is_valid() returned False", self.lease_quarantine_seconds)
        logger.warning("%s[%s]: %s failed lease_is_valid(); leasing another", self.name, task_id, lease.resource)
        return False

    def _give_back(self, lease: Lease) -> None:
        try:
            released = lease.release()
        except LeaseDatabaseError:
            # The result stands; the lease simply expires after its ttl.
            logger.exception("%s[%s]: releasing %r failed", self.name, self.request.id, lease)
            return
        if not released and lease.lost:
            logger.warning("%s[%s]: finished without its lease: %s", self.name, self.request.id, lease.lost_reason)


def _log_loss(task_name: str, task_id: str, lease: Lease) -> None:
    logger.error(
        "%s[%s] lost its lease on %s (fence %d): %s", task_name, task_id, lease.resource, lease.fence, lease.lost_reason
    )


def _validate_options(cls: type[LeaseTask]) -> None:
    own = vars(cls)
    unknown = sorted(name for name in own if name.startswith("lease_") and name not in LeaseTask._lease_options)
    unknown = [name for name in unknown if not callable(own[name])]
    if unknown:
        known = ", ".join(sorted(LeaseTask._lease_options))
        raise ValueError(f"{cls.__name__}: unknown LeaseTask option {unknown[0]} (known: {known})")
    if cls.lease_kind is not None:
        check_kind(cls.lease_kind, "lease_kind")
    elif own.get("_decorated"):
        raise ValueError(f"{cls.__name__}: lease_kind must be set, e.g. @app.task(base=LeaseTask, lease_kind='proxy')")
    if cls.lease_ttl is not None:
        check_seconds(cls.lease_ttl, "lease_ttl")
    check_timeout(cls.lease_timeout, "lease_timeout")
    if cls.lease_quarantine_seconds is not None:
        check_seconds(cls.lease_quarantine_seconds, "lease_quarantine_seconds")
    countdown = check_seconds(cls.lease_retry_countdown, "lease_retry_countdown")
    ceiling = check_seconds(cls.lease_retry_countdown_max, "lease_retry_countdown_max")
    if ceiling < countdown:
        raise ValueError(f"lease_retry_countdown_max must be >= lease_retry_countdown ({countdown:g}), got {ceiling!r}")
    if cls.lease_using is not None and (not isinstance(cls.lease_using, str) or not cls.lease_using):
        raise ValueError(f"lease_using must be a database alias or None, got {cls.lease_using!r}")
    check_where(cls.lease_where, "lease_where")
    check_priority(cls.lease_priority, "lease_priority")
    check_seconds(cls.lease_lock_delay, "lease_lock_delay", allow_zero=True)
    retries = getattr(cls, "max_retries", None)
    if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int) or retries < 0):
        raise ValueError(f"max_retries must be an integer >= 0 or None, got {retries!r}")


def _give_back_on_sigterm(**_: Any) -> None:
    """A Celery worker process (the main one, and each prefork child as it starts) gives
    back what it holds on SIGTERM and at exit (``resource_lease.install_sigterm_handler``)."""
    if threading.current_thread() is not threading.main_thread():
        return  # Python's signal rule: only the main thread installs handlers
    from resource_lease.shutdown import install_sigterm_handler

    install_sigterm_handler()


signals.worker_init.connect(_give_back_on_sigterm, weak=False)
signals.worker_process_init.connect(_give_back_on_sigterm, weak=False)
