"""The line of waiters: callers that wait for a grant are served in order, woken at release.

Whoever waits (``acquire(timeout=...)``, ``lock``, ``semaphore``, ``ResourceHolder.acquire``,
``Election.campaign``) waits the way ZooKeeper's lock recipe serves its waiters, on rows of
the database (``models.Waiter``):

1. It first asks like anyone (a newcomer): a row is granted only if no live waiter of its
   line could take it (``statements.LINE_CLEAR``). So ``timeout=0`` never takes what someone
   waits for, and a holder that releases and asks again at once goes behind the waiters.
2. Otherwise it takes a place at the back of the line (``ENTER_LINE``): a row of its own,
   leased like any grant (the process's background renewal keeps it; a waiter that dies, or
   is paused past its ttl, drops out of the line by itself), and ordered by priority, then by
   id. Its grants now pass only rows that no live waiter *ahead* of it could take: the
   longest waiting (highest priority first) whose ``where`` a freed row matches gets it. One
   conditional statement still decides every race.
3. It learns of its turn promptly. A release in this process wakes its waiters at once; on
   PostgreSQL the release's own statement NOTIFYs the line (``db/listen.py``: one LISTEN
   connection per process); elsewhere the first waiter looks at its line (``Dialect.look``,
   one indexed read) every ``LINE_POLL`` seconds and those behind it less often. Every waiter
   also looks at least every ``LINE_POLL_MAX`` and at the moment the first held row of its
   line expires (a holder that died), so a missed wake-up costs time, never the turn.
4. When it is served, gives up (timeout) or is cancelled, it leaves the line at once
   (``LEAVE_LINE``); if it cannot (the database is down), the keeper leaves it as soon as
   the database answers (``resource_lease.leaving``), or its place expires after its ttl.
5. A statement of its wait that could not even connect (``DatabaseUnavailable``: nothing
   was sent, so nothing to settle) is asked again after a pause (``BACKOFF_BASE`` doubling up
   to ``BACKOFF_MAX``) while its timeout lasts (``Waiting.unavailable``); the last refusal
   is raised once the timeout has run out. A one-attempt call (``timeout=0``) raises at once.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from resource_lease import leaving, metrics, renewal
from resource_lease.conf import lease_settings
from resource_lease.db.connections import LockWaitTimeout
from resource_lease.db.line import ARRIVING, NEWCOMER, Look, Turn, left_by_grant
from resource_lease.db.line import Place as WaitingPlace
from resource_lease.db.operations import ops
from resource_lease.exceptions import DatabaseUnavailable, LeaseLost
from resource_lease.forking import at_fork
from resource_lease.keeper import keeper
from resource_lease.line_stats import stats
from resource_lease.wakeups import Waker, board, listen, pass_turn, pushed, turn_channel, unlisten

logger = logging.getLogger("resource_lease")

T = TypeVar("T")


@dataclass(frozen=True)
class Line:
    """A line of waiters: any row of ``kind`` (``name`` ''), or the one row ``(kind, name)``."""

    alias: str
    kind: str
    name: str = ""
    # Every line's waiters mark its rows (``Resource.line_until``, docs/waiting.md#marks): a
    # newcomer's first try may then skip the line's subquery, and a release knows that a
    # waiter may be in line, so it wakes the next one (PostgreSQL's RELEASE tells turns only
    # on a marked row). An rwlock's grants check its line anyway (``RW_READ``, ``RW_WRITE``),
    # but its release needs the mark all the same: without it its waiters slept through every
    # release until their LINE_POLL_MAX look (tests/test_liveness.py).

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else self.kind


class Place:
    """A waiter's place in line, leased like a grant: the process's background renewal keeps
    it (``renewal.Renewer``) until the waiter leaves; a renewal that finds it expired (the
    waiter was paused past its ttl) marks it lost, and the waiter takes a new place at the back."""

    def __init__(
        self,
        line: Line,
        place: int,
        *,
        priority: int,
        where: str | None,
        ttl: float,
        sent_at: float,
        waker: Waker,
        marked_at: float | None = None,
        token: str = "",
    ) -> None:
        self.line = line
        self.id = place
        self.where = where
        self.priority = priority
        self.ttl = ttl
        #: A release may hand this place a row in its own statement, held under ``token``
        #: (``Dialect.hands_off``): a place found gone may have been served.
        self.token = token
        self.turn = Turn(place, priority, token=token, entered_at=sent_at)
        self.lost = False
        #: Found gone by its renewal, handed a row or expired (``mark_gone``).
        self.gone = False
        #: A grant with this place is being tried (``Waiting.steps``): on PostgreSQL a grant
        #: deletes its place as it commits (``Dialect.leaving``), so a renewal meanwhile that
        #: finds it gone does not know yet whether it was served or had expired.
        self.attempting = False
        self._gone_while_attempting = False
        self._waker = waker
        self._deadline = sent_at + ttl
        # When the line's rows were last marked for this place: as it was taken, or (a mark
        # of this process's that is recent enough, ``fresh_mark``) before.
        self._marked_at = sent_at if marked_at is None else marked_at

    def __repr__(self) -> str:
        return f"<Place {self.id} in line {self.line}{' lost' if self.lost else ''}>"

    #: A mark lasts at least 1.5 ttl from when it is written (MARK_LINE) and a renewal keeps the
    #: place one ttl from then: a renewal marks again once 0.4 ttl have passed since this
    #: place's last mark (every other renewal at the default RENEW_FRACTION), so the mark it
    #: wrote always outlasts the place.
    MARK_AGAIN = 0.4

    def renew(self) -> None:
        sent_at = time.monotonic()
        line = self.line
        mark = sent_at - self._marked_at >= self.MARK_AGAIN * self.ttl
        kept = ops(line.alias).renew_place(
            self.id, kind=line.kind, name=line.name, where=self.where, ttl=self.ttl, mark=mark
        )
        stats.renewals += 1
        if not kept:
            if self.attempting:
                self._gone_while_attempting = True  # judged once the attempt ends (``attempted``)
            elif self.token:
                self.mark_gone()  # handed a row, or expired: its waiter reads which
            else:
                self.mark_lost("the place expired before its renewal (the waiter was paused past its ttl)")
            raise LeaseLost(f"{self!r} is gone")
        self._deadline = sent_at + self.ttl
        if mark:
            self._marked_at = sent_at
            note_mark(line, self.where, sent_at, self.ttl)

    def remaining(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def attempted(self, granted: bool) -> None:
        """A grant with this place has been tried (``attempting``): not granted, a renewal
        meanwhile that found the place gone had found it expired."""
        self.attempting = False
        gone, self._gone_while_attempting = self._gone_while_attempting, False
        if gone and not granted:
            if self.token:
                self.mark_gone()  # or handed a row meanwhile: its waiter reads which
            else:
                self.mark_lost("the place expired before its renewal (the waiter was paused past its ttl)")

    def mark_lost(self, reason: str) -> None:
        if not self.lost:
            self.lost = True
            logger.info("%r lost: %s; taking a place at the back", self, reason)
            self._waker.wake()

    def mark_gone(self) -> None:
        """Found gone, by a renewal, where a release may have handed it a row: its waiter
        reads its grant, and only if there is none takes a place at the back (``gone``)."""
        self.gone = True
        self._waker.wake()

    def renew_in_background(self) -> float | None:
        interval = self.ttl * float(lease_settings.RENEW_FRACTION)
        step = renewal.renew_once(self, interval=interval)
        return interval if step.renewed else step.retry_in


@dataclass(frozen=True)
class Mark:
    """A mark this process's waiters wrote on every row of a line (``MARK_LINE`` without a
    ``where=``, ``MARK_NAMED``): sent at ``at`` (monotonic) for a place of ``ttl`` seconds.
    Marks only go up, and each lasts at least 1.5 ttl from when it was written."""

    at: float
    ttl: float

    @property
    def until(self) -> float:
        """Until when every row the line had then is surely marked (this machine's clock)."""
        return self.at + 1.5 * self.ttl


#: The last mark of each line written by this process (``note_mark``).
_marks: dict[Line, Mark] = {}


def note_mark(line: Line, where: str | None, sent_at: float, ttl: float) -> None:
    """A waiter of ``line`` marked its rows (the statement was sent at ``sent_at``); a
    waiter with a ``where=`` of its own marked only the rows it matches, which says nothing
    of the line's other rows."""
    if where is None and (line not in _marks or _marks[line].until < sent_at + 1.5 * ttl):
        _marks[line] = Mark(sent_at, ttl)


def marked_now(line: Line) -> bool:
    """Whether every row of ``line`` is surely marked now, by this process's own last mark
    (rows added since aside): the UNMARKED try of a newcomer would be refused."""
    mark = _marks.get(line)
    return mark is not None and time.monotonic() < mark.until


def fresh_mark(line: Line, where: str | None, ttl: float, now: float) -> float | None:
    """When this process last marked ``line``, if a place of ``ttl`` taken now need not mark it
    again: the same ttl, and less than ``Place.MARK_AGAIN`` x ttl ago, exactly as a place that
    marked then and renews now would not (so the mark outlasts the place the same way)."""
    mark = _marks.get(line)
    if where is None and mark is not None and mark.ttl == ttl and now - mark.at < Place.MARK_AGAIN * ttl:
        return mark.at
    return None


def _enter(
    line: Line,
    *,
    holder: str,
    priority: int,
    where: str | None,
    ttl: float,
    waker: Waker,
    shared: bool = False,
    handoff: bool = False,
) -> Place:
    """Take a place at the back of ``line`` (``shared``: as a reader of an rwlock; ``handoff``:
    one that a release may hand a grant of ``ttl`` seconds, where the database can); its
    renewal starts at once."""
    keeper().refuse_when_stopping("places in line")  # the process gives back what it holds
    _purge_now_and_then(line)
    sent_at = time.monotonic()
    marked_at = fresh_mark(line, where, ttl, sent_at)
    mark = marked_at is None
    engine = ops(line.alias)
    token = secrets.token_hex(16) if handoff and engine.dialect.hands_off else ""
    place = engine.enter_line(
        line.kind,
        line.name,
        holder=holder,
        priority=priority,
        where=where,
        ttl=ttl,
        shared=shared,
        mark=mark,
        channel=turn_channel(line.alias),
        grant_ttl=ttl if token else 0.0,
        token=token or None,
    )
    stats.entered += 1
    if mark:
        note_mark(line, where, sent_at, ttl)
    else:
        stats.marks_skipped += 1
    entered = Place(
        line,
        place,
        priority=priority,
        where=where,
        ttl=ttl,
        sent_at=sent_at,
        waker=waker,
        marked_at=marked_at,
        token=token,
    )
    board().add_place(line.alias, place, waker)
    renewal.renewer().add(entered)
    return entered


#: Seconds before a waiter tries again to take a place after a lock wait timeout.
ENTER_RETRY = 0.05

#: Seconds between two purges of a line's expired places by this process.
PURGE_EVERY = 10.0
#: Seconds between two purges of every line's expired places by this process (a line nobody
#: enters again is purged so).
PURGE_ALL_EVERY = 60.0
_purged: dict[Line, float] = {}
_purged_all: dict[str, float] = {}


def _purge_now_and_then(line: Line) -> None:
    """Drop the line's expired places (dead or paused waiters), at most every PURGE_EVERY
    seconds per line and process, and every line's at most every PURGE_ALL_EVERY seconds per
    alias and process: they never count, so this only keeps the table small."""
    now = time.monotonic()
    if now - _purged_all.get(line.alias, -PURGE_ALL_EVERY) >= PURGE_ALL_EVERY:
        _purged_all[line.alias] = _purged[line] = now
        ops(line.alias).purge_lines()
        return
    if now - _purged.get(line, -PURGE_EVERY) < PURGE_EVERY:
        return
    _purged[line] = now
    ops(line.alias).purge_line(line.kind, line.name)


def _look(place: Place, where: str | None, shared: bool = False) -> Look:
    stats.looks += 1
    return ops(place.line.alias).look(place.line.kind, place.line.name, turn=place.turn, where=where, shared=shared)


def waiters(line: Line, limit: int = 10) -> list[WaitingPlace]:
    """The first ``limit`` live places of ``line``, in the order they will be served."""
    return ops(line.alias).line_waiters(line.kind, line.name, limit=limit)


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
    return pause


@dataclass(frozen=True)
class Attempt:
    """Step: run the caller's grant statement with this turn; send back its result."""

    turn: Turn


@dataclass(frozen=True)
class Call:
    """Step: run this database call (a place taken, a look, ...); send back its result."""

    run: Callable[[], Any]


@dataclass(frozen=True)
class Pause:
    """Step: wait up to ``seconds`` for a wake-up; send back how many came."""

    seconds: float


Step = Attempt | Call | Pause


class Waiting:
    """One caller's wait in a line: what to do next (``steps``), apart from how statements run
    and pauses pass, so that the same decisions serve threads (``wait_in_line``) and asyncio
    (``resource_lease.aio``). ``cleanup()`` (a database call) must follow, however it ended."""

    def __init__(
        self,
        line: Line,
        *,
        timeout: float | None,
        holder: str,
        ttl: float,
        priority: int,
        where: str | None,
        waker: Waker,
        shared: bool = False,
        handoff: bool = False,
    ) -> None:
        self.line = line
        self.shared = shared
        #: Its place may be handed a grant by a release (``Wait.handoff``).
        self.handoff = handoff
        #: How the wait ended: served by a grant of its own, or by reading the grant a release
        #: handed its place (``_claim``).
        self.granted = False
        self.claimed = False
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.holder = holder
        self.ttl = ttl
        self.priority = priority
        self.where = where
        self.waker = waker
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
            self.place = _enter(
                self.line,
                holder=self.holder,
                priority=self.priority,
                where=self.where,
                ttl=self.ttl,
                waker=self.waker,
                shared=self.shared,
                handoff=self.handoff,
            )
            return self.place
        except LockWaitTimeout as exc:
            stats.enter_lock_waits += 1
            logger.warning(
                "taking a place in line %s waited out the lock wait timeout; trying again: %s", self.line, exc
            )
            return None

    def _reenter(self) -> Place | None:
        assert self.place is not None
        leaving.leave(self.place)
        self.place = None
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
        return _look(self.place, self.where, self.shared)

    def _listen(self) -> None:
        self._listening = True
        board().add((self.line.alias, self.line.kind, self.line.name), self.waker)
        listen(self.line.alias)

    def _claim(self, place: Place, row: int, grant: tuple[Any, ...] | None = None) -> Generator[Step, Any, Any]:
        """Take the grant a release handed to ``place`` (``row``: the one it named, 0: any;
        ``grant``: what the release said it granted, else it is read); none (the place had
        expired, or its grant ran out): the place is lost."""
        place.gone = False
        stats.claims += 1
        place.attempting, result = True, None
        try:
            result = yield Attempt(place.turn.claiming(row, grant))
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
        if self.timeout != 0 and marked_now(self.line):
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
                if look.free > look.ahead - look.filtered:
                    # A row this waiter may take is free, unless waiters ahead take it first
                    # (those with a where= of their own may not want it): try, the statement
                    # decides (on the rows the look listed, where it lists them).
                    try_now, candidates = True, look.free_ids
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


def wait_in_line(
    line: Line,
    attempt: Callable[[Turn], T | None],
    *,
    timeout: float | None,
    holder: str,
    ttl: float,
    priority: int = 0,
    where: str | None = None,
    waker: Waker | None = None,
    shared: bool = False,
    handoff: bool = False,
) -> T | None:
    """Call ``attempt(turn)`` until it grants (returns something other than None) or
    ``timeout`` seconds (None: for ever; 0: one attempt as a newcomer) have passed; then None.

    ``attempt`` runs the grant statement with the caller's ``turn`` in ``line`` (a newcomer
    first, then its place). ``where`` is the caller's filter as the dialect encoded it
    (``Dialect.encode_where``), for its looks. ``waker``: pass one to be able to interrupt the
    wait (``waker.wake()``; the next ``attempt`` then raises). ``shared``: the caller is a
    reader of an rwlock (its place lets readers behind it be served with it; only writers
    ahead of it count). ``handoff``: a release may hand the caller's place its row where the
    database can (``Wait.handoff``); ``attempt`` is then also called with a turn that claims
    (``Turn.claiming``), and must pass it on to ``lease.attempt_grant``. Exceptions propagate
    at once, and the place is left on the way out.

    A grant that is past its local deadline once the place has been left (a hung node held
    that statement up) is given back, and the wait goes on while its timeout lasts
    (``in_time``).
    """
    if timeout == 0:
        # One attempt as a newcomer: what ``Waiting.steps`` does for it (no place, nothing to
        # listen to or leave; a statement that could not connect raises at once), without the
        # Waker, the steps and their driver, which a caller nobody waits for need not pay for.
        grant = attempt(NEWCOMER)
        if grant is None:
            return None
        stats.at_once += 1
        return in_time(grant)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        grant = _wait_once(
            line,
            attempt,
            timeout=timeout,
            holder=holder,
            ttl=ttl,
            priority=priority,
            where=where,
            waker=waker,
            shared=shared,
            handoff=handoff,
        )
        if grant is None or in_time(grant) is not None:
            return grant
        timeout = left(deadline)
        if timeout is not None and timeout <= 0.0:
            return None


def in_time(grant: T) -> T | None:
    """``grant`` if it may still go to its caller once its wait has ended, else None: one
    past its local deadline by then is given back (``Lease.given_back_late``)."""
    late = grant.given_back_late(after="the grant, with leaving the line after it,")  # type: ignore[attr-defined]
    return None if late else grant


def left(deadline: float | None) -> float | None:
    """Seconds to ``deadline`` (None: no deadline)."""
    return None if deadline is None else deadline - time.monotonic()


def _wait_once(
    line: Line,
    attempt: Callable[[Turn], T | None],
    *,
    timeout: float | None,
    holder: str,
    ttl: float,
    priority: int,
    where: str | None,
    waker: Waker | None,
    shared: bool,
    handoff: bool,
) -> T | None:
    waiting = Waiting(
        line,
        timeout=timeout,
        holder=holder,
        ttl=ttl,
        priority=priority,
        where=where,
        waker=Waker() if waker is None else waker,
        shared=shared,
        handoff=handoff,
    )
    steps = waiting.steps()
    try:
        step = next(steps)
        while True:
            try:
                if isinstance(step, Attempt):
                    value: Any = attempt(step.turn)
                elif isinstance(step, Call):
                    value = step.run()
                else:
                    value = waiting.waker.wait(step.seconds)
            except DatabaseUnavailable as exc:
                pause = waiting.unavailable(exc)
                if pause is None:
                    raise
                waiting.waker.wait(pause)
                continue  # the same step again: it never reached the database
            if not isinstance(step, Pause):
                waiting.answered()
            step = steps.send(value)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        steps.close()
        waiting.cleanup()


@dataclass
class Wait(Generic[T]):
    """A checked call that waits in a line for a grant: ``acquire()``, ``lock()``,
    ``semaphore()`` build one (``lease.acquiring``, ``recipes.locks.locking``, ...) and ``run()``
    it; ``resource_lease.aio`` awaits the same one without blocking the event loop.

    ``attempt(turn)`` is one grant statement with the caller's turn; ``conclude(grant)``
    turns the outcome of the wait (a grant, or None when the timeout ran out) into the
    answer: announce and renew a grant, or raise the refusal (it may read the database, and
    try once more if what it would name was let go meanwhile)."""

    line: Line
    attempt: Callable[[Turn], T | None]
    conclude: Callable[[T | None], T]
    timeout: float | None
    holder: str
    ttl: float
    priority: int = 0
    where: str | None = None
    #: A reader of an rwlock (``wait_in_line``'s ``shared``).
    shared: bool = False
    #: A release may hand the caller's place its row in its own statement, where the database
    #: can (PostgreSQL): ``attempt`` passes a claiming turn on to ``lease.attempt_grant``, and
    #: the grant carries no lock delay (the hand-off writes none).
    handoff: bool = False

    def run(self, waker: Waker | None = None) -> T:
        """Wait in this thread; the answer of ``conclude``. The wait is measured
        (``metrics.waiting``: its time and outcome, and the grant's ``waited``)."""
        with metrics.waiting(self.line.kind, using=self.line.alias, holder=self.holder) as measured:
            grant = wait_in_line(
                self.line,
                self.attempt,
                timeout=self.timeout,
                holder=self.holder,
                ttl=self.ttl,
                priority=self.priority,
                where=self.where,
                waker=waker,
                shared=self.shared,
                handoff=self.handoff,
            )
            return self.finish(grant, measured)

    def finish(self, grant: T | None, measured: metrics.Wait) -> T:
        """``conclude`` the wait, the grant's time recorded before it is announced."""
        if grant is not None:
            measured.granted(grant)  # type: ignore[arg-type]
        answer = self.conclude(grant)
        if answer is not grant:
            measured.granted(answer)  # type: ignore[arg-type]  # a late attempt's grant
        return answer


def forget_lines() -> None:
    """Forget what this process remembers of its lines (its last marks, its purges): in a
    forked child (the parent's waits are not the child's), and in tests once the rows it
    marked are gone (a remembered mark would skip a newcomer's first try on new rows)."""
    _purged.clear()
    _purged_all.clear()
    _marks.clear()


at_fork(after_in_child=forget_lines)
