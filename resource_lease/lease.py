"""Lease one resource of a kind: ``acquire()`` and the ``Lease`` it returns."""

from __future__ import annotations

import datetime as dt
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from django.db import transaction

from resource_lease import renewal, signals
from resource_lease.conf import lease_settings
from resource_lease.db.base import Row
from resource_lease.db.connections import Disconnected, LockWaitTimeout, lease_connection, run, run_repeatable
from resource_lease.exceptions import LeaseDatabaseError, LeaseError, LeaseLost, NoResourceAvailable
from resource_lease.models import Resource
from resource_lease.validation import (
    check_alias,
    check_bool,
    check_callable,
    check_holder,
    check_kind,
    check_seconds,
    check_timeout,
)
from resource_lease.waiting import wait_for

logger = logging.getLogger("resource_lease")

OnLost = Callable[["Lease"], Any]


_HOSTNAME = socket.gethostname()


def process_identity() -> str:
    """``"<hostname>:<pid>"``: this process, as recorded on the rows it holds."""
    return f"{_HOSTNAME}:{os.getpid()}"


def default_holder(thread_name: str | None = None) -> str:
    """``"<hostname>:<pid>:<thread name>"`` (the current thread's name unless one is given),
    the identity recorded on a leased row."""
    name = threading.current_thread().name if thread_name is None else thread_name
    return f"{process_identity()}:{name}"[:255]


def require_kind(alias: str, kind: str) -> None:
    """Raise ``NoResourceAvailable`` (``exists=False``) if ``kind`` has no resources at all,
    so that a caller says so at once instead of waiting out its timeout."""
    if run_repeatable(alias, lambda d, c: d.kind_exists(c, kind), what=f"looking up kind {kind!r}"):
        return
    hint = ""
    if transaction.get_connection(alias).in_atomic_block:
        hint = (
            " (leases are taken on their own connection, which cannot see rows your open transaction has not committed)"
        )
    raise NoResourceAvailable(f"there are no resources of kind {kind!r}{hint}", kind=kind, exists=False)


def safety_margin(ttl: float) -> float:
    return min(ttl * float(lease_settings.SAFETY_MARGIN), float(lease_settings.SAFETY_MARGIN_MAX))


