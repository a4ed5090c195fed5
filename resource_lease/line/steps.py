"""The steps of one wait in line, apart from how statements run and pauses pass (sans-IO): the
same decisions serve threads (``line.threads``) and asyncio (``line.aio``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

from resource_lease.conf import lease_settings
from resource_lease.db.connections import LockWaitTimeout
from resource_lease.db.line import ARRIVING, NEWCOMER, Look, Turn, left_by_grant
from resource_lease.exceptions import DatabaseUnavailable
from resource_lease.line import handoff, leaving, places
from resource_lease.line.counters import stats
from resource_lease.line.granting import Make
from resource_lease.line.places import Line, Place, marked_now
from resource_lease.line.wakeups import Waker, board, listen, pass_turn, pushed, unlisten

logger = logging.getLogger("resource_lease")

#: Seconds before a waiter tries again to take a place after a lock wait timeout.
ENTER_RETRY = 0.05


def _short_of(look: Look) -> int:
    """How many more rows must free up before this waiter's turn, as far as its look tells: a
    pool's line serves as many of its first waiters at once as it has free rows (LINE_CLEAR),
    waiters with a ``where=`` of their own aside (they may not want those rows)."""
    return max(0, look.ahead - look.filtered - look.free)


def _interval(look: Look, pushed: bool) -> float:
    """Seconds until a waiter looks at its line again (see the module's docstring)."""
    longest = float(lease_settings.LINE_POLL_MAX)
    # A NOTIFY comes with a release only: rows already free (their holder's lease ran out) are
    # looked at as where nothing is pushed, or a waiter whose turn came because those ahead
    # gave up would sleep LINE_POLL_MAX, and waiters whose timeouts are shorter than that
    # would give up in turn, none ever served (found by tests/test_partitions.py's flapping
    # link on PostgreSQL).
    relies_on_push = pushed and look.free == 0
    pause = longest if relies_on_push else min(longest, float(lease_settings.LINE_POLL) * (1 + _short_of(look)))
    if look.ahead == 0 and look.next_free_at is not None:
        # First in line behind a holder: look again when its lease runs out, in case it died.
        until = (look.next_free_at - look.now).total_seconds()
        pause = min(pause, max(until, 0.0) + float(lease_settings.LINE_POLL))
    if look.cooled_at is not None:
        # A row cooling down for the waiter's target: nobody releases it when its cooldown
        # ends, so nobody tells the waiter; it looks again then.
        until = (look.cooled_at - look.now).total_seconds()
        pause = min(pause, max(until, 0.0) + float(lease_settings.LINE_POLL))
    return pause


@dataclass(frozen=True)
class Attempt:
    """Step: the caller's attempt, granting as this turn (``granting.grantor``); send back its
    result."""

    turn: Turn


@dataclass(frozen=True)
class Call:
    """Step: run this database call (a place taken, a look, ...); send back its result."""

    run: Callable[[], Any]


@dataclass(frozen=True)
class Pause:
    """Step: wait up to ``seconds`` for a wake-up; send back how many came."""

    seconds: float


@dataclass(frozen=True)
class ClaimHanded:
    """Step: take the grant a release handed to ``place`` (``line.handoff.claim``: the row it
    named, 0 if not known; what it said it granted, or None); send back the grant or None."""

    place: Place
    row: int = 0
    grant: Any = None


Step = Attempt | Call | ClaimHanded | Pause


class Request(Protocol):
    """What a caller asks of the line, built once by its entry point (``line.Wait``): the
    line, who asks and for how long, its priority, ``where=`` (as the dialect encoded it) and
    ``target`` ('' for none), whether it reads an rwlock (``shared``), and how it makes its
    grant of a row a release hands to its place (``handed``; None: its place takes no
    hand-off)."""

    @property
    def line(self) -> Line: ...
    @property
    def holder(self) -> str: ...
    @property
    def ttl(self) -> float: ...
    @property
    def priority(self) -> int: ...
    @property
    def where(self) -> str | None: ...
    @property
    def target(self) -> str: ...
    @property
    def retry_every(self) -> float: ...
    @property
    def shared(self) -> bool: ...
    @property
    def handed(self) -> Make[Any] | None: ...


class Waiting:
    """One caller's wait in a line: what to do next (``steps``), apart from how statements run
    and pauses pass, so that the same decisions serve threads (``wait_in_line``) and asyncio
    (``line.aio``). ``cleanup()`` (a database call) must follow, however it ended."""

    def __init__(self, request: Request, *, timeout: float | None, waker: Waker, arrived: bool = False) -> None:
        self.line = request.line
        self.shared = request.shared
        #: How the caller makes its grant of a row a release handed to its place; None: its
        #: place takes no hand-off (``Wait.handed``).
        self.handed = request.handed
        #: How the wait ended: served by a grant of its own, or by reading the grant a release
        #: handed its place (``_claim``).
        self.granted = False
        self.claimed = False
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.holder = request.holder
        self.ttl = request.ttl
        self.priority = request.priority
        self.where = request.where
        self.target = request.target
        self.retry_every = request.retry_every
        self.waker = waker
        #: The caller's first attempt, as it arrived, was made (by the driver) and granted
        #: nothing: the steps start at taking a place.
        self.arrived = arrived
        self.place: Place | None = None
        self._listening = False
        self._refusals = 0  # statements that could not connect, in a row

    def unavailable(self, exc: DatabaseUnavailable) -> float | None:
        """A statement of this wait could not connect (nothing was sent): seconds to pause
        before running it again, or None to give up (raise it) once the timeout has run out."""
        left = None if self.deadline is None else self.deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        self._refusals += 1
        base, cap = float(lease_settings.BACKOFF_BASE), float(lease_settings.BACKOFF_MAX)
        pause = min(cap, base * 2 ** min(self._refusals - 1, 32))
        if self._refusals == 1 or self._refusals % 30 == 0:
            logger.warning(
                "waiting in line %s: the database refused the connection (%s); asking again while the timeout lasts",
                self.line,
                exc,
            )
        return pause if left is None else min(pause, left)

    def answered(self) -> None:
        """A statement of this wait reached the database."""
        self._refusals = 0

    def _enter(self) -> Place | None:
        """A place at the back of the line, or None if taking it waited out the bounded lock
        wait (rolled back, nothing written): like a grant that did, the caller's own timeout
        decides whether to try again (``_take_place``). The place is ours at once
        (``self.place``), so that ``cleanup`` leaves it even if the answer of this call never
        reaches ``steps`` (an asyncio caller cancelled while it ran)."""
        try:
            self.place = places.enter(
                self.line,
                holder=self.holder,
                priority=self.priority,
                where=self.where,
                ttl=self.ttl,
                waker=self.waker,
                target=self.target,
                shared=self.shared,
                handoff=self.handed is not None,
            )
            return self.place
        except LockWaitTimeout as exc:
            stats.enter_lock_waits += 1
            logger.warning(
                "taking a place in line %s waited out the lock wait timeout; trying again: %s", self.line, exc
            )
            return None

    def _reenter(self) -> Place | None:
        """Leave the lost place and take a new one. Run again after a refused connection (the
        driver repeats a step that never reached the database), so the lost place is left
        only once: the second run goes straight to taking the new one (the nemesis found a
        restart between the two, and the repeated step's AssertionError)."""
        if self.place is not None:
            lost, self.place = self.place, None
            leaving.leave(lost)
        return self._enter()

    def _take_place(self, reenter: bool = False) -> Generator[Step, Any, Place | None]:
        """Take a place (leave the lost one first if ``reenter``), trying again after a lock
        wait timeout until the deadline; None once the deadline has passed."""
        place = yield Call(self._reenter if reenter else self._enter)
        while place is None:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                return None
            yield Pause(
                ENTER_RETRY if self.deadline is None else max(0.0, min(ENTER_RETRY, self.deadline - time.monotonic()))
            )
            place = yield Call(self._enter)
        return place  # self.place already (``_enter``)

    def _look(self) -> Look:
        assert self.place is not None
        return places.look(self.place, self.where, self.shared, self.target)

    def _listen(self) -> None:
        self._listening = True
        board().add((self.line.alias, self.line.kind, self.line.name), self.waker)
        listen(self.line.alias)

    def claim(self, step: ClaimHanded) -> Any:
        """Run a ``ClaimHanded`` step (a database call): the grant, made by the caller, or None."""
        assert self.handed is not None, "a place that takes no hand-off is never handed a row"
        return handoff.claim(step.place, self.handed, ttl=self.ttl, holder=self.holder, row=step.row, grant=step.grant)

    def _claim(self, place: Place, row: int, grant: tuple[Any, ...] | None = None) -> Generator[Step, Any, Any]:
        """Take the grant a release handed to ``place`` (``row``: the one it named, 0: any;
        ``grant``: what the release said it granted, else it is read); none (the place had
        expired, or its grant ran out): the place is lost."""
        place.gone = False
        stats.claims += 1
        place.attempting, result = True, None
        try:
            result = yield ClaimHanded(place, row, grant)
        finally:
            place.attempted(granted=True)  # judged here: a renewal meanwhile found it gone, as we know
        if result is not None:
            stats.handed += 1
            self.claimed = True
        else:
            place.mark_lost("it was gone and nothing had been handed to it (the waiter was paused past its ttl?)")
        return result

    def steps(self) -> Generator[Step, Any, Any]:
        """The wait, step by step (see the module's docstring); returns the grant or None."""
        if self.arrived:
            pass  # the driver's first attempt granted nothing a moment ago: to a place
        elif self.timeout != 0 and marked_now(self.line):
            # Every row of the line is marked (by this process's waiters, a moment ago): the
            # newcomer's one try (UNMARKED) would be refused. Straight to a place.
            stats.first_tries_skipped += 1
        else:
            result = yield Attempt(NEWCOMER if self.timeout == 0 else ARRIVING)
            if result is not None or self.timeout == 0:
                if result is not None:
                    stats.at_once += 1
                return result
        yield Call(self._listen)
        place = yield from self._take_place()
        if place is None:
            return None
        estimate = 0  # rows to free up before our turn, as last seen, less the wake-ups since
        candidates: tuple[int, ...] = ()  # rows the last look saw free, for the try right after it
        look_at = 0.0  # look at once: the first attempt failed a moment ago
        try_now = False
        tried_at = time.monotonic()
        while True:
            handed = self.waker.take_handed()
            mine = handed if handed is not None and handed[0] == place.id else None
            if place.token and (place.gone or mine is not None):
                # A release handed this place a row (it said so, or the place is gone): take it,
                # as the release described it (its NOTIFY) or read.
                result = yield from self._claim(place, *((0, None) if mine is None else mine[1:]))
                if result is not None:
                    return result
            if place.lost:
                place = yield from self._take_place(reenter=True)
                if place is None:
                    return None
                look_at = 0.0
            if try_now:
                try_now = False
                tried_at = time.monotonic()
                stats.attempts += 1
                place.attempting, result = True, None
                try:
                    result = yield Attempt(place.turn.trying(candidates))
                finally:
                    place.attempted(granted=result is not None)
                candidates = ()
                if result is not None:
                    self.granted = True
                    return result
            now = time.monotonic()
            if self.deadline is not None and now >= self.deadline:
                return None
            if now >= look_at:
                # Whether a release wakes us, asked *before* the look: a LISTEN that came into
                # force after the look's snapshot may have missed a release the look did not
                # see, and trusting it would sleep through that release (LINE_POLL_MAX).
                told = pushed(self.line.alias)
                look: Look = yield Call(self._look)
                if not look.live:
                    if place.token:
                        place.gone = True  # handed a row (a NOTIFY missed), or expired
                    else:
                        place.mark_lost("the place had expired when its waiter looked (paused past its ttl?)")
                    continue
                estimate = _short_of(look)
                look_at = now + _interval(look, told)
                if self.retry_every and look.ahead == 0:
                    # First in line: look (and try) again within ``retry_every`` of the last
                    # try, whatever the look's pause says. A bound row that stops serving its
                    # session (quarantined as it was released) may be released with no turn
                    # told that reaches the waiter (a NOTIFY sent before its LISTEN came into
                    # force): with the pushed pause of LINE_POLL_MAX the waiter slept through
                    # its timeout (tests/test_sessions.py, once on a loaded machine).
                    look_at = min(look_at, tried_at + self.retry_every)
                if look.free > look.ahead - look.filtered:
                    # A row this waiter may take is free, unless waiters ahead take it first
                    # (those with a where= of their own may not want it): try, the statement
                    # decides (on the rows the look listed, where it lists them).
                    try_now, candidates = True, look.free_ids
                    continue
                if self.retry_every and look.ahead == 0 and now - tried_at >= self.retry_every:
                    try_now = True  # what it waits for may no longer serve it: its try says
                    continue
            until = look_at if self.deadline is None else min(look_at, self.deadline)
            woken = yield Pause(until - now)
            if woken:
                stats.wakes += woken
                estimate -= woken
                turn = self.waker.take_turn()
                if estimate <= 0 or turn:
                    # Perhaps our turn (a release told us so, or enough rows were freed for
                    # it): try, and if it was not, look at once.
                    try_now, look_at = True, 0.0

    def cleanup(self) -> None:
        """Leave the line, stop listening (a database call: run it however the wait ended)."""
        if self._listening:
            board().remove((self.line.alias, self.line.kind, self.line.name), self.waker)
            unlisten(self.line.alias)
        if self.place is not None:
            place, self.place = self.place, None
            # Whether a grant of ours found the place there as it left it (PostgreSQL's
            # ``leaving`` forms), else None.
            left = left_by_grant.pop((place.line.alias, place.id), None)
            # Gone already, in the commit that served us (our grant's, or the release that
            # handed us the row): nothing to delete, and no round trip to delete nothing.
            there = leaving.leave(place, gone=bool(left) or self.claimed)
            if there is None:
                leaving.retry(place)  # the database could not be told: the keeper leaves it
            elif place.token and not self.claimed and not (there or left):
                # Neither our leave nor our grant deleted the place: a release may have handed
                # it a row a moment before (or it had expired).
                if leaving.give_back_handed(place) is None:
                    leaving.retry(place)
            if self.waker.take_turn():
                # A release told this waiter its turn, and it did not take it (served by an
                # earlier turn, or it gave up): the waiters now first may take it.
                stats.turns_passed += 1
                pass_turn(self.line.alias, self.line.kind, self.line.name)
