"""Lease one resource of a kind: ``acquire()`` and the ``Lease`` it returns."""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import TracebackType
from typing import Any

from django.db import transaction

from resource_lease import health, line, pool, renewal, sessions, signals, targets
from resource_lease.audit import acting_as
from resource_lease.conf import lease_settings
from resource_lease.db.connections import refuse_on_event_loop
from resource_lease.db.line import BY_ID, Ask
from resource_lease.db.operations import Operations, ops
from resource_lease.exceptions import LeaseDatabaseError, LeaseError, LeaseLost, NoResourceAvailable
from resource_lease.forking import at_fork
from resource_lease.keeper import dispatch, keeper
from resource_lease.line.aio import awaits
from resource_lease.line.granting import Grantor, Make
from resource_lease.line.threads import runs
from resource_lease.line.wakeups import release as release_row
from resource_lease.models import Resource
from resource_lease.offload import in_thread
from resource_lease.validation import (
    Options,
    check_alias,
    check_bool,
    check_callable,
    check_kind,
    check_priority,
    check_seconds,
    check_target,
    check_timeout,
    check_where,
)

logger = logging.getLogger("resource_lease")

OnLost = Callable[["Lease"], Any]


_HOSTNAME = socket.gethostname()


class _Grant:
    """A grant this process must give back if it exits holding it: its lease, weakly, and
    enough to release the row once the lease object is gone (a program that dropped a lease
    without releasing it still holds the row until its ttl)."""

    def __init__(self, lease: Lease) -> None:
        self.ref = weakref.ref(lease, self._dropped)
        self.using, self.kind, self.name = lease.using, lease.kind, lease.resource.name
        self.key = lease._key()
        self.ttl = lease.ttl
        self.until: float | None = None  # once dropped: when the row has expired anyway

    def _dropped(self, _ref: object) -> None:
        # Run by the garbage collector, anywhere: set one attribute, nothing else. Unrenewed
        # from now on, the row expires within its ttl.
        self.until = time.monotonic() + self.ttl

    def give_back(self) -> bool:
        lease = self.ref()
        if lease is not None:
            return lease.release()
        if self.until is not None and self.until <= time.monotonic():
            return False  # expired by itself meanwhile
        return release_row(ops(self.using), self.using, self.kind, self.name, **self.key)


# The grants this process may still hold, by (alias, row, fence) (``give_back_granted``:
# what ``shutdown.give_back_all`` releases on SIGTERM and at exit); a forked child starts empty.
_granted: dict[tuple[str, int, int], _Grant] = {}
_granted_lock = threading.Lock()
#: The size of ``_granted`` at which ``_track`` next sweeps out grants dropped unreleased and
#: expired by now: twice what the last sweep left (at least ``SWEEP_FROM``), so a process
#: holding many leases pays O(1) per grant, not a walk of them all.
SWEEP_FROM = 64
_sweep_at = SWEEP_FROM


def _track(lease: Lease) -> None:
    global _sweep_at
    with _granted_lock:
        if len(_granted) >= _sweep_at:
            now = time.monotonic()
            for key, grant in list(_granted.items()):
                if grant.until is not None and grant.until <= now:
                    del _granted[key]  # dropped unreleased, and expired by now
            _sweep_at = max(SWEEP_FROM, 2 * len(_granted))
        _granted[(lease.using, lease.resource.pk, lease.fence)] = _Grant(lease)


def _untrack(lease: Lease) -> None:
    with _granted_lock:
        _granted.pop((lease.using, lease.resource.pk, lease.fence), None)


def hand_over(lease: Lease) -> None:
    """The lease now belongs to a holder outside this process (an HTTP client, which renews
    and releases it through any server process): this process no longer gives it back on
    SIGTERM nor at exit, and never renews it (docs/http.md)."""
    renewal.renewer().discard(lease)
    _untrack(lease)