class Lease:
    """A grant of one resource, valid until ``expires_at`` by the database's clock.

    ``fence`` is strictly greater than every fence granted before for the resource: pass it
    along with writes so a holder that was paused past its lease can be refused (see
    ``fenced()``). Only the process (and object) that acquired a lease can renew or release it.
    """

    def __init__(
        self,
        resource: Resource,
        *,
        holder: str,
        ttl: float,
        using: str,
        sent_at: float,
        on_lost: OnLost | None = None,
    ) -> None:
        self.resource = resource
        self.kind: str = resource.kind
        self.fence: int = resource.fence
        self.expires_at: dt.datetime = resource.busy_before
        self.holder = holder
        self.ttl = ttl
        self.using = using
        self.on_lost = on_lost
        #: Set when this process learns the lease is gone (renewal refused, deadline passed);
        #: ``lost`` is the same as a bool. Wait on it: ``lease.lost_event.wait(timeout)``.
        self.lost_event = threading.Event()
        self.lost_reason = ""
        self._pid = os.getpid()
        self._released = False
        self._lock = threading.Lock()
        self._fenced = 0  # open fenced() blocks, which hold the resource's row lock
        self._deadline = sent_at + ttl - safety_margin(ttl)

    def __repr__(self) -> str:
        state = "released" if self._released else "lost" if self.lost_event.is_set() else "held"
        return f"<Lease {self.resource} fence={self.fence} holder={self.holder!r} {state}>"

    # -- local view ------------------------------------------------------------------

    @property
    def released(self) -> bool:
        return self._released

    @property
    def lost(self) -> bool:
        """True once this process has learned the lease is gone (a renewal refused, the local
        deadline passed, a fenced write refused); ``lost_reason`` says why. A plain bool, so
        ``if lease.lost:`` reads as it should; ``lost_event`` is the Event to wait on."""
        return self.lost_event.is_set()

    def remaining(self) -> float:
        """Seconds this process may still trust the lease (local deadline, taken before sending)."""
        return max(0.0, self._deadline - time.monotonic())

    def check(self) -> None:
        """Raise ``LeaseLost`` unless the lease may still be trusted here and now.

        Trust ends at a local deadline counted from when the acquire or last renewal was
        sent, less a safety margin, even if the database cannot be asked.
        """
        if self._released:
            raise LeaseLost(f"{self!r} was released")
        if os.getpid() != self._pid:
            raise LeaseLost(f"{self!r} belongs to process {self._pid}, not to this forked child")
        if not self.lost_event.is_set() and time.monotonic() >= self._deadline:
            self._mark_lost("the local deadline passed without a successful renewal")
        if self.lost_event.is_set():
            raise LeaseLost(f"{self!r}: {self.lost_reason}")

    # -- asked of the database -------------------------------------------------------

    def _key(self) -> dict[str, Any]:
        return {"pk": self.resource.pk, "holder": self.holder, "fence": self.fence}

    def renew(self, ttl: float | None = None) -> dt.datetime:
        """Extend the lease by ``ttl`` (default: its own) from now, by the database's clock.

        Returns the new expiry; raises ``LeaseLost`` if the lease is no longer ours.
        """
        ttl = self.ttl if ttl is None else check_seconds(ttl, "ttl")
        self.check()
        sent_at = time.monotonic()
        key = self._key()
        expiry = run_repeatable(self.using, lambda d, c: d.renew(c, ttl=ttl, **key), what=f"renewing {self.resource}")
        if expiry is None:
            self._mark_lost("the database refused the renewal: the lease expired or another holder took it")
            raise LeaseLost(f"{self!r}: {self.lost_reason}")
        with self._lock:
            self.expires_at = expiry
            self.ttl = ttl
            self._deadline = sent_at + ttl - safety_margin(ttl)
        return expiry

    def is_held(self) -> bool:
        """Whether the database still has this lease as ours and unexpired."""
        if self._released or os.getpid() != self._pid:
            return False
        key = self._key()
        return run_repeatable(self.using, lambda d, c: d.is_held(c, **key), what=f"checking {self.resource}")

    def release(self) -> bool:
        """Give the resource back. True if it was ours and is free now; False if it had
        expired or been taken (another holder's lease is never touched)."""
        if os.getpid() != self._pid:
            return False  # a forked child never releases its parent's lease
        with self._lock:
            if self._released:
                return False
            self._released = True
        renewal.renewer().discard(self)  # no more background renewals
        key = self._key()
        what = f"releasing {self.resource}"
        try:
            released = run(self.using, lambda d, c: d.release(c, **key), what=what)
        except Disconnected:
            # The answer was lost, the release may have committed (a connection lost during
            # COMMIT leaves the outcome unknown): run it again, and if that finds nothing to
            # release, read back whether the first one did.
            released = run_repeatable(
                self.using, lambda d, c: d.release(c, **key) or d.was_released(c, **key), what=what
            )
        signals.lease_released.send(sender=Resource, lease=self, released=released)
        return released

    @contextmanager
    def fenced(self, using: str | None = None) -> Iterator[None]:
        """A transaction whose writes commit only if this lease is still ours.

        Locks the resource row and checks holder, fence and expiry by the database's clock
        inside the caller's transaction on ``using`` (default: the lease's database); a
        holder that was paused past its lease gets ``LeaseLost`` and nothing is written.
        A new grant cannot take the row until the transaction ends.
        """
        alias = self.using if using is None else check_alias(using)
        self.check()
        with self._lock:
            self._fenced += 1
        try:
            with self._fenced_transaction(alias):
                yield
        finally:
            with self._lock:
                self._fenced -= 1

    @contextmanager
    def _fenced_transaction(self, alias: str) -> Iterator[None]:
        with transaction.atomic(using=alias):
            current = (
                Resource.objects.using(alias)
                .select_for_update()
                .live()  # not given back nor expired (see Dialect.ours)
                .filter(pk=self.resource.pk, holder=self.holder, fence=self.fence)
                .exists()
            )
            if not current:
                self._mark_lost("a fenced write found the lease expired or taken")
                raise LeaseLost(f"{self!r}: {self.lost_reason}")
            yield

    # -- loss and renewal ------------------------------------------------------------

    def mark_lost(self, reason: str) -> None:
        """Record that the lease is gone, once: ``lost`` turns True with ``lost_reason``, its
        background renewal stops, ``lease_lost`` is sent and ``on_lost`` called. For what
        learns of the loss outside the lease (the renewal policy, a recipe's fenced write)."""
        with self._lock:
            if self.lost_event.is_set() or self._released:
                return
            self.lost_reason = reason
            self.lost_event.set()
        renewal.renewer().discard(self)
        logger.warning("lease lost: %r: %s", self, reason)
        signals.lease_lost.send(sender=Resource, lease=self, reason=reason)
        if self.on_lost is not None:
            try:
                self.on_lost(self)
            except Exception:
                logger.exception("on_lost callback of %r raised", self)

    _mark_lost = mark_lost  # the name this module's own callers use

    def renew_in_background(self) -> float | None:
        """One renewal by the renewal thread (``renewal.Renewer``), under the one failure
        policy (``renewal.renew_once``); seconds until the next, or None to stop."""
        interval = self.ttl * float(lease_settings.RENEW_FRACTION)
        if self._fenced and time.monotonic() < self._deadline:
            # A fenced() block of this process holds the row lock: the renewal would wait
            # for it, stalling the one renewal thread and every other lease of the process
            # with it. Ask again shortly; the block's end lets the renewal through (past
            # the local deadline, renew() below reports the loss without asking).
            return min(interval, 0.05)
        step = renewal.renew_once(self, interval=interval)
        return interval if step.renewed else step.retry_in

    # -- context manager -------------------------------------------------------------

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.release()
        except LeaseDatabaseError:
            if exc is None:
                raise
            # Do not hide the body's own error; the lease expires by itself.
            logger.exception("releasing %r after an error failed", self)


