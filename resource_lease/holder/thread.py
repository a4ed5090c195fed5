"""The threaded holder: hold one valid resource for minutes, renewed from a background thread.

``ResourceHolder`` keeps the shape of the hand-written ``Resource(threading.Thread)`` holder it
replaces (over a MySQL lock table), so that code maps onto it:

=================  ==========================================================
hand-written       here
=================  ==========================================================
initResource       ``acquire()``: blocks until a *valid* resource is held
search_Sql         ``search()``: candidate rows (default: the engine's acquire)
lock_Sql           ``lock(candidate)``: the conditional UPDATE deciding a race
keepOccupation     ``keep_occupation()``: one renewal, run by the thread
run                ``run()``: renew every ``renew_interval`` until terminated
fix                ``fix()``: if not ``is_valid()``, quarantine it, take another
close / terminate  ``close()`` releases; ``terminate()`` also ends the thread
=================  ==========================================================

Unlike the hand-written holder it never trusts a lease past a local deadline (counted from when the
acquire or renewal was sent), says so loudly when a lease is lost (``on_lost()``), and
takes a resource found invalid out of service with a recorded reason (quarantine) instead
of pushing its expiry a day ahead.
"""

from __future__ import annotations

import abc
import itertools
import logging
import threading
import time
from types import TracebackType
from typing import Any

from django.db import connections as django_connections
from django.db import transaction

from resource_lease.db.connections import close_connections
from resource_lease.exceptions import LeaseError, LeaseLost, NoResourceAvailable
from resource_lease.holder.config import HolderConfig, check_thread_name
from resource_lease.holder.registry import register, unregister
from resource_lease.holder.state import (
    AcquireCancelled,
    HolderStateMachine,
    is_trusted,
    release_quietly,
)
from resource_lease.lease import Lease
from resource_lease.renewal import renew_once
from resource_lease.validation import check_timeout

logger = logging.getLogger("resource_lease")

_names = itertools.count(1)


