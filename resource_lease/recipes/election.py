"""Leader election: one leader per name at any instant, with a hand-over state.

An election is one coordination row (kind ``@election``, name = the election's name) leased
like a resource: the leader is the row's holder, its leadership the grant (fence + 1 on every
new leader, renewed in the background, lost ttl after the leader stops renewing, judged by the
database's clock), and the hand-over state is the row's data, written only by a fenced
statement (holder, fence and expiry checked by the database), so a leader that was paused
past its ttl cannot overwrite what its successor saved.

``leader_only`` (a hand-written APScheduler ``MutexScheduler``, replaced) turns a periodic job into one
that runs on one server at a time, with the state each run returns handed to the next run,
wherever that runs.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from resource_lease import named
from resource_lease.conf import lease_settings
from resource_lease.db.operations import ops
from resource_lease.exceptions import LeaseError, LeaseLost, NoResourceAvailable, OutcomeUnknown
from resource_lease.keeper import dispatch, keeper
from resource_lease.lease import Lease, process_identity
from resource_lease.line import Line, Wait
from resource_lease.line.aio import arun
from resource_lease.offload import async_twin
from resource_lease.recipes.notifications import POLL, check_poll
from resource_lease.recipes.observing import LeadershipFeed, OnChange, observe, observers_channel
from resource_lease.renewal import renewer
from resource_lease.validation import Options, check_callable, check_json_dict, check_name, check_timeout
from resource_lease.watching import Watch

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
    return check_json_dict(value, name)


class Election:
    """Campaign for leadership of ``name`` against every other process that does.

    ``holder`` names this candidate (default ``"<hostname>:<pid>"``); ``ttl`` is how long
    leadership outlives a leader that stops renewing it (default ``RESOURCE_LEASE["TTL"]``).
    Safe to share between the threads of one process. The candidate's row is a
    ``named.KeptRow``: renewed by the process's keeper, and with ``start()`` taken again by
    the keeper after every loss.
    """

    def __init__(
        self, name: str, *, ttl: float | None = None, holder: str | None = None, using: str | None = None
    ) -> None:
        self.name = check_name(name, "name")
        self.options = Options.of(ttl=ttl, using=using, holder=holder, default_holder=default_candidate)
        self.ttl, self.using, self.holder = self.options.ttl, self.options.using, self.options.holder
        self._lock = threading.RLock()
        #: The leadership that start()'s on_elected announced and on_revoked has not closed.
        self._announced: Lease | None = None
        self._on_elected: OnElected | None = None
        self._on_revoked: OnRevoked | None = None
        self._started = False
        self._row = named.KeptRow(
            self.using,
            KIND,
            self.name,
            holder=self.holder,
            ttl=self.ttl,
            owner=self,
            on_gained=self._gained,
            on_lost=self._lost,
            # One retry interval before standing again: the other candidates, who try at
            # least that often, get the leadership we just gave up or lost.
            pause_after_loss=float(lease_settings.BACKOFF_MAX),
            what=f"election {self.name!r}",
        )

    def __repr__(self) -> str:
        return f"<Election {self.name!r} holder={self.holder!r}{' leader' if self.lease else ''}>"

    # -- leadership ------------------------------------------------------------------

    @property
    def lease(self) -> Lease | None:
        """This candidate's leadership as far as this process knows (not released, not
        known lost), or None. ``lease.check()`` before leader work; ``lease.fence`` for
        fenced writes elsewhere."""
        return self._row.lease

    def campaign(self, timeout: float | None = None) -> Lease:
        """Become the leader: wait up to ``timeout`` seconds (None: for ever, 0: one try).

        Returns the leadership's ``Lease``, renewed in the background until ``resign()``
        or loss. Already leader: the same lease. Raises ``NoResourceAvailable`` naming
        the current leader when the timeout runs out.
        """
        return self._campaigning(timeout).run()

    async def acampaign(self, timeout: float | None = None) -> Lease:
        """``campaign()`` for async code: waits without blocking the event loop."""
        from resource_lease.offload import in_thread

        return await arun(await in_thread(self._campaigning, timeout))

    async def __aenter__(self) -> Election:
        """``async with Election(name) as election:`` campaigns (for as long as it takes) and
        resigns on the way out."""
        await self.acampaign()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aresign()

    def _campaigning(self, timeout: float | None) -> Wait[Lease]:
        # In the election's line: candidates that campaign() are served in the order they
        # asked (start()'s background candidates try as newcomers, behind them).
        wait = check_timeout(timeout)
        self.options.refuse_in_transaction("campaign()")

        def conclude(lease: Lease | None) -> Lease:
            if lease is None:
                record = self.record()
                raise NoResourceAvailable(
                    f"election {self.name!r} was not won within {wait:g}s: {record['leader']!r} leads"
                    f" until {record['expires_at']} (database clock)",
                    kind=KIND,
                )
            return lease

        return Wait(
            Line(self.using, KIND, self.name),
            lambda grant: self._row.take(grant=grant),
            conclude,
            timeout=wait,
            holder=self.holder,
            ttl=self.ttl,
            make=self._row.making(adopt=False),
            handed=self._row.making(),
        )

    def _grant_once(self, *, auto_renew: bool) -> Lease | None:
        """One attempt (``leader_only``'s is renewed only while its body runs)."""
        return self._row.take(auto_renew=auto_renew)

    def _gained(self, lease: Lease) -> bool:
        # Written down before anyone is told, while the grant is live: a leader that acts is
        # in the log its observers read (recipes/observing.py). Not written (the grant was
        # already lost, or the database failed): given back, as if never won.
        try:
            recorded = ops(self.using).terms.record_term(
                KIND, self.name, fence=lease.fence, holder=self.holder, channel=observers_channel(self.name)
            )
        except LeaseError as exc:
            logger.warning("election %r: writing down term %d failed; giving it back: %s", self.name, lease.fence, exc)
            return False
        if not recorded:
            logger.warning("election %r: term %d was lost before it was written down", self.name, lease.fence)
            return False
        logger.info("elected: %s leads %r (fence %d)", self.holder, self.name, lease.fence)
        with self._lock:
            announce = self._started
            if announce:
                self._announced = lease
            callback = self._on_elected
        if announce and callback is not None:
            dispatch(self, callback, lease)
        return True

    def resign(self) -> bool:
        """Step down. True if we were the leader (the leadership is free for others now)."""
        lease, released = self._row.give_back()
        if lease is None:
            return False
        self._wake_observers()
        self._revoked(lease, "resigned")
        return released

    aresign = async_twin(resign)

    def _wake_observers(self) -> None:
        try:
            ops(self.using).terms.wake_observers(observers_channel(self.name))
        except LeaseError as exc:  # they find out at their next poll
            logger.info("election %r: waking its observers failed: %s", self.name, exc)

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

    ais_leader = async_twin(is_leader)

    def leader(self) -> str | None:
        """The live leader's holder id, or None (judged by the database's clock)."""
        return self.record()["leader"]

    aleader = async_twin(leader)

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

    arecord = async_twin(record)

    # -- observing -------------------------------------------------------------------

    def observe(self, callback: OnChange, *, poll: float = POLL) -> Watch:
        """Follow the leadership without campaigning: ``callback(leader, fence)`` with the
        state now, then for every change, in order, none skipped: each new term (its leader's
        holder id and its fence), and ``(None, fence)`` when nobody leads (fence: the last
        term's). Calls run one at a time on the watch's callback thread; woken at once on
        PostgreSQL, else polled every ``poll`` seconds (one read of the row, and one of the
        leadership log when the fence moved). ``stop()`` on the returned handle ends it."""
        if check_callable(callback, "callback") is None:
            raise ValueError("callback must be callable, got None")
        return observe(KIND, self.name, self.using, callback, poll=check_poll(poll))

    def watch(self, *, poll: float = POLL) -> LeadershipFeed:
        """``observe`` as an iterator of ``(leader, fence)``: ``for`` in a thread, ``async
        for`` in a coroutine (never blocking the event loop), the state now first; ``stop()``
        (or leaving ``with`` / ``async with``) ends it."""
        return LeadershipFeed(KIND, self.name, self.using, poll=check_poll(poll))

    # -- hand-over state -------------------------------------------------------------

    @property
    def state(self) -> dict[str, Any]:
        """The hand-over state the last leader saved (read from the database; {} if none)."""
        state: dict[str, Any] = self.record()["state"]
        return state

    astate = async_twin(state.fget)  # type: ignore[attr-defined]

    def save_state(self, state: dict[str, Any]) -> None:
        """Store ``state`` as the hand-over state, only if we are still the leader.

        A fenced write: the database checks holder, fence and expiry in the same
        statement. Raises ``LeaseLost`` (nothing written) if leadership was lost;
        ``OutcomeUnknown`` (the leadership lost too) if the connection was lost during the
        write and the leadership was gone when it was asked again: the state may have been
        saved, and the next leader may already have read it (docs/pitfalls.md#unknown-outcome).
        """
        check_state(state)
        lease = self.lease
        if lease is None:
            raise LeaseLost(f"{self!r} is not the leader: its state is not ours to save")
        lease.check()
        _fenced_write(lease, state, "the election's state")

    asave_state = async_twin(save_state)

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

    def start(
        self,
        on_elected: OnElected | None = None,
        on_revoked: OnRevoked | None = None,
        *,
        on_deposed: OnRevoked | None = None,
    ) -> None:
        """Campaign in the background (the process's keeper); again after every loss, until
        ``stop()``.

        ``on_elected(lease)`` is called each time we become leader; ``on_revoked(reason)``
        once when that leadership ends: lost, or resigned (``on_deposed`` is another name for
        it, as etcd and client-go users know it; give one of the two). Both run in order, one at a time,
        on this election's callback thread when the keeper noticed (never on the keeper's
        own), or in your thread when it noticed (``check()``, ``save_state()``,
        ``is_leader()``, ``resign()``), before that returns or raises.
        """
        check_callable(on_elected, "on_elected")
        check_callable(on_revoked, "on_revoked")
        check_callable(on_deposed, "on_deposed")
        if on_revoked is not None and on_deposed is not None:
            raise ValueError("on_deposed is another name for on_revoked: give one of the two")
        on_revoked = on_revoked if on_revoked is not None else on_deposed
        with self._lock:
            if self._started:
                raise LeaseError(f"{self!r} is already started")
            self._on_elected, self._on_revoked = on_elected, on_revoked
            self._started = True
        keeper().callbacks.pin(self)
        self._row.keep()

    def stop(self, timeout: float | None = None) -> None:
        """Stop campaigning and resign if leader (``on_revoked("resigned")``). ``timeout`` is
        accepted for compatibility: a campaign step running now gives back what it wins."""
        check_timeout(timeout)
        lease, _ = self._row.stop()
        if lease is not None:
            self._wake_observers()
            self._revoked(lease, "resigned")
        with self._lock:
            self._started = False
        keeper().callbacks.unpin(self)

    # -- loss ------------------------------------------------------------------------

    def _lost(self, lease: Lease, reason: str) -> None:
        # The row's on_lost: called once, ordered with on_elected.
        logger.warning("revoked: %s no longer leads %r: %s", self.holder, self.name, reason)
        self._revoked(lease, reason)

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
                record = self.record()
                if record["leader"] is not None:
                    return self._otherwise(record)
                # Nobody leads now: the leadership lapsed between our try and the read (a
                # leader that died). Try once more rather than tell of a leader that is gone.
                lease = self._lead()
                if lease is None:
                    return self._otherwise()
            return self._run(lease, args, kwargs)
        finally:
            self._running.release()

    def _otherwise(self, record: dict[str, Any] | None = None) -> Any:
        if self.otherwise is None:
            return None
        return self.otherwise(self.record() if record is None else record)

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
        if result is not None:
            _fenced_write(lease, result, "the job's state")
        return result


def _fenced_write(lease: Lease, state: dict[str, Any], what: str) -> None:
    """Store ``state`` under the leadership (``named.write_data``). Refused: the leadership is
    lost, ``LeaseLost`` (nothing written); of unknown outcome: lost too, ``OutcomeUnknown``."""
    try:
        written = named.write_data(lease, state)
    except OutcomeUnknown:
        lease.mark_lost(f"the answer to a fenced write of {what} was lost, and the leadership was gone after it")
        raise
    if not written:
        lease.mark_lost(f"a fenced write of {what} found the leadership expired or taken")
        raise LeaseLost(f"{lease!r}: {lease.lost_reason}")


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
        Options.of(ttl=ttl)
    check_callable(otherwise, "otherwise")
    if using is not None and not isinstance(using, str):
        raise ValueError(f"using must name a database in settings.DATABASES, got {using!r}")

    def decorate(func: Callable[..., dict[str, Any] | None]) -> LeaderJob:
        check_callable(func, "func")
        return LeaderJob(func, name, ttl=ttl, otherwise=otherwise, using=using)

    return decorate
