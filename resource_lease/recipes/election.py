"""Leader election: one leader per name at any instant, with a hand-over state.

An election is one coordination row (kind ``@election``, name = the election's name) leased
like a resource: the leader is the row's holder, its leadership the grant (fence + 1 on every
new leader, renewed in the background, lost ttl after the leader stops renewing, judged by the
database's clock), and the hand-over state is the row's data, written only by a fenced
statement (holder, fence and expiry checked by the database), so a leader that was paused
past its ttl cannot overwrite what its successor saved.

``leader_only`` (the seed's APScheduler ``MutexScheduler``) turns a periodic job into one
that runs on one server at a time, with the state each run returns handed to the next run,
wherever that runs.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from resource_lease import named
from resource_lease.conf import lease_settings
from resource_lease.db.connections import close_connections
from resource_lease.exceptions import LeaseError, LeaseLost, NoResourceAvailable
from resource_lease.lease import Lease, granted, process_identity, refuse_inside_single_writer_transaction
from resource_lease.renewal import renewer
from resource_lease.validation import (
    check_alias,
    check_callable,
    check_holder,
    check_name,
    check_seconds,
    check_timeout,
)
from resource_lease.waiting import Backoff, wait_for

logger = logging.getLogger("resource_lease")

#: The kind of every election's row.
KIND = named.row_kind("election")

OnElected = Callable[[Lease], Any]
OnRevoked = Callable[[str], Any]


def default_candidate() -> str:
    """``"<hostname>:<pid>"``: who campaigns when no ``holder`` is given."""
    return process_identity()[:255]


def check_state(value: Any, name: str = "state") -> dict[str, Any]:
    """A hand-over state: a dict with string keys that JSON can store as it is."""
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict, got {value!r}")
    if not all(isinstance(key, str) for key in value):
        raise ValueError(f"{name} must have string keys, got {sorted(map(repr, value))}")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be JSON-serialisable: {exc}") from exc
    return value


class Election:
    """Campaign for leadership of ``name`` against every other process that does.

    ``holder`` names this candidate (default ``"<hostname>:<pid>"``); ``ttl`` is how long
    leadership outlives a leader that stops renewing it (default ``RESOURCE_LEASE["TTL"]``).
    Safe to share between the threads of one process.
    """

    def __init__(
        self, name: str, *, ttl: float | None = None, holder: str | None = None, using: str | None = None
    ) -> None:
        self.name = check_name(name, "name")
        self.ttl = check_seconds(lease_settings.TTL if ttl is None else ttl, "ttl")
        self.holder = check_holder(holder) or default_candidate()
        self.using = check_alias(lease_settings.DATABASE if using is None else using)
        self._lock = threading.RLock()
        self._lease: Lease | None = None
        #: The leadership that start()'s on_elected announced and on_revoked has not closed.
        self._announced: Lease | None = None
        self._on_elected: OnElected | None = None
        self._on_revoked: OnRevoked | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._wake = threading.Event()

    def __repr__(self) -> str:
        return f"<Election {self.name!r} holder={self.holder!r}{' leader' if self.lease else ''}>"

    # -- leadership ------------------------------------------------------------------

    @property
    def lease(self) -> Lease | None:
        """This candidate's leadership as far as this process knows (not released, not
        known lost), or None. ``lease.check()`` before leader work; ``lease.fence`` for
        fenced writes elsewhere."""
        with self._lock:
            lease = self._lease
        if lease is None or lease.released or lease.lost:
            return None
        return lease

    def campaign(self, timeout: float | None = None) -> Lease:
        """Become the leader: wait up to ``timeout`` seconds (None: for ever, 0: one try).

        Returns the leadership's ``Lease``, renewed in the background until ``resign()``
        or loss. Already leader: the same lease. Raises ``NoResourceAvailable`` naming
        the current leader when the timeout runs out.
        """
        wait = check_timeout(timeout)
        refuse_inside_single_writer_transaction(self.using, "campaign()")
        current = self.lease
        if current is not None:
            return current
        lease = wait_for(lambda: self._grant_once(auto_renew=True), timeout=wait)
        if lease is None:
            record = self.record()
            raise NoResourceAvailable(
                f"election {self.name!r} was not won within {wait:g}s: {record['leader']!r} leads"
                f" until {record['expires_at']} (database clock)",
                kind=KIND,
            )
        return lease

    def _grant_once(self, *, auto_renew: bool) -> Lease | None:
        lease = named.try_grant(self.using, KIND, self.name, holder=self.holder, ttl=self.ttl, on_lost=self._lost)
        if lease is None:
            return None
        with self._lock:
            self._lease = lease
        logger.info("elected: %s leads %r (fence %d)", self.holder, self.name, lease.fence)
        return granted(lease, auto_renew=auto_renew)

    def resign(self) -> bool:
        """Step down. True if we were the leader (the leadership is free for others now)."""
        with self._lock:
            lease, self._lease = self._lease, None
        if lease is None:
            return False
        released = lease.release()
        self._revoked(lease, "resigned")
        self._wake.set()
        return released

    def is_leader(self) -> bool:
        """Whether the database has this candidate as the live leader right now."""
        lease = self.lease
        if lease is None:
            return False
        try:
            lease.check()
        except LeaseLost:
            return False
        if lease.is_held():
            return True
        lease.mark_lost("the database no longer has this candidate as the leader")
        return False

    def leader(self) -> str | None:
        """The live leader's holder id, or None (judged by the database's clock)."""
        return self.record()["leader"]

    def record(self) -> dict[str, Any]:
        """``{"leader": holder or None, "expires_at": datetime or None, "state": dict}``,
        read in one statement (expires_at on the database's clock)."""
        snapshot = named.read(self.using, KIND, [self.name])
        row = snapshot.rows.get(self.name)
        live = snapshot.live(self.name)
        return {
            "leader": live.holder if live is not None else None,
            "expires_at": live.busy_before if live is not None else None,
            "state": dict(row.data or {}) if row is not None else {},
        }

    # -- hand-over state -------------------------------------------------------------

    @property
    def state(self) -> dict[str, Any]:
        """The hand-over state the last leader saved (read from the database; {} if none)."""
        state: dict[str, Any] = self.record()["state"]
        return state

    def save_state(self, state: dict[str, Any]) -> None:
        """Store ``state`` as the hand-over state, only if we are still the leader.

        A fenced write: the database checks holder, fence and expiry in the same
        statement. Raises ``LeaseLost`` (nothing written) if leadership was lost.
        """
        check_state(state)
        lease = self.lease
        if lease is None:
            raise LeaseLost(f"{self!r} is not the leader: its state is not ours to save")
        lease.check()
        if not named.write_data(lease, state):
            lease.mark_lost("a fenced write of the election's state found the leadership expired or taken")
            raise LeaseLost(f"{lease!r}: {lease.lost_reason}")

    # -- run, start, stop ------------------------------------------------------------

    def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Campaign (waiting as long as it takes), call ``func(*args, **kwargs)`` while
        leader, resign; return what ``func`` returned. ``func`` should ``check()`` the
        lease (``election.lease``) before each piece of leader work."""
        check_callable(func, "func")
        self.campaign(timeout=None)
        try:
            return func(*args, **kwargs)
        finally:
            self.resign()

    def start(self, on_elected: OnElected | None = None, on_revoked: OnRevoked | None = None) -> None:
        """Campaign in a background thread; again after every loss, until ``stop()``.

        ``on_elected(lease)`` is called (in that thread) each time we become leader;
        ``on_revoked(reason)`` once when that leadership ends: lost (in the thread that
        noticed: the renewal thread, or yours in ``check()``/``save_state()``/
        ``is_leader()``, before it raises), or resigned. Keep both short.
        """
        check_callable(on_elected, "on_elected")
        check_callable(on_revoked, "on_revoked")
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise LeaseError(f"{self!r} is already started")
            self._on_elected, self._on_revoked = on_elected, on_revoked
            self._stopping.clear()
            self._thread = threading.Thread(
                target=self._campaign_forever, name=f"resource-lease-election:{self.name}"[:60], daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop campaigning, resign if leader (``on_revoked("resigned")``), and wait up to
        ``timeout`` seconds (None: as long as it takes) for the background thread."""
        wait = check_timeout(timeout)
        self._stopping.set()
        self._wake.set()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait)
        self.resign()

    def _campaign_forever(self) -> None:
        backoff = Backoff()
        try:
            while not self._stopping.is_set():
                try:
                    lease = self._grant_once(auto_renew=True)
                except Exception:  # the database is away: keep campaigning, loudly
                    logger.exception("campaigning for %r failed; trying again", self.name)
                    lease = None
                if lease is None:
                    self._stopping.wait(backoff.next())
                    continue
                backoff = Backoff()
                with self._lock:
                    self._announced = lease
                if self._on_elected is not None:
                    try:
                        self._on_elected(lease)
                    except Exception:
                        logger.exception("on_elected of %r raised", self)
                self._hold(lease)
                # One retry interval before standing again: the other candidates, who try
                # at least that often, get the leadership we just gave up or lost.
                self._stopping.wait(float(lease_settings.BACKOFF_MAX))
            # stop() may have given up waiting for us: a leadership won meanwhile is not kept.
            self.resign()
        finally:
            close_connections()

    def _hold(self, lease: Lease) -> None:
        """Wait while ``lease`` lasts, checking the local deadline every second (a leader
        that was paused learns of the loss on resume even if its renewal is stuck)."""
        while not self._stopping.is_set() and not lease.released:
            try:
                lease.check()
            except LeaseLost:
                return
            self._wake.wait(min(1.0, self.ttl / 4))
            self._wake.clear()

    # -- loss ------------------------------------------------------------------------

    def _lost(self, lease: Lease) -> None:
        # The lease's on_lost: called once, in the thread that noticed the loss.
        with self._lock:
            if self._lease is lease:
                self._lease = None
        logger.warning("revoked: %s no longer leads %r: %s", self.holder, self.name, lease.lost_reason)
        self._revoked(lease, lease.lost_reason)
        self._wake.set()

    def _revoked(self, lease: Lease, reason: str) -> None:
        with self._lock:
            if self._announced is not lease:
                return
            self._announced = None
            callback = self._on_revoked
        if callback is not None:
            try:
                callback(reason)
            except Exception:
                logger.exception("on_revoked of %r raised", self)


