"""The threaded holder: hold one valid resource for minutes, renewed from a background thread.

``ResourceHolder`` is the seed's ``Resource(threading.Thread)`` kept recognisable:

=================  ==========================================================
seed               here
=================  ==========================================================
initResource       ``acquire()``: blocks until a *valid* resource is held
search_Sql         ``search()``: candidate rows (default: the engine's acquire)
lock_Sql           ``lock(candidate)``: the conditional UPDATE deciding a race
keepOccupation     ``keep_occupation()``: one renewal, run by the thread
run                ``run()``: renew every ``renew_interval`` until terminated
fix                ``fix()``: if not ``is_valid()``, quarantine it, take another
close / terminate  ``close()`` releases; ``terminate()`` also ends the thread
=================  ==========================================================

Unlike the seed it never trusts a lease past a local deadline (counted from when the
acquire or renewal was sent), says so loudly when a lease is lost (``on_lost()``), and
takes a resource found invalid out of service with a recorded reason (quarantine) instead
of pushing its expiry a day ahead.
"""

from __future__ import annotations

import abc
import itertools
import logging
import os
import signal
import socket
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from types import FrameType, TracebackType

from django.db import connections as django_connections
from django.db import transaction
from django.db.models import Q, QuerySet

from resource_lease import pool, signals
from resource_lease.conf import lease_settings
from resource_lease.db import DbNow
from resource_lease.db.connections import (
    close_connections,
    run_repeatable,
)
from resource_lease.exceptions import LeaseDatabaseError, LeaseError, LeaseLost, NoResourceAvailable
from resource_lease.lease import Lease, attempt_grant, safety_margin
from resource_lease.lease import acquire as lease_acquire
from resource_lease.models import Resource
from resource_lease.validation import (
    check_alias,
    check_holder,
    check_kind,
    check_seconds,
    check_timeout,
)
from resource_lease.waiting import Backoff

logger = logging.getLogger("resource_lease")

#: How many rows of a ``search()`` result one attempt tries to lock before backing off.
SEARCH_LIMIT = 20

_names = itertools.count(1)
# Holders that may hold a lease in this process, for ``terminate_all()`` (SIGTERM).
_live: weakref.WeakSet[ResourceHolder] = weakref.WeakSet()
_live_lock = threading.Lock()


class _Cancelled(LeaseError):
    """An acquire stopped waiting because the holder was closed or terminated."""