def keep_until_expiry(lease: Lease) -> None:
    """Never give ``lease`` back: its row stays busy until the grant's own expiry by the
    database's clock (a rate limit's slot, ``recipes.ratelimit``). ``release()`` is then a
    no-op, and neither SIGTERM nor the exit gives it back (``give_back_granted``)."""
    with lease._lock:
        lease._released = True
    _untrack(lease)


def give_back_granted() -> int:
    """Release every grant this process may still hold (``Lease.release``, or the row itself
    for a lease the program dropped unreleased); how many were still held. A failure is
    logged, never raised: that grant expires by itself at its ttl."""
    with _granted_lock:
        grants = list(_granted.values())
        _granted.clear()
    released = 0
    for grant in grants:
        try:
            released += bool(grant.give_back())
        except LeaseDatabaseError as exc:
            logger.warning(
                "giving back row %s of kind %r failed (it expires by itself): %s", grant.key["pk"], grant.kind, exc
            )
    return released


def _after_fork_in_child() -> None:
    """The parent's grants are not the child's to give back (``give_back_granted``)."""
    global _granted, _granted_lock
    _granted = {}
    _granted_lock = threading.Lock()


at_fork(after_in_child=_after_fork_in_child)


def process_identity() -> str:
    """``"<hostname>:<pid>"``: this process, as recorded on the rows it holds."""
    return f"{_HOSTNAME}:{os.getpid()}"


def default_holder(thread_name: str | None = None) -> str:
    """``"<hostname>:<pid>:<thread name>"`` (the current thread's name unless one is given),
    the identity recorded on a leased row."""
    name = threading.current_thread().name if thread_name is None else thread_name
    return f"{process_identity()}:{name}"[:255]


#: How many of the existing kinds the error of a kind without resources names.
KINDS_SHOWN = 5


def require_kind(alias: str, kind: str) -> None:
    """Raise ``NoResourceAvailable`` (``exists=False``) if ``kind`` has no resources at all,
    so that a caller says so at once instead of waiting out its timeout."""
    engine = ops(alias)
    if engine.kind_exists(kind):
        return
    known = engine.some_kinds(KINDS_SHOWN + 1)
    listed = ", ".join(known[:KINDS_SHOWN]) + (", ..." if len(known) > KINDS_SHOWN else "") if known else "none"
    hint = ""
    if transaction.get_connection(alias).in_atomic_block:
        hint = (
            " (leases are taken on their own connection, which cannot see rows your open transaction has not committed)"
        )
    raise NoResourceAvailable(
        f"there are no resources of kind {kind!r} (kinds: {listed}){hint}", kind=kind, exists=False
    )


def safety_margin(ttl: float) -> float:
    return min(ttl * float(lease_settings.SAFETY_MARGIN), float(lease_settings.SAFETY_MARGIN_MAX))