# -- one-server periodic jobs ----------------------------------------------------------

Otherwise = Callable[[dict[str, Any]], Any]


class LeaderJob:
    """A function that runs on one server at a time (what ``leader_only`` returns).

    Call it from any scheduler on every server. The caller that leads runs the body with
    ``**state`` and stores what it returns; the others get ``otherwise(record)``.
    """

    def __init__(
        self,
        func: Callable[..., dict[str, Any] | None],
        name: str,
        *,
        ttl: float | None,
        otherwise: Otherwise | None,
        using: str | None,
    ) -> None:
        self.func = func
        self.name = name
        self.ttl = ttl
        self.otherwise = otherwise
        self.using = using
        self._election: Election | None = None
        self._running = threading.Lock()  # one body at a time in this process, too
        self._making = threading.Lock()
        functools.update_wrapper(self, func)

    @property
    def election(self) -> Election:
        """This process's candidate (made on first use, and again in a forked child:
        docs/pitfalls.md#fork)."""
        with self._making:
            election = self._election
            if election is None or not election.holder.endswith(f":{os.getpid()}"):
                election = self._election = Election(self.name, ttl=self.ttl, using=self.using)
            return election

    def record(self) -> dict[str, Any]:
        """``{"leader", "expires_at", "state"}``: what ``otherwise`` is given."""
        return self.election.record()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self._running.acquire(blocking=False):
            return self._otherwise()  # another thread of this process is running the body
        try:
            lease = self._lead()
            if lease is None:
                return self._otherwise()
            return self._run(lease, args, kwargs)
        finally:
            self._running.release()

    def _otherwise(self) -> Any:
        return None if self.otherwise is None else self.otherwise(self.record())

    def _lead(self) -> Lease | None:
        """Our leadership, renewed; won now if nobody holds it; else None."""
        election = self.election
        lease = election.lease
        if lease is not None:
            if lease.remaining() > 0:
                try:
                    lease.renew()
                    return lease
                except LeaseLost:
                    pass
            else:
                # Lapsed since the last run returned (no renewal between runs, by design):
                # give it back if the database still has it, then stand like anyone else.
                election.resign()
        return election._grant_once(auto_renew=False)

    def _run(self, lease: Lease, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        state = dict(lease.resource.data or {})  # as granted or as we last stored it
        renewer().add(lease)  # renewed in the background while the body runs
        try:
            result = self.func(*args, **kwargs, **state)
        except BaseException:
            renewer().discard(lease)
            try:
                lease.renew()  # the leadership outlives a failed run too
            except LeaseError:
                logger.warning("renewing %r after its job failed did not work", lease, exc_info=True)
            raise
        renewer().discard(lease)
        if result is not None:
            check_state(result, f"the return value of {self.name!r}")
        lease.renew()  # LeaseLost: the run lost its leadership, nothing is stored
        if result is not None and not named.write_data(lease, result):
            lease.mark_lost("a fenced write of the job's state found the leadership expired or taken")
            raise LeaseLost(f"{lease!r}: {lease.lost_reason}")
        return result


def leader_only(
    name: str, *, ttl: float | None = None, otherwise: Otherwise | None = None, using: str | None = None
) -> Callable[[Callable[..., dict[str, Any] | None]], LeaderJob]:
    """Decorate a periodic job so that it runs on one server at a time.

    The body is called with ``**state``, the dict the previous run (on any server)
    returned ({} at first), and returns the next state (a dict, or None to keep it). The
    leader keeps leadership after each run: renewed when the body returns and lapsing
    ``ttl`` seconds later (not renewed between runs), so it runs every tick while it
    lives, and servers whose schedules fire within ``ttl`` of each other never run one
    tick twice. Others get ``otherwise(record)`` (None without it), where ``record`` is
    ``{"leader", "expires_at", "state"}``. A run whose leadership was lost meanwhile
    stores nothing and raises ``LeaseLost``.
    """
    check_name(name, "name")
    if ttl is not None:
        check_seconds(ttl, "ttl")
    check_callable(otherwise, "otherwise")
    if using is not None and not isinstance(using, str):
        raise ValueError(f"using must name a database in settings.DATABASES, got {using!r}")

    def decorate(func: Callable[..., dict[str, Any] | None]) -> LeaderJob:
        check_callable(func, "func")
        return LeaderJob(func, name, ttl=ttl, otherwise=otherwise, using=using)

    return decorate