class ResourceHolder(threading.Thread, metaclass=abc.ABCMeta):
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
    #: Seconds a lease lasts without renewal (the seed's occupation_delta); default: the
    #: ``TTL`` setting.
    ttl: float | None = None
    #: Seconds between renewals (the seed's occupation_interval); must leave time to renew
    #: before the local deadline (ttl less the safety margin). Default: ttl x RENEW_FRACTION.
    renew_interval: float | None = None
    #: Seconds a resource found invalid stays out of service; default: QUARANTINE_SECONDS.
    quarantine_seconds: float | None = None

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
    ) -> None:
        cls = type(self)
        kind = cls.kind if kind is None else kind
        if kind == "" and cls.kind == "":
            raise ValueError(f"kind must be set: give {cls.__name__} a class attribute kind = '...' or pass kind=")
        self._kind = check_kind(kind)
        ttl = cls.ttl if ttl is None else ttl
        self._ttl = check_seconds(lease_settings.TTL if ttl is None else ttl, "ttl")
        interval = cls.renew_interval if renew_interval is None else renew_interval
        if interval is None:
            interval = self._ttl * float(lease_settings.RENEW_FRACTION)
        self._renew_interval = check_seconds(interval, "renew_interval")
        if self._renew_interval >= self._ttl:
            raise ValueError(f"renew_interval must be shorter than ttl ({self._ttl:g}s), got {interval!r}")
        trusted_for = self._ttl - safety_margin(self._ttl)
        if self._renew_interval >= trusted_for:
            raise ValueError(
                f"renew_interval must be shorter than the time a lease is trusted without renewal"
                f" (ttl {self._ttl:g}s less the safety margin = {trusted_for:g}s), got {interval!r}"
            )
        quarantine = cls.quarantine_seconds if quarantine_seconds is None else quarantine_seconds
        self._quarantine_seconds = check_seconds(
            lease_settings.QUARANTINE_SECONDS if quarantine is None else quarantine, "quarantine_seconds"
        )
        self._using = check_alias(lease_settings.DATABASE if using is None else using)
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"name must be a non-empty string or None, got {name!r}")
        super().__init__(name=name or f"{cls.__name__}-{next(_names)}", daemon=True)
        identity = check_holder(holder)
        #: Identity recorded on leased rows: ``"<hostname>:<pid>:<thread name>"`` by default,
        #: fixed for the holder's life whichever thread acquires.
        self.holder: str = identity or f"{socket.gethostname()}:{os.getpid()}:{self.name}"[:255]
        # The resolved configuration, readable under the familiar names.
        self.kind = self._kind
        self.ttl = self._ttl
        self.renew_interval = self._renew_interval
        self.quarantine_seconds = self._quarantine_seconds
        self.using = self._using

        #: Why the last ``is_valid()`` said no; ``is_valid()`` may set it (recorded as the
        #: quarantine reason).
        self.invalid_reason = ""
        #: The lease ``on_lost()`` is about, and why it was lost.
        self.lost_lease: Lease | None = None
        self.lost_reason = ""

        # _state_lock guards the fields below. It is reentrant because terminate() may run
        # in a signal handler on a thread that already holds it.
        self._state_lock = threading.RLock()
        self._current: Lease | None = None
        self._validated = False
        self._lost_pending = False
        #: Set when the thread finds the lease lost (a renewal refused, or the local deadline
        #: passed without one), cleared once a fresh lease is held or on ``close()``: a work
        #: loop can ``holder.lost_event.wait(timeout)`` instead of polling ``lost``.
        self.lost_event = threading.Event()
        self._sent_at = 0.0  # monotonic time the current lease was last acquired or renewed
        self._epoch = 0  # bumped by close(): an acquire started before it must give up
        # One acquire at a time (the caller's acquire()/fix() or the thread's re-acquire).
        self._acquire_mutex = threading.Lock()
        self._stopping = threading.Event()

    def __repr__(self) -> str:
        lease = self._current
        state = "holding" if self.holding else "lost" if self.lost else "idle"
        at = f" {lease.resource} fence={lease.fence}" if lease is not None else ""
        return f"<{type(self).__name__} {self.name} kind={self._kind!r}{at} {state}>"

    # -- to override ---------------------------------------------------------------

    @abc.abstractmethod
    def is_valid(self) -> bool:
        """Whether ``self.resource`` works; False quarantines it. May set ``invalid_reason``.

        Called with the candidate leased (so nobody else probes it at the same time). An
        exception is not taken as "invalid": it is raised to the caller of ``acquire()`` or
        ``fix()`` (the thread logs it and retries), so a bug cannot quarantine a whole pool.
        """

    def search(self) -> Iterable[Resource] | None:
        """Candidate rows for the lock step, best first; None uses the engine's acquire.

        Override to narrow the pool, starting from ``candidates()``, e.g.
        ``return self.candidates().filter(data__region="eu")``. Rows need not be free any
        more by the time they are locked: ``lock()`` decides. At most ``SEARCH_LIMIT`` rows
        of the result are tried per attempt.
        """
        return None

    def candidates(self) -> QuerySet[Resource]:
        """Free, enabled, unquarantined resources of ``kind``, least recently used first
        (by the database's clock), for ``search()`` to narrow."""
        now = DbNow()
        return (
            Resource.objects.using(self._using)
            .filter(kind=self._kind, enabled=True, busy_before__lte=now)
            .filter(Q(quarantined_until__isnull=True) | Q(quarantined_until__lte=now))
            .order_by("busy_before", "pk")
        )

    def lock(self, candidate: Resource) -> Lease | None:
        """Lease ``candidate`` if it is still free: one conditional UPDATE on its id (free by the
        database's clock, enabled, not quarantined) whose matched-row count decides a race.

        The grant is the engine's (fence + 1, holder, token, expiry = database now + ttl), so
        the ``Lease`` renews, releases and fences exactly like one from ``acquire()``.
        Returns None if another holder got there first.
        """
        kind, holder, ttl, pk = self._kind, self.holder, self._ttl, candidate.pk
        lease = attempt_grant(
            kind,
            ttl=ttl,
            holder=holder,
            alias=self._using,
            statement=lambda d, c, token: d.grant(c, pk=pk, kind=kind, holder=holder, token=token, ttl=ttl),
        )
        if lease is not None:
            signals.lease_granted.send(sender=Resource, lease=lease)
        return lease

    def on_lost(self) -> None:
        """Called by the thread when the lease is gone (``lost_lease``, ``lost_reason``),
        before it acquires a fresh resource. The default logs a warning."""
        logger.warning("%s lost %r: %s; acquiring a fresh resource", self.name, self.lost_lease, self.lost_reason)

    # -- state -------------------------------------------------------------------------

    @property
    def lease(self) -> Lease | None:
        """The current lease (while ``acquire()`` checks a candidate: the candidate's)."""
        return self._current

    @property
    def resource(self) -> Resource | None:
        """The current lease's resource row, as leased."""
        lease = self._current
        return None if lease is None else lease.resource

    @property
    def fence(self) -> int | None:
        """The current lease's fence; it changes whenever the holder moves to a new grant."""
        lease = self._current
        return None if lease is None else lease.fence

    @property
    def holding(self) -> bool:
        """Whether a validated lease is held and still trusted (before its local deadline)."""
        with self._state_lock:
            lease, validated = self._current, self._validated
        return validated and lease is not None and _trusted(lease)

    @property
    def lost(self) -> bool:
        """True from the moment the lease can no longer be trusted (renewal refused, local
        deadline passed) until a fresh one is held; for a work loop to poll. A bool, like
        ``Lease.lost``; ``lost_event`` is the Event to wait on."""
        with self._state_lock:
            lease, validated, pending = self._current, self._validated, self._lost_pending
        return pending or (validated and lease is not None and not _trusted(lease))

    def check(self) -> Lease:
        """Return the current lease if it may be trusted here and now, else raise ``LeaseLost``.

        Trust ends at a local deadline counted from when the acquire or the last renewal
        was sent (less a safety margin), even if the database cannot be reached.
        """
        with self._state_lock:
            lease, validated = self._current, self._validated
        if lease is None or not validated:
            raise LeaseLost(f"{self!r} holds no lease")
        lease.check()
        return lease

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
            except _Cancelled as exc:
                raise NoResourceAvailable(str(exc), kind=self._kind) from None

    def fix(self, reason: str | None = None, timeout: float | None = None) -> bool:
        """The seed's fix: keep the resource if ``is_valid()``, else quarantine it and acquire
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
                if lease is not None and validated and _trusted(lease):
                    if reason is None:
                        ok, reason = self._validate()
                        if ok:
                            return True
                        # A close()/terminate() while is_valid() ran took the resource away,
                        # and is_valid() may have looked at none: no verdict on this one.
                        self._raise_if_cancelled(epoch)
                    self._reject(lease, reason)
                self._acquire(wait, in_thread=False, epoch=epoch)
            except _Cancelled as exc:
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
        return lease is not None and lease.release()

    def terminate(self, timeout: float | None = None) -> None:
        """Release the lease and stop the thread (joined up to ``timeout`` seconds). Idempotent."""
        self._stopping.set()
        try:
            self.close()
        except LeaseError as exc:  # the lease expires by itself; terminating must go on
            logger.warning("%s: releasing on terminate failed: %s", self.name, exc)
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        with _live_lock:
            _live.discard(self)

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
        try:
            lease.renew()
        except LeaseLost as exc:
            if self._current is lease and not lease.released:
                self._handle_loss(lease, validated, lease.lost_reason or str(exc))
            return 0.0
        except LeaseDatabaseError as exc:
            if lease.remaining() > 0:
                logger.warning("%s: renewing %r failed, retrying: %s", self.name, lease, exc)
                return max(0.05, min(1.0, lease.remaining() / 4))
            if self._current is lease:
                self._handle_loss(lease, validated, f"could not renew before the local deadline: {exc}")
            return 0.0
        except Exception as exc:  # a bug must be loud, never a quietly dead renewal
            logger.exception("%s: renewing %r failed unexpectedly", self.name, lease)
            if self._current is lease:
                self._handle_loss(lease, validated, f"renewal failed: {exc!r}")
            return 0.0
        took = time.monotonic() - sent_at
        if took > self._renew_interval and self._current is lease:
            logger.warning(
                "%s: renewing %r took %.3fs, longer than the renew interval %.3fs",
                self.name,
                lease,
                took,
                self._renew_interval,
            )
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
        _release_quietly(lease)  # frees it if the database still has it as ours
        if not validated:
            return  # a candidate still being checked: acquire() notices and moves on
        # The caller may be in acquire()/fix(); wait for it, but never past terminate().
        while not self._acquire_mutex.acquire(timeout=0.1):
            if self._stopping.is_set():
                return
        try:
            self._acquire(None, in_thread=True, epoch=epoch)
        except _Cancelled:
            pass
        finally:
            self._acquire_mutex.release()

    # -- inside -----------------------------------------------------------------------

    def _check_callable_here(self) -> None:
        if self._stopping.is_set():
            raise LeaseError(f"{self!r} was terminated")
        if transaction.get_connection(self._using).in_atomic_block:
            # A quarantine written in the caller's transaction would be undone by its
            # rollback, and on a single-writer database the grant would wait for it.
            raise LeaseError(
                f"{type(self).__name__}.acquire()/fix() inside an open transaction on {self._using!r}:"
                " a holder works on its own; call it before entering atomic()"
            )

    def _register(self) -> None:
        with _live_lock:
            _live.add(self)

    def _acquire(self, wait: float | None, *, in_thread: bool, epoch: int | None = None) -> Lease:
        """The acquire loop; the caller holds ``_acquire_mutex``. ``epoch``: give up if
        ``close()`` has been called since then (default: since now)."""
        with self._state_lock:
            current, validated = self._current, self._validated
            if epoch is None:
                epoch = self._epoch
        self._raise_if_cancelled(epoch)
        if current is not None:
            if validated and _trusted(current):
                return current
            with self._state_lock:
                if self._current is current:
                    self._current, self._validated = None, False
            _release_quietly(current)
        self._register()
        deadline = None if wait is None else time.monotonic() + wait
        backoff = Backoff()
        while True:
            self._raise_if_cancelled(epoch)
            try:
                lease = self._grab(give_up_if_empty=not in_thread)
                if lease is not None and self._accept(lease, epoch):
                    return lease
            except (_Cancelled, NoResourceAvailable):
                raise
            except Exception as exc:
                if not in_thread:
                    raise
                # The thread has nobody to raise to: say it, wait, try again.
                logger.warning("%s: acquiring a fresh %r resource failed, retrying: %r", self.name, self._kind, exc)
                lease = None
            if lease is not None:
                continue  # it was invalid (quarantined) or lost while checked: next one now
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise NoResourceAvailable(
                    f"no valid resource of kind {self._kind!r} could be held within {wait:g}s", kind=self._kind
                )
            pause = backoff.next()
            self._stopping.wait(pause if deadline is None else min(pause, deadline - now))

    def _raise_if_cancelled(self, epoch: int) -> None:
        if self._stopping.is_set():
            raise _Cancelled(f"{self.name} was terminated while acquiring")
        if self._epoch != epoch:
            raise _Cancelled(f"{self.name} was closed while acquiring")

    def _grab(self, *, give_up_if_empty: bool) -> Lease | None:
        """One attempt: the engine's acquire, or lock the first free row ``search()`` found."""
        found = self.search()
        if found is None:
            try:
                return lease_acquire(self._kind, ttl=self._ttl, timeout=0, holder=self.holder, using=self._using)
            except NoResourceAvailable as exc:
                if give_up_if_empty and not exc.exists:
                    raise
                return None
        for candidate in _first(found, SEARCH_LIMIT):
            lease = self.lock(candidate)
            if lease is not None:
                return lease
        if give_up_if_empty:
            kind = self._kind
            exists = run_repeatable(self._using, lambda d, c: d.kind_exists(c, kind), what=f"looking up kind {kind!r}")
            if not exists:
                raise NoResourceAvailable(f"there are no resources of kind {kind!r}", kind=kind, exists=False)
        return None

    def _accept(self, lease: Lease, epoch: int) -> bool:
        """Install a fresh lease and check it; False if it was invalid (now quarantined)."""
        with self._state_lock:
            if self._stopping.is_set() or self._epoch != epoch:
                cancelled = True
            else:
                cancelled = False
                self._current, self._validated = lease, False
                # Renew counting from when the grant was sent, not from when the check ends.
                self._sent_at = _sent_time(lease, self._ttl)
        if cancelled:
            _release_quietly(lease)
            self._raise_if_cancelled(epoch)
        try:
            ok, reason = self._validate()
        except BaseException:
            self._drop(lease)
            raise
        if not ok:
            with self._state_lock:
                overtaken = self._current is not lease or self._stopping.is_set() or self._epoch != epoch
            if overtaken:
                # close()/terminate(), or the thread finding the candidate lost, took it away
                # while is_valid() ran, which may then have looked at no resource at all
                # (ProxyHolder: "no proxy URL"): that is no verdict on this one, so let it go
                # without quarantining it.
                self._drop(lease)
                self._raise_if_cancelled(epoch)
                logger.warning("%s: %r was lost while is_valid() checked it; trying again", self.name, lease)
                return False
            self._reject(lease, reason)
            return False
        with self._state_lock:
            if self._current is lease and self._epoch == epoch and not self._stopping.is_set() and _trusted(lease):
                self._validated = True
                self._lost_pending = False
                self.lost_event.clear()
                accepted = True
            else:
                accepted = False
        if not accepted:
            self._drop(lease)
            self._raise_if_cancelled(epoch)
            logger.warning("%s: %r was no longer trusted once is_valid() returned; trying again", self.name, lease)
            return False
        logger.info("%s holds %s (fence %d)", self.name, lease.resource, lease.fence)
        return True

    def _validate(self) -> tuple[bool, str]:
        self.invalid_reason = ""
        ok = bool(self.is_valid())
        return ok, self.invalid_reason or f"{type(self).__name__}.is_valid() returned False"

    def _drop(self, lease: Lease) -> None:
        with self._state_lock:
            if self._current is lease:
                self._current, self._validated = None, False
        _release_quietly(lease)

    def _reject(self, lease: Lease, reason: str) -> None:
        """Take an invalid resource out of service for ``quarantine_seconds``, reason recorded."""
        self._drop(lease)
        # Released first, on the engine's connection, so the quarantine (an ORM update on
        # the caller's connection) never waits on a row lock of our own making.
        pool.quarantine([lease.resource.pk], reason=reason[:500], seconds=self._quarantine_seconds, using=self._using)
        logger.warning("%s: quarantined %s for %gs: %s", self.name, lease.resource, self._quarantine_seconds, reason)

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


