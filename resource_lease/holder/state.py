"""The state machine of a ``ResourceHolder``: which lease it holds, whether that lease is
validated and trusted, and the loop that acquires a candidate, checks it with
``is_valid()`` and quarantines it when it is invalid.

``resource_lease.holder.thread.ResourceHolder`` builds on it (configuration, the public acquire,
fix and close, the renewal thread); users subclass that, never this.
"""

from __future__ import annotations

import abc
import logging
import threading
import time

from resource_lease import metrics, pool
from resource_lease.exceptions import LeaseError, LeaseLost, NoResourceAvailable
from resource_lease.holder.config import HolderConfig
from resource_lease.holder.steps import HolderSteps
from resource_lease.lease import Lease, default_holder, making, safety_margin
from resource_lease.line import Line, Wait, wait_in_line
from resource_lease.line.granting import Grantor
from resource_lease.line.wakeups import Waker
from resource_lease.models import Resource
from resource_lease.validation import check_holder

logger = logging.getLogger("resource_lease")


class AcquireCancelled(LeaseError):
    """An acquire stopped waiting because the holder was closed or terminated."""


class HolderStateMachine(HolderSteps, threading.Thread, metaclass=abc.ABCMeta):
    """The current lease and its state (candidate, validated, lost), and the acquire loop.

    Every field below ``_state_lock`` is read and written under it; one acquire runs at a
    time (``_acquire_mutex``); ``close()`` bumps ``_epoch`` so that an acquire started
    before it gives up.
    """

    # Set by ResourceHolder as class attributes, and here to their resolved values.
    kind: str
    ttl: float | None
    renew_interval: float | None
    quarantine_seconds: float | None

    def __init__(self, config: HolderConfig, *, holder: str | None, name: str) -> None:
        self._kind = config.kind
        self._ttl = config.ttl
        self._renew_interval = config.renew_interval
        self._quarantine_seconds = config.quarantine_seconds
        self._using = config.using
        self._where = config.where
        self._priority = config.priority
        # The wait's grantor while an acquire's attempt runs in line (lock() grants with it).
        self._grant: Grantor[Lease] | None = None
        # Wakes an acquire waiting in line, so close() and terminate() end it at once.
        self._waker = Waker()
        super().__init__(name=name, daemon=True)
        identity = check_holder(holder)
        #: Identity recorded on leased rows: ``"<hostname>:<pid>:<thread name>"`` by default,
        #: fixed for the holder's life whichever thread acquires.
        self.holder: str = identity or default_holder(self.name)
        # The resolved configuration, readable under the familiar names.
        self.kind = self._kind
        self.ttl = self._ttl
        self.renew_interval = self._renew_interval
        self.quarantine_seconds = self._quarantine_seconds
        self.using = self._using
        self.where = self._where
        self.priority = self._priority

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
        return validated and lease is not None and is_trusted(lease)

    @property
    def lost(self) -> bool:
        """True from the moment the lease can no longer be trusted (renewal refused, local
        deadline passed) until a fresh one is held; for a work loop to poll. A bool, like
        ``Lease.lost``; ``lost_event`` is the Event to wait on."""
        with self._state_lock:
            lease, validated, pending = self._current, self._validated, self._lost_pending
        return pending or (validated and lease is not None and not is_trusted(lease))

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

    # -- the acquire loop ---------------------------------------------------------------

    def _register(self) -> None:
        """Count this holder among the process's live holders (``holder.registry``)."""
        raise NotImplementedError

    def _acquire(self, wait: float | None, *, in_thread: bool, epoch: int | None = None) -> Lease:
        """The acquire loop; the caller holds ``_acquire_mutex``. ``epoch``: give up if
        ``close()`` has been called since then (default: since now)."""
        with self._state_lock:
            current, validated = self._current, self._validated
            if epoch is None:
                epoch = self._epoch
        self._raise_if_cancelled(epoch)
        if current is not None:
            if validated and is_trusted(current):
                return current
            with self._state_lock:
                if self._current is current:
                    self._current, self._validated = None, False
            release_quietly(current)
        self._register()

        def attempt(grant: Grantor[Lease]) -> Lease | None:
            while True:
                self._raise_if_cancelled(epoch)
                try:
                    lease = self._grab(grant, give_up_if_empty=not in_thread)
                    if lease is None or self._accept(lease, epoch):
                        return lease
                except (AcquireCancelled, NoResourceAvailable):
                    raise
                except Exception as exc:
                    if not in_thread:
                        raise
                    # The thread has nobody to raise to: say it, wait, try again.
                    logger.warning("%s: acquiring a fresh %r resource failed, retrying: %r", self.name, self._kind, exc)
                    return None
                # It was invalid (quarantined) or lost while checked: the next one now.

        with metrics.waiting(self._kind, using=self._using, holder=self.holder) as wait_metric:
            try:
                # Waits in the kind's line; close() and terminate() wake it (the next attempt raises).
                request: Wait[Lease] = Wait(
                    Line(self._using, self._kind),
                    attempt,
                    _as_is,  # wait_in_line never concludes: the holder does, below
                    timeout=wait,
                    holder=self.holder,
                    ttl=self._ttl,
                    make=making(alias=self._using),
                    priority=self._priority,
                    where=self._where_sql(),
                )
                lease = wait_in_line(request, self._waker, queued=wait_metric.queued)
            except AcquireCancelled:
                wait_metric.outcome = "timeout"  # given up (closed, terminated), not an error
                raise
            if lease is None:
                with self._state_lock:
                    if self._current is not None and self._current.released:
                        # installed by an attempt, then given back as reaching us too late
                        # (``line.in_time``): not ours to keep
                        self._current, self._validated = None, False
                raise NoResourceAvailable(
                    f"no valid resource of kind {self._kind!r} could be held within {wait:g}s", kind=self._kind
                )
            return wait_metric.granted(lease)

    def _raise_if_cancelled(self, epoch: int) -> None:
        if self._stopping.is_set():
            raise AcquireCancelled(f"{self.name} was terminated while acquiring")
        if self._epoch != epoch:
            raise AcquireCancelled(f"{self.name} was closed while acquiring")

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
            release_quietly(lease)
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
            if self._current is lease and self._epoch == epoch and not self._stopping.is_set() and is_trusted(lease):
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
        release_quietly(lease)

    def _reject(self, lease: Lease, reason: str) -> None:
        """Take an invalid resource out of service for ``quarantine_seconds``, reason recorded."""
        self._drop(lease)
        # Released first, on the engine's connection, so the quarantine (an ORM update on
        # the caller's connection) never waits on a row lock of our own making.
        pool.quarantine([lease.resource.pk], reason=reason[:500], seconds=self._quarantine_seconds, using=self._using)
        logger.warning("%s: quarantined %s for %gs: %s", self.name, lease.resource, self._quarantine_seconds, reason)


def _sent_time(lease: Lease, ttl: float) -> float:
    """The monotonic time the lease's grant (or last renewal) was sent, from its deadline."""
    return time.monotonic() + lease.remaining() - ttl + safety_margin(ttl)


def is_trusted(lease: Lease) -> bool:
    return not lease.released and not lease.lost and lease.remaining() > 0


def release_quietly(lease: Lease) -> None:
    try:
        lease.release()
    except LeaseError as exc:  # the lease expires by itself
        logger.warning("releasing %r failed: %s", lease, exc)


def _as_is(lease: Lease | None) -> Lease:
    """A Wait's ``conclude`` for the holder's wait, which it concludes itself: never called
    (``wait_in_line`` answers the line's grant or None)."""
    raise AssertionError(f"the holder concludes its own wait ({lease!r})")