def acquire(
    kind: str,
    *,
    ttl: float | None = None,
    timeout: float | None = 0,
    holder: str | None = None,
    using: str | None = None,
    auto_renew: bool = False,
    on_lost: OnLost | None = None,
) -> Lease:
    """Lease any free, healthy resource of ``kind`` for ``ttl`` seconds.

    ``timeout``: 0 makes one attempt, > 0 keeps trying (backoff with jitter) up to that many
    seconds, None waits until one is free. Raises ``NoResourceAvailable`` when none could be
    had (at once if the kind has no resources at all) and ``ValueError`` for bad arguments.
    The grant is committed on the engine's own connection, so it is independent of any
    transaction the caller has open.
    """
    kind = check_kind(kind)
    ttl = check_seconds(lease_settings.TTL if ttl is None else ttl, "ttl")
    wait = check_timeout(timeout)
    holder = check_holder(holder) or default_holder()
    alias = check_alias(lease_settings.DATABASE if using is None else using)
    check_bool(auto_renew, "auto_renew")
    check_callable(on_lost, "on_lost")
    refuse_inside_single_writer_transaction(alias, "acquire()")

    exists_checked = False

    def attempt() -> Lease | None:
        nonlocal exists_checked
        lease = attempt_grant(kind, ttl=ttl, holder=holder, alias=alias, on_lost=on_lost)
        if lease is None and not exists_checked:
            require_kind(alias, kind)
            exists_checked = True
        return lease

    lease = wait_for(attempt, timeout=wait)
    if lease is None:
        raise NoResourceAvailable(f"no resource of kind {kind!r} was free within {wait:g}s", kind=kind, exists=True)

    return granted(lease, auto_renew=auto_renew)


def granted(lease: Lease, *, auto_renew: bool) -> Lease:
    """Announce a new grant (``lease_granted``) and start its background renewal if asked."""
    signals.lease_granted.send(sender=Resource, lease=lease)
    if auto_renew:
        renewal.renewer().add(lease)
    return lease


def refuse_inside_single_writer_transaction(alias: str, what: str) -> None:
    """On a single-writer database (SQLite), a grant from inside the caller's open write
    transaction would wait for that transaction's own lock: refuse it clearly instead."""
    if lease_connection(alias).dialect.single_writer and transaction.get_connection(alias).in_atomic_block:
        raise LeaseError(
            f"{what} inside an open transaction on {alias!r}: this database has a single writer, so the "
            "grant would wait for your own transaction's lock. Call it before entering atomic()."
        )


GrantStatement = Callable[[Any, Any, str], "Row | None"]


def attempt_grant(
    kind: str,
    *,
    ttl: float,
    holder: str,
    alias: str,
    on_lost: OnLost | None = None,
    statement: GrantStatement | None = None,
) -> Lease | None:
    """One attempt at a grant; the Lease, or None if nothing could be granted this time.

    ``statement(dialect, cursor, token)`` runs the granting statement (default: the engine's
    acquire of any free resource of ``kind``; the holder's lock step passes its own).
    Package-internal: use ``acquire()``.
    """
    if statement is None:
        statement = _acquire_any(alias, kind, holder, ttl)
    for tries_left in (1, 0):
        sent_at = time.monotonic()
        row, settled = _grant(alias, kind=kind, statement=statement)
        if row is None and settled and tries_left:
            # Settled: nothing was granted. Most often the statement never reached the server
            # (a session it had dropped: idle timeout, restart); run it once more on the new
            # connection, or a single attempt would report free resources as none.
            continue
        break
    if row is None:
        return None
    resource = lease_connection(alias).dialect.to_resource(row)
    return Lease(resource, holder=holder, ttl=ttl, using=alias, sent_at=sent_at, on_lost=on_lost)


def _acquire_any(alias: str, kind: str, holder: str, ttl: float) -> GrantStatement:
    picker = lease_connection(alias).picker
    return lambda d, c, token: picker.grant_any(d, c, kind=kind, holder=holder, token=token, ttl=ttl)


def _grant(alias: str, *, kind: str, statement: GrantStatement) -> tuple[Row | None, bool]:
    """Run a granting statement once under a fresh token: (the granted row or None, whether
    its outcome was unknown and had to be settled by reading back)."""
    token = secrets.token_hex(16)
    try:
        row = run(alias, lambda d, c: statement(d, c, token), what=f"granting a resource of kind {kind!r}")
    except LockWaitTimeout as exc:
        # Rolled back after the bounded lock wait: nothing granted this attempt, and the
        # caller's own timeout (not the engine's retries) decides whether to try again.
        logger.info("acquire of %r waited out the lock wait timeout: %s", kind, exc)
        return None, False
    except Disconnected as exc:
        # The connection died with the outcome unknown (it may have died during COMMIT):
        # settle it by reading back the grant by its token, never by blindly running the
        # statement again.
        logger.warning("connection lost while granting %r; settling by reading back: %s", kind, exc)
        row = run_repeatable(alias, lambda d, c: d.find_grant(c, kind=kind, token=token), what="settling a grant")
        return row, True
    return row, False