def _sent_time(lease: Lease, ttl: float) -> float:
    """The monotonic time the lease's grant (or last renewal) was sent, from its deadline."""
    return time.monotonic() + lease.remaining() - ttl + safety_margin(ttl)


def _trusted(lease: Lease) -> bool:
    return not lease.released and not lease.lost and lease.remaining() > 0


def _release_quietly(lease: Lease) -> None:
    try:
        lease.release()
    except LeaseError as exc:  # the lease expires by itself
        logger.warning("releasing %r failed: %s", lease, exc)


def _first(found: Iterable[Resource], limit: int) -> Iterator[Resource]:
    if isinstance(found, QuerySet) and not found.query.is_sliced:
        found = found[:limit]
    return itertools.islice(iter(found), limit)


# -- process-wide -----------------------------------------------------------------------


def live_holders() -> list[ResourceHolder]:
    """The holders of this process that acquired or started and were not terminated."""
    with _live_lock:
        return list(_live)


def terminate_all(timeout: float | None = 10.0) -> int:
    """Terminate every live holder of this process (releasing its lease). Returns how many."""
    holders = live_holders()
    for holder in holders:
        holder.terminate(timeout)
    return len(holders)


def install_sigterm_handler(timeout: float = 15.0) -> None:
    """On SIGTERM, terminate every live holder (releasing its lease), then exit.

    A handler installed before is called afterwards instead of exiting (it decides); else
    the process exits with ``SystemExit(128 + SIGTERM)``, so ``finally`` blocks run.
    Call it from the main thread.
    """
    wait = check_seconds(timeout, "timeout")
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        # The releases run on a thread of their own: the handler interrupts the main thread
        # anywhere, possibly inside a lock a release needs. Not a daemon, so if it has to wait
        # for the main thread to unwind, the interpreter still lets it finish before exiting.
        worker = threading.Thread(target=terminate_all, name="resource-lease-sigterm")
        worker.start()
        worker.join(wait)
        logger.info("SIGTERM: terminated this process's resource holders")
        if callable(previous):
            previous(signum, frame)
            return
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)


def _after_fork_in_child() -> None:
    # The parent's holders (and their leases) are not the child's to terminate.
    global _live, _live_lock
    _live = weakref.WeakSet()
    _live_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = [
    "SEARCH_LIMIT",
    "ResourceHolder",
    "install_sigterm_handler",
    "live_holders",
    "terminate_all",
]