class ResourceHolder(HolderStateMachine, metaclass=abc.ABCMeta):
    """Hold one valid resource of ``kind``, renewed every ``renew_interval`` by this thread.

    Subclass it, set ``kind`` (and ``ttl``, ``renew_interval``, ``quarantine_seconds`` if the
    defaults do not suit) and implement ``is_valid()``. Every class attribute can also be
    given to the constructor, which checks them all (``ValueError`` naming the argument)::

        class ProxyHolder(ResourceHolder):
            kind = "proxy"
            ttl = 60
            renew_interval = 20

            def is_valid(self) -> bool:
                return probe(self.resource.data["url"])

        with ProxyHolder() as holder:            # acquire() + start(); terminate() on exit
            while work_left():
                lease = holder.check()          # LeaseLost once the lease is not trusted
                crawl(via=lease.resource.data["url"])

    When a renewal finds the lease gone, the thread calls ``on_lost()`` and acquires a fresh
    resource (``holder.fence`` changes). A work loop that must not straddle two leases keeps
    the ``Lease`` it started with and calls its ``check()``, or writes through its
    ``fenced()``.
    """

    #: The pool to lease from (required).
    kind: str = ""
    #: Seconds a lease lasts without renewal (the hand-written holder's occupation_delta); default: the
    #: ``TTL`` setting.
    ttl: float | None = None
    #: Seconds between renewals (the hand-written holder's occupation_interval); must leave time to renew
    #: before the local deadline (ttl less the safety margin). Default: ttl x RENEW_FRACTION.
    renew_interval: float | None = None
    #: Seconds a resource found invalid stays out of service; default: QUARANTINE_SECONDS.
    quarantine_seconds: float | None = None
    #: Keys and values a resource's ``data`` must have (``{"region": "eu"}``), as
    #: ``acquire(where=...)``; None: any resource of the kind.
    where: dict[str, Any] | None = None
    #: Place among the waiters of the kind: higher first (as ``acquire(priority=...)``).
    priority: int = 0

    def __init__(
        self,
        *,
        kind: str | None = None,
        ttl: float | None = None,
        renew_interval: float | None = None,
        quarantine_seconds: float | None = None,
        holder: str | None = None,
        using: str | None = None,
        name: str | None = None,
        where: dict[str, Any] | None = None,
        priority: int | None = None,
    ) -> None:
        cls = type(self)
        config = HolderConfig.resolve(
            cls,
            kind=kind,
            ttl=ttl,
            renew_interval=renew_interval,
            quarantine_seconds=quarantine_seconds,
            using=using,
            where=where,
            priority=priority,
        )
        name = check_thread_name(name)
        super().__init__(config, holder=holder, name=name or f"{cls.__name__}-{next(_names)}")

    def on_lost(self) -> None:
        """Called by the thread when the lease is gone (``lost_lease``, ``lost_reason``),
        before it acquires a fresh resource. The default logs a warning."""
        logger.warning("%s lost %r: %s; acquiring a fresh resource", self.name, self.lost_lease, self.lost_reason)

    # -- acquire, fix, close --------------------------------------------------------------

    def acquire(self, timeout: float | None = None) -> Lease:
        """Block until a resource for which ``is_valid()`` is true is held; return its lease.

        Invalid candidates are quarantined for ``quarantine_seconds`` (reason recorded) and
        skipped. ``timeout``: None waits as long as it takes; otherwise ``NoResourceAvailable``
        after that many seconds. A kind with no resources at all raises at once. If a trusted
        lease is already held, it is returned as is.
        """
        wait = check_timeout(timeout)
        self._check_callable_here()
        with self._acquire_mutex:
            try:
                return self._acquire(wait, in_thread=False)
            except AcquireCancelled as exc:
                raise NoResourceAvailable(str(exc), kind=self._kind) from None

    def fix(self, reason: str | None = None, timeout: float | None = None) -> bool:
        """The hand-written holder's fix: keep the resource if ``is_valid()``, else quarantine it and acquire
        another (blocking, as ``acquire(timeout)``). With ``reason``, quarantine it without
        asking ``is_valid()`` (the work found it broken). Returns True if it was kept."""
        if reason is not None and (not isinstance(reason, str) or not reason.strip()):
            raise ValueError(f"reason must be a non-empty string or None, got {reason!r}")
        wait = check_timeout(timeout)
        self._check_callable_here()
        with self._acquire_mutex:
            with self._state_lock:
                lease, validated, epoch = self._current, self._validated, self._epoch
            try:
                if lease is not None and validated and is_trusted(lease):
                    if reason is None:
                        ok, reason = self._validate()
                        if ok:
                            return True
                        # A close()/terminate() while is_valid() ran took the resource away,
                        # and is_valid() may have looked at none: no verdict on this one.
                        self._raise_if_cancelled(epoch)
                    self._reject(lease, reason)
                self._acquire(wait, in_thread=False, epoch=epoch)
            except AcquireCancelled as exc:
                raise NoResourceAvailable(str(exc), kind=self._kind) from None
            return False

    def close(self) -> bool:
        """Release the current lease (the thread keeps running, idle, until ``terminate()``).

        Stops an acquire in progress. Idempotent. Returns True if a lease of ours was released.
        """
        with self._state_lock:
            self._epoch += 1
            lease, self._current = self._current, None
            self._validated = self._lost_pending = False
            self.lost_event.clear()
        self._waker.wake()  # an acquire waiting in line gives up at once
        return lease is not None and lease.release()

    def terminate(self, timeout: float | None = None) -> None:
        """Release the lease and stop the thread (joined up to ``timeout`` seconds). Idempotent."""
        self._stopping.set()
        self._waker.wake()
        try:
            self.close()
        except LeaseError as exc:  # the lease expires by itself; terminating must go on
            logger.warning("%s: releasing on terminate failed: %s", self.name, exc)
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        unregister(self)

    # -- the thread -------------------------------------------------------------------

    def start(self) -> None:
        """Start the renewal thread (call ``acquire()`` first; without a lease it idles)."""
        if self._stopping.is_set():
            raise LeaseError(f"{self!r} was terminated")
        self._register()
        super().start()

    def run(self) -> None:
        """Renew every ``renew_interval`` until terminated; re-acquire when the lease is lost."""
        try:
            while not self._stopping.is_set():
                self._stopping.wait(self.keep_occupation())
        except BaseException:
            logger.exception("%s: the holder thread failed; its lease is no longer renewed", self.name)
            raise
        finally:
            # A thread's connections are its own: nobody else can close them.
            close_connections()
            django_connections.close_all()

    def keep_occupation(self) -> float:
        """One step of the thread: renew the lease if due. Returns seconds until the next."""
        with self._state_lock:
            lease, validated, due = self._current, self._validated, self._sent_at + self._renew_interval
        if lease is None:
            return self._renew_interval
        now = time.monotonic()
        if now < due:
            return due - now
        sent_at = now
        held = _HeldLease(lease)
        step = renew_once(held, interval=self._renew_interval, prefix=f"{self.name}: ")
        if not step.renewed:
            if held.lost_reason is not None and self._current is lease:
                self._handle_loss(lease, validated, held.lost_reason)
            return 0.0 if step.retry_in is None else step.retry_in
        with self._state_lock:
            if self._current is lease:
                self._sent_at = sent_at
        return max(0.0, sent_at + self._renew_interval - time.monotonic())

    def _handle_loss(self, lease: Lease, validated: bool, reason: str) -> None:
        with self._state_lock:
            if self._current is not lease:
                return  # closed or replaced meanwhile: not a loss
            self._current = None
            self._validated = False
            self._lost_pending = validated
            if validated:
                self.lost_event.set()
            epoch = self._epoch  # a close() from now on cancels the re-acquire
        if validated:
            self.lost_lease, self.lost_reason = lease, reason
            try:
                self.on_lost()  # first: releasing may wait on a database that is down
            except Exception:
                logger.exception("%s: on_lost() raised", self.name)
        release_quietly(lease)  # frees it if the database still has it as ours
        if not validated:
            return  # a candidate still being checked: acquire() notices and moves on
        # The caller may be in acquire()/fix(); wait for it, but never past terminate().
        while not self._acquire_mutex.acquire(timeout=0.1):
            if self._stopping.is_set():
                return
        try:
            self._acquire(None, in_thread=True, epoch=epoch)
        except AcquireCancelled:
            pass
        finally:
            self._acquire_mutex.release()

    # -- inside -----------------------------------------------------------------------

    def _register(self) -> None:
        register(self)

    def _check_callable_here(self) -> None:
        if self._stopping.is_set():
            raise LeaseError(f"{self!r} was terminated")
        if transaction.get_connection(self._using).in_atomic_block:
            # A quarantine written in the caller's transaction would be undone by its
            # rollback, and on a single-writer database the grant would wait for it
            # (see docs/pitfalls.md#own-connection and docs/pitfalls.md#sqlite).
            raise LeaseError(
                f"{type(self).__name__}.acquire()/fix() inside an open transaction on {self._using!r}:"
                " a holder works on its own; call it before entering atomic()"
            )

    # -- context manager ---------------------------------------------------------------

    def __enter__(self) -> ResourceHolder:
        try:
            self.acquire()
            self.start()
        except BaseException:
            self.terminate()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.terminate()


class _HeldLease:
    """The holder's current lease as the renewal policy sees it (``renewal.Renewable``).

    A loss is only recorded here (``lost_reason``): the holder thread handles it once the
    renewal step is over, since handling it means acquiring another resource.
    """

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost_reason: str | None = None

    def __repr__(self) -> str:
        return repr(self.lease)

    def renew(self) -> object:
        try:
            return self.lease.renew()
        except LeaseLost as exc:
            if not self.lease.released:  # given back meanwhile (close()): not a loss
                self.lost_reason = self.lease.lost_reason or str(exc)
            raise

    def remaining(self) -> float:
        return self.lease.remaining()

    def mark_lost(self, reason: str) -> None:
        self.lost_reason = reason


__all__ = ["ResourceHolder"]