#: Makes a lease's ``lost_event`` on first use (once, whichever thread asks first).
_lost_events_lock = threading.Lock()


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
        #: Whose callbacks ``on_lost`` is ordered with (a recipe's: its election, its group).
        self.callback_owner: object | None = None
        #: ``lost_event``, made on first use (most leases are released before anyone waits
        #: on it: an Event costs every grant a Condition and two locks).
        self._lost_event: threading.Event | None = None
        self.lost_reason = ""
        self._pid = os.getpid()
        self._released = False
        self._lock = threading.Lock()
        self._fenced = 0  # open fenced() blocks, which hold the resource's row lock
        self._deadline = sent_at + ttl - safety_margin(ttl)
        #: Seconds the caller waited for this grant (set by the entry point that waited).
        self.waited: float | None = None
        #: The resource's backoff level as granted, and whether a report of this grant has
        #: quarantined it (``health``; None: not carried by the grant, read on first use).
        self.granted_level, self.tripped = health.level_as_granted(resource), False
        #: What the grant is for (``acquire(target=...)``; None: nothing named), and the
        #: cooldown its release sets for it unless told otherwise (``targets``).
        self.target: str | None = None
        self.default_cooldown = 0.0
        #: When its grant was sent (this machine's monotonic clock), and what counting the grant
        #: for the policy's ``target_rate`` stored (grant times, n, per; None: not counted).
        self.sent_at = sent_at
        self.counted: tuple[list[float], int, float] | None = None
        #: The sticky session the grant is for (``acquire(session=...)``), and whether its
        #: binding moved to this resource (``sessions``).
        self.session: str | None = None
        self.rebound = False

    def __repr__(self) -> str:
        state = "released" if self._released else "lost" if self.lost else "held"
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
        event = self._lost_event
        return event is not None and event.is_set()

    @property
    def lost_event(self) -> threading.Event:
        """Set when this process learns the lease is gone (renewal refused, deadline passed);
        ``lost`` is the same as a bool. Wait on it: ``lease.lost_event.wait(timeout)``."""
        event = self._lost_event
        if event is None:
            with _lost_events_lock:
                if self._lost_event is None:
                    self._lost_event = threading.Event()
                event = self._lost_event
        return event

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
        if not self.lost and time.monotonic() >= self._deadline:
            self.mark_lost("the local deadline passed without a successful renewal")
        if self.lost:
            raise LeaseLost(f"{self!r}: {self.lost_reason}")

    @property
    def probation(self) -> bool:
        """True for a probation grant: the first after an automatic quarantine ended
        (docs/learning.md#health); its ``report`` decides."""
        return health.level_of(self) > 0

    # -- asked of the database -------------------------------------------------------

    def _key(self) -> dict[str, Any]:
        return {"pk": self.resource.pk, "holder": self.holder, "fence": self.fence}

    def _ops(self) -> Operations:
        return ops(self.using)

    def report(self, outcome: str, retry_after: float | None = None) -> None:
        """How the resource did: ``"ok"``, ``"error"`` or ``"blocked"`` (``retry_after``
        seconds): its shared error score, automatic quarantine with backoff
        (docs/learning.md#health). ``LeaseLost`` if no longer held: nothing changed."""
        health.report(self, outcome, retry_after)

    def renew(self, ttl: float | None = None) -> dt.datetime:
        """Extend the lease by ``ttl`` (default: its own) from now, by the database's clock.

        Returns the new expiry; raises ``LeaseLost`` if the lease is no longer ours.
        """
        ttl = self.ttl if ttl is None else check_seconds(ttl, "ttl")
        self.check()
        sent_at = time.monotonic()
        expiry = self._ops().renew(ttl=ttl, **self._key())
        if expiry is None:
            self.mark_lost("the database refused the renewal: the lease expired or another holder took it")
            raise LeaseLost(f"{self!r}: {self.lost_reason}")
        with self._lock:
            self.expires_at = expiry
            self.ttl = ttl
            self._deadline = sent_at + ttl - safety_margin(ttl)
        if arrived_dead(self):
            # The answer came back after the very deadline it set: by the database's clock the
            # lease may have expired in between and the resource been granted again
            # (docs/pitfalls.md#late-answers).
            self.mark_lost("the renewal's answer came back after the lease's local deadline")
            raise LeaseLost(f"{self!r}: {self.lost_reason}")
        return expiry

    def given_back_late(self, *, after: str) -> bool:
        """Whether the lease, granted in time, reached its caller too late: past its local
        deadline by the time the wait that granted it ended (``after`` says what held it up:
        leaving the line is a statement too, on a node that may hang). Such a lease is given
        back and never handed out, as a late answer is (docs/pitfalls.md#late-answers)."""
        if not arrived_dead(self):
            return False
        took = time.monotonic() - self._deadline + self.ttl - safety_margin(self.ttl)  # since it was sent
        give_back_dead(self, took=took, after=after)
        return True

    def is_held(self) -> bool:
        """Whether the database still has this lease as ours and unexpired."""
        if self._released or os.getpid() != self._pid:
            return False
        return self._ops().is_held(**self._key())

    def release(self, cooldown: float | None = None) -> bool:
        """Give the resource back. True if it was ours and is free now; False if it had
        expired or been taken (another holder's lease is never touched). ``cooldown``: seconds
        before the resource may be granted again for this lease's target (default: the
        policy's ``cooldown``; docs/learning.md#targets); other targets are unaffected."""
        if os.getpid() != self._pid:
            return False  # a forked child never releases its parent's lease
        refuse_on_event_loop("release")  # before anything changes here
        seconds = targets.release_cooldown(self, cooldown)
        if (seconds > 0 or self.counted is not None) and not self._released:
            # Before the release (a grant for the target right after it must see it), and
            # before anything changes here: a database error leaves the lease as it was.
            try:
                targets.used(self, seconds)
            except LeaseLost:
                pass  # no longer ours: nothing to cool down, and the release below finds it so
        with self._lock:
            if self._released:
                return False
            self._released = True
        renewal.renewer().discard(self)  # no more background renewals
        _untrack(self)
        # An answer lost with the connection is settled by the operation (run again, else
        # read back whether the first one released it: docs/pitfalls.md#unknown-outcome).
        released = release_row(self._ops(), self.using, self.kind, self.resource.name, **self._key())
        signals.lease_released.send(sender=Resource, lease=self, released=released)
        return released

    def quarantine(self, reason: str, seconds: float | None = None) -> bool:
        """Take the leased resource out of service for ``seconds`` (default:
        ``QUARANTINE_SECONDS``) with a ``reason``, and give it back: the holder found it
        broken (a proxy answering 403s). Nobody is granted it until the quarantine ends; the
        audit trail records this holder as who did it. True if the resource was quarantined.

        Refused inside an open transaction on the lease's database: the quarantine must not
        wait for (nor be undone with) the caller's transaction.
        """
        seconds = check_seconds(float(lease_settings.QUARANTINE_SECONDS) if seconds is None else seconds, "seconds")
        if transaction.get_connection(self.using).in_atomic_block:
            raise LeaseError(
                f"lease.quarantine() inside an open transaction on {self.using!r}: call it after the transaction"
            )
        # Quarantined first, while still ours: released first, another worker could be
        # granted it in between (the quarantine would then wait for that holder's release).
        with acting_as(self.holder):
            count = pool.quarantine([self.resource.pk], reason=reason, seconds=seconds, using=self.using)
        self.release()
        logger.warning("%r quarantined for %gs by its holder: %s", self, seconds, reason)
        return count == 1

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
                self.mark_lost("a fenced write found the lease expired or taken")
                raise LeaseLost(f"{self!r}: {self.lost_reason}")
            yield

    # -- loss and renewal ------------------------------------------------------------

    def mark_lost(self, reason: str) -> None:
        """Record that the lease is gone, once: ``lost`` turns True with ``lost_reason``, its
        background renewal stops, ``lease_lost`` is sent and ``on_lost`` called. For what
        learns of the loss outside the lease (the renewal policy, a recipe's fenced write)."""
        # From the event on, an exiting process waits for the on_lost below (keeper.EXIT_DRAIN).
        with keeper().callbacks.expecting():
            with self._lock:
                if self.lost or self._released:
                    return
                self.lost_reason = reason
                self.lost_event.set()
            renewal.renewer().discard(self)
            logger.warning("lease lost: %r: %s", self, reason)
            signals.lease_lost.send(sender=Resource, lease=self, reason=reason)
            if self.on_lost is not None:
                # Off the keeper's thread when the keeper noticed (a slow on_lost must not stall
                # every renewal of the process); at once in a thread of the user's (check()).
                dispatch(self.callback_owner or self, self.on_lost, self)

    def renew_in_background(self) -> float | None:
        """One renewal by the keeper (``renewal.Renewer``), under the one failure
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

    # -- from async code ---------------------------------------------------------------
    # Each runs the statement in a worker thread (``offload.in_thread``), never on the event loop.

    async def arenew(self, ttl: float | None = None) -> dt.datetime:
        """``renew()`` for async code."""

        return await in_thread(self.renew, ttl)

    async def arelease(self, cooldown: float | None = None) -> bool:
        """``release()`` for async code."""

        return await in_thread(self.release, cooldown)

    async def ais_held(self) -> bool:
        """``is_held()`` for async code."""

        return await in_thread(self.is_held)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:

        await in_thread(self.__exit__, exc_type, exc, tb)

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


def acquiring(
    kind: str,
    *,
    ttl: float | None = None,
    timeout: float | None = 0,
    holder: str | None = None,
    using: str | None = None,
    auto_renew: bool = False,
    on_lost: OnLost | None = None,
    where: dict[str, Any] | None = None,
    priority: int = 0,
    lock_delay: float = 0.0,
    target: str | None = None,
    session: str | None = None,
) -> line.Wait[Lease]:
    """Lease any free, healthy resource of ``kind`` for ``ttl`` seconds.

    ``timeout``: 0 makes one attempt, > 0 waits in line up to that many seconds, None waits
    until one is free (``resource_lease.line``: first come, first served, higher ``priority``
    first, woken at release). ``where``: keys and values the resource's ``data`` must have
    (``{"region": "eu"}``; compared exactly). ``target``: what the resource is for (a site,
    an API; at most 200 characters): only a resource whose cooldown for it has passed is
    granted (docs/learning.md#targets). ``session``: a sticky session (at most 200
    characters): the resource bound to it is granted while the binding lives, waited for in its
    own line if another holds it; one that can no longer serve the session is replaced by a new
    binding (``lease.rebound``; docs/learning.md#sessions). ``lock_delay``: seconds (default 0) for which
    the resource is granted to nobody if this lease expires without being released (a
    release frees it at once), by the database's clock. Raises ``NoResourceAvailable`` when none could be
    had (at once if the kind has no resources at all) and ``ValueError`` for bad arguments.
    The grant is committed on the engine's own connection, so it is independent of any
    transaction the caller has open.

    ``acquiring`` checks the arguments (``ValueError``, nothing written) and builds the wait
    that ``acquire`` runs in this thread and ``aacquire`` awaits: one signature for the three.
    """
    kind = check_kind(kind)
    options = Options.of(ttl=ttl, using=using, holder=holder, default_holder=default_holder)
    ttl, alias, holder = options.ttl, options.using, options.holder
    wait = check_timeout(timeout)
    check_bool(auto_renew, "auto_renew")
    check_callable(on_lost, "on_lost")
    wanted = check_where(where)
    aim = check_target(target)
    sticky = check_target(session, "session")
    priority = check_priority(priority)
    delay = check_seconds(lock_delay, "lock_delay", allow_zero=True)
    options.refuse_in_transaction("acquire()")
    where_sql = None if wanted is None else ops(alias).dialect.encode_where(wanted)
    # The kind's policy (for retirement), read by the wait's first attempt, before its first
    # grant statement: inside the wait, so a database that is down is the wait's error (its
    # metrics observe it), and never between a grant and its use (cached per process).
    policy = _once(lambda: health.policy_of(alias, kind))
    # A session's binding, read before the wait: a live one to a resource that can serve this
    # call makes the call wait for that resource in its own line (``sessions``).
    binding = (
        sessions.bound(alias, kind, sticky, idle=policy().session_idle, where=wanted, target=aim)
        if sticky is not None
        else sessions.Bound()
    )
    # What is asked, once: any free row of the pool (a session's bound row: by its id, in its own line).
    pool_ask = Ask(kind, holder, ttl, where=wanted, where_sql=where_sql, target=aim or "", lock_delay=delay)
    bound_ask = replace(pool_ask, rows=BY_ID, pk=binding.pk, line=binding.name) if binding.usable else pool_ask
    make = making(alias=alias, on_lost=on_lost)

    exists_checked = False

    def attempt(grant: Grantor[Lease]) -> Lease | None:
        lease = bound_grant(grant) if binding.usable else pool_grant(grant)
        if lease is not None and sticky is not None:
            try:
                sessions.bind(alias, kind, sticky, lease.resource.pk)
            except Exception:
                lease.release()  # unbound: not handed out
                raise
            lease.session = sticky
            lease.rebound = binding.existed and lease.resource.pk != binding.pk
        return lease

    def bound_grant(grant: Grantor[Lease]) -> Lease | None:
        """The session's bound resource, in its own line; if it can no longer serve the
        session (quarantined, disabled, retired, cooling down for the target meanwhile), any
        resource of the pool instead (asked in the pool's line: as a newcomer there), which
        the session is then bound to."""
        lease = grant(bound_ask)
        if lease is not None:
            if health.retire_due(lease, policy()):
                lease.release()  # retired now: replaced below
                lease = None
            elif aim is not None:
                targets.aimed(lease, aim, cooldown=policy().cooldown, target_rate=policy().target_rate)
        if lease is None and not sessions.still_usable(alias, kind, sticky or "", binding.pk, where=wanted, target=aim):
            lease = pool_grant(grant)
        return lease

    def pool_grant(grant: Grantor[Lease]) -> Lease | None:
        nonlocal exists_checked
        current = policy()
        for _ in range(RETIRED_RETRIES):
            lease = grant(pool_ask)
            if lease is None or not health.retire_due(lease, current):
                if lease is not None and aim is not None:
                    targets.aimed(lease, aim, cooldown=current.cooldown, target_rate=current.target_rate)
                break
            lease.release()  # granted past its policy's max_uses / max_age: retired now
            lease = None
        if lease is None and not exists_checked:
            require_kind(alias, kind)
            exists_checked = True
        return lease

    def conclude(lease: Lease | None) -> Lease:
        if lease is None and binding.usable:
            raise NoResourceAvailable(
                f"the resource of kind {kind!r} bound to session {sticky!r} ({binding.name}) was not free within"
                f" {wait:g}s",
                kind=kind,
                exists=True,
            )
        if lease is None:
            matching = "" if wanted is None else f" matching {wanted!r}"
            matching += "" if aim is None else f" (not cooling down for {aim!r})"
            raise NoResourceAvailable(
                f"no resource of kind {kind!r}{matching} was free within {wait:g}s", kind=kind, exists=True
            )
        return granted(lease, auto_renew=auto_renew)

    return line.Wait(
        line.Line(alias, kind, binding.name if binding.usable else ""),
        attempt,
        conclude,
        timeout=wait,
        holder=holder,
        ttl=ttl,
        priority=priority,
        where=where_sql,
        target=aim or "",
        # A session's bound resource that stops serving it (quarantined, disabled) frees up for
        # nobody: the waiter's try, now and then, finds that out and takes another.
        retry_every=SESSION_RETRY if binding.usable else 0.0,
        make=make,
        # A grant with a lock delay (which the hand-off does not write), a target (counted, and
        # its lease told its target, by ``attempt``) or a session (bound by ``attempt``) takes
        # no hand-off.
        handed=None if delay or aim is not None or sticky is not None else retiring(make, policy),
    )


def _once(read: Callable[[], health.Policy]) -> Callable[[], health.Policy]:
    """``read``, called at most once (its answer kept): ``functools.cache`` without the
    wrapper it builds, which an uncontended cycle paid for on every call."""
    kept: list[health.Policy] = []

    def once() -> health.Policy:
        if not kept:
            kept.append(read())
        return kept[0]

    return once


def retiring(make: Make[Lease], policy: Callable[[], health.Policy]) -> Make[Lease]:
    """``handed`` for ``acquire()``: a row handed to the caller's place past its policy's
    ``max_uses`` or ``max_age`` is retired and given back (the caller waits on in line)."""

    def make_or_retire(ask: Ask, row: Sequence[Any], sent_at: float) -> Lease | None:
        lease = make(ask, row, sent_at)
        if lease is not None and health.retire_due(lease, policy()):
            lease.release()
            return None
        return lease

    return make_or_retire


acquire = runs(acquiring, "acquire")
aacquire = awaits(acquiring, "aacquire")

#: Seconds between a session waiter's tries of its bound resource while its looks see it
#: taken: a try finds out whether the resource can still serve the session (``sessions``).
SESSION_RETRY = 1.0

#: How many grants in a row one attempt of ``acquire()`` gives back because their resource was
#: past its policy's ``max_uses`` or ``max_age`` (each is retired as it is found).
RETIRED_RETRIES = 3


def granted(lease: Lease, *, auto_renew: bool) -> Lease:
    """Announce a new grant (``lease_granted``) and start its background renewal if asked."""
    signals.lease_granted.send(sender=Resource, lease=lease)
    if auto_renew:
        renewal.renewer().add(lease)
    return lease


def lease_from_row(
    row: Sequence[Any],
    sent_at: float,
    *,
    holder: str,
    ttl: float,
    alias: str,
    on_lost: OnLost | None = None,
    lease_class: type[Lease] | None = None,
) -> Lease | None:
    """The lease of a granted row (``sent_at``: when its grant was sent, this machine's
    monotonic clock): a grant statement's row, or one a release handed to a place in line
    (``line.handoff``). None if it arrived dead (given back); given back, and refused, if the
    process is giving back what it holds."""
    lease = (lease_class or Lease)(
        ops(alias).dialect.to_resource(row), holder=holder, ttl=ttl, using=alias, sent_at=sent_at, on_lost=on_lost
    )
    if arrived_dead(lease):
        give_back_dead(lease, took=time.monotonic() - sent_at)
        return None
    _track(lease)
    if keeper().stopping.is_set():
        # Granted while the process was giving back what it held: given back too.
        lease.release()
        keeper().refuse_when_stopping("grants")
    return lease


def making(*, alias: str, on_lost: OnLost | None = None, lease_class: type[Lease] | None = None) -> Make[Lease]:
    """How an entry point makes its lease of a row granted for an ``Ask`` (``line.Wait.make``;
    ``handed``: of a row a release handed to its place, which the line claims)."""

    def make(ask: Ask, row: Sequence[Any], sent_at: float) -> Lease | None:
        return lease_from_row(
            row, sent_at, holder=ask.holder, ttl=ask.ttl, alias=alias, on_lost=on_lost, lease_class=lease_class
        )

    return make


def arrived_dead(lease: Lease) -> bool:
    """Whether a grant's (or renewal's) answer came back after the lease's local deadline,
    counted from when it was sent: the statement or its answer was held up for longer than the
    ttl less the safety margin (a paused database node that finishes the statement when it
    resumes, a stalled network). By the database's clock the lease may have expired and the
    resource been granted again meanwhile, with a higher fence (docs/pitfalls.md#late-answers)."""
    return lease.remaining() <= 0.0


def give_back_dead(lease: Lease, *, took: float, after: str = "the grant's answer") -> None:
    """A grant that arrived dead is never handed out: the attempt counts as nothing granted,
    and the row is given back if it is still this lease's (the fenced release never touches
    a later holder's). No signal is sent: nobody was told of the grant."""
    lease._released = True
    logger.warning(
        "%r: %s took %.3gs, longer than the lease may be trusted (ttl %gs less the safety margin): not handed out",
        lease,
        after,
        took,
        lease.ttl,
    )
    try:
        lease._ops().release(**lease._key())
    except LeaseDatabaseError as exc:  # it expires by itself at its busy_before
        logger.warning("%r: giving back the late grant failed, it expires by itself: %s", lease, exc)
