"""A caller that waits in line, for the line-of-waiters tests (tests/test_line*.py).

    python -m tests.procs.line_waiter --what lock:NAME|pool:KIND|semaphore:NAME:SLOTS|rwlock-write:NAME
        [--once [--timeout T] [--again-after A] | --seconds S] [--hold H] [--ttl T] [--priority P]
        [--where JSON] [--broken | --serial | --stale-marks | --herd | --handed-deadline-at-take]
        [--heard] [--until FILE]

Prints one JSON object per line: ``{"event": "ready"}`` once connected, ``entered`` (id, at)
for each place in line it takes and has noted; with ``--once``, one
wait for a grant, then ``granted`` (after holding ``--hold`` seconds it releases and exits), or ``refused`` if
``--timeout`` passed first (``--until FILE``: released before ``--hold`` is up once FILE
exists; ``--again-after A``: then, A seconds after the release, one
more such wait);
with ``--seconds``, ask, hold, release and ask again at once until the time is up, then one
``history`` event listing every acquisition. Each acquisition records, on this machine's
monotonic clock (the same for every process): when the call started, the places in line it
took (id and when the insert had returned), when it was granted and released, the fence and
the database clock of the grant (``acquired_at``), so tests/line_checks.py can tell whether a
caller was overtaken.

``--broken``: the negative control. The grant statements ignore the line (LINE_CLEAR always
true, its parameters still consumed, and a newcomer's first try blind to the waiters' marks:
UNMARKED always true), as the engine did before there was one. ``--serial``: the negative
control of a pool's room (``statements.LINE_CLEAR``): a grant passes only if no waiter
ahead could take the row, so the line's head is served alone, one row at a time.
``--stale-marks``: the negative control of this process's memory of its marks
(``line.fresh_mark``): a place is taken without marking the line whenever this process has
marked it once, however long ago (the marks may have run out). ``--herd``: the negative
control of the turns a release tells (``wakeups``, PostgreSQL): this process's releases wake
every listening process's waiters of the line (``HERD_RELEASE``), as they did before.
``--handed-deadline-at-take``: the negative control of a handed grant's deadline (PostgreSQL):
counted from when the waiter takes it, not from when it took its place. A ``granted`` event
gives this process's wake-ups, looks and hand-offs so far (``line.stats``), and the deadline
it counts the grant by (seconds left, its safety margin added back, and when).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from resource_lease.db.line import Turn
from tests.procs import setup

#: LINE_CLEAR without its condition: its parameters are still there, the line is not.
BROKEN_LINE_CLEAR = (
    "(" + " OR ".join(["CAST({p} AS CHAR) IS NOT NULL"] * len(Turn().line_params("", ""))) + " OR {true} = {true})"
)


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def break_the_line() -> None:
    from resource_lease.db.mysql import MySQLDialect
    from resource_lease.db.postgresql import PostgreSQLDialect
    from resource_lease.db.sqlite import SQLiteDialect

    for cls in (MySQLDialect, PostgreSQLDialect, SQLiteDialect):
        cls.templates = {**cls.templates, "LINE_CLEAR": BROKEN_LINE_CLEAR, "UNMARKED": "{true} = {true}"}
    take_no_handoffs()


def take_no_handoffs() -> None:
    """This process's waiters take no grant a release would hand them (PostgreSQL's RELEASE
    hands a row to the head of its line only if the head takes hand-offs): they run their own
    grant statements, which the controls break, as the engine did before hand-offs."""
    from resource_lease.db.postgresql import PostgreSQLLine

    PostgreSQLLine.hands_off = False


#: LINE_CLEAR as it was at first (the negative control of the pool's room): no live waiter
#: ahead of the caller that the row could serve, so a pool's line serves its head only, one
#: row at a time, whatever else is free.
SERIAL_LINE_CLEAR = (
    "NOT EXISTS (SELECT 1 FROM {waiters} w WHERE w.kind = {table}.kind AND w.name = {p}"
    " AND w.expires_at > {now} AND w.id <> {p}"
    " AND (w.priority > {p} OR (w.priority = {p} AND w.id < {p})"
    " OR NOT EXISTS (SELECT 1 FROM {waiters} me WHERE me.id = {p} AND me.expires_at > {now}))"
    " AND (w.filter IS NULL OR {waiter_matches}))"
    " AND CAST({p} AS CHAR) IS NOT NULL AND CAST({p} AS CHAR) IS NOT NULL AND CAST({p} AS CHAR) IS NOT NULL"
)


def serve_the_head_only() -> None:
    from resource_lease.db.mysql import MySQLDialect
    from resource_lease.db.postgresql import PostgreSQLDialect
    from resource_lease.db.sqlite import SQLiteDialect

    for cls in (MySQLDialect, PostgreSQLDialect, SQLiteDialect):
        cls.templates = {**cls.templates, "LINE_CLEAR": SERIAL_LINE_CLEAR}
    take_no_handoffs()


#: PostgreSQL's RELEASE before turns were told: a marked row's release NOTIFYs the line channel,
#: which every process with a waiter listens on (the negative control of ``wakeups``). Its
#: first parameter (the row's id, for today's hand-off) is bound and unused; its answer has
#: RELEASE's shape (processes woken, no place handed the row).
HERD_RELEASE = (
    "WITH unused AS (SELECT CAST({p} AS bigint)), r AS (UPDATE {table} SET busy_before = {freed_at}, released_at = {now}, grant_token = ''"
    " WHERE {ours} RETURNING kind, name, line_until)"
    " SELECT (SELECT COUNT(*) FROM (SELECT pg_notify('{line_channel}', json_build_array(r.kind, r.name)::text)"
    " WHERE r.line_until > {now}) n), 0 FROM r"
)


def wake_the_herd() -> None:
    from resource_lease.db.postgresql import PostgreSQLDialect

    PostgreSQLDialect.templates = {**PostgreSQLDialect.templates, "RELEASE": HERD_RELEASE}
    take_no_handoffs()


def count_handed_from_the_take() -> None:
    """The negative control of a handed grant's deadline (``line.handoff.claim``): a grant a
    release handed to this process's place counts its ttl from when the waiter takes it, not
    from when it sent ENTER_LINE (the release may have been long before: the waiter was
    paused, or its NOTIFY late)."""
    from resource_lease.line import handoff

    claim = handoff.claim

    def at_the_take(place: Any, *args: Any, **kwargs: Any) -> Any:
        place.entered_at = time.monotonic()
        return claim(place, *args, **kwargs)

    handoff.claim = at_the_take  # type: ignore[assignment]


def trust_stale_marks() -> None:
    from resource_lease.line import places

    places.fresh_mark = lambda line_, where, ttl, now: (  # type: ignore[assignment]
        places._marks[line_].at if line_ in places._marks else None
    )


#: Wake-ups delivered to this process's waiters (``Waker.wake`` calls), whether or not the
#: waiter had paused to collect them before it was served (``stats.wakes`` counts only those
#: collected at a pause: one that comes while the waiter looks or tries is never counted).
DELIVERED = [0]


def count_deliveries() -> None:
    from resource_lease.line import wakeups

    wake = wakeups.Waker.wake

    def counted(self: Any, **kwargs: Any) -> None:
        DELIVERED[0] += 1
        wake(self, **kwargs)

    wakeups.Waker.wake = counted  # type: ignore[method-assign]


def record_places(places: list[dict[str, Any]], *, heard: bool = False) -> None:
    """Note every place this process takes (its id, and when the insert returned), and say
    when each look returned (``looked``: what a test waits for before it frees a row that
    nobody will tell the waiter about); ``heard``:
    say so only once a release's NOTIFY reaches this process (PostgreSQL's LISTEN is set up
    by its own thread, a moment after the first wait begins)."""
    from resource_lease.line import places as line_places
    from resource_lease.line import wakeups

    enter = line_places.enter

    def entering(*args: Any, **kwargs: Any) -> Any:
        place = enter(*args, **kwargs)
        places.append({"id": place.id, "at": time.monotonic()})
        deadline = time.monotonic() + 30
        while heard and not wakeups.pushed(place.line.alias) and time.monotonic() < deadline:
            time.sleep(0.01)
        emit("entered", **places[-1])
        return place

    line_places.enter = entering  # type: ignore[assignment]
    look = line_places.look

    def looking(*args: Any, **kwargs: Any) -> Any:
        seen = look(*args, **kwargs)
        emit("looked", live=seen.live, free=seen.free, at=time.monotonic())
        return seen

    line_places.look = looking  # type: ignore[assignment]


def take(what: str, args: argparse.Namespace) -> Any:
    from resource_lease import acquire, lock, rwlock, semaphore

    family, _, rest = what.partition(":")
    common = {"ttl": args.ttl, "timeout": args.timeout, "priority": args.priority}
    if family == "lock":
        return lock(rest, auto_renew=True, **common)
    if family == "rwlock-write":
        return rwlock(rest).write(auto_renew=True, **common)
    if family == "semaphore":
        name, _, slots = rest.rpartition(":")
        return semaphore(name, int(slots), auto_renew=True, **common)
    where = None if args.where is None else json.loads(args.where)
    return acquire(rest, auto_renew=True, where=where, **common)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--what", required=True)
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--seconds", type=float, default=0.0)
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--ttl", type=float, default=30.0)
    parser.add_argument("--priority", type=int, default=0)
    parser.add_argument("--broken", action="store_true")
    parser.add_argument("--serial", action="store_true", help="a pool's line serves its head only")
    parser.add_argument("--where", help="a JSON object: acquire(where=...)")
    parser.add_argument("--timeout", type=float, help="with --once: give up after this (default: wait)")
    parser.add_argument("--again-after", type=float, help="with --once: wait once more, this long after the release")
    parser.add_argument("--stale-marks", action="store_true", help="trust this process's marks however old")
    parser.add_argument("--herd", action="store_true", help="releases wake every listening process (PostgreSQL)")
    parser.add_argument("--until", help="release before --hold is up once this file exists")
    parser.add_argument("--heard", action="store_true", help="'entered' once this process hears releases")
    parser.add_argument(
        "--handed-deadline-at-take", action="store_true", help="a handed grant's ttl counts from its take"
    )
    args = parser.parse_args()
    setup()
    if args.broken:
        break_the_line()
    if args.serial:
        serve_the_head_only()
    if args.stale_marks:
        trust_stale_marks()
    if args.herd:
        wake_the_herd()
    if args.handed_deadline_at_take:
        count_handed_from_the_take()
    from resource_lease import LockHeld, NoResourceAvailable
    from resource_lease.db.connections import lease_connection
    from resource_lease.lease import safety_margin

    lease_connection("default").cursor().close()
    places: list[dict[str, Any]] = []
    record_places(places, heard=args.heard)
    count_deliveries()
    emit("ready")
    history = []
    stop = time.monotonic() + args.seconds
    while True:
        asked = time.monotonic()
        places.clear()
        try:
            lease = take(args.what, args)
        except (NoResourceAvailable, LockHeld):
            emit("refused", asked=asked, places=list(places))
            return
        granted = time.monotonic()
        # The deadline this process counts the grant by (its safety margin added back), and when.
        deadline_left, deadline_at = lease.remaining() + safety_margin(lease.ttl), time.monotonic()
        entry = {
            "asked": asked,
            "places": list(places),
            "granted": granted,
            "fence": lease.fence,
            "row": lease.resource.pk,
            "acquired_at": lease.resource.acquired_at.timestamp(),
            "priority": args.priority,
        }
        if args.once:
            from resource_lease.line import stats

            emit(
                "granted",
                wakes=stats.wakes,
                delivered=DELIVERED[0],
                looks=stats.looks,
                handed=stats.handed,
                unread=stats.handed_unread,
                data=lease.resource.data,
                deadline_left=deadline_left,
                deadline_at=deadline_at,
                **entry,
            )
        held_until = time.monotonic() + args.hold
        while time.monotonic() < held_until and not (args.until and os.path.exists(args.until)):
            time.sleep(min(0.05, max(0.0, held_until - time.monotonic())))
        entry["released"] = time.monotonic()
        lease.release()
        history.append(entry)
        if args.once and args.again_after is not None:
            time.sleep(args.again_after)
            args.again_after = None
            continue
        if args.once or time.monotonic() >= stop:
            break
    if not args.once:
        emit("history", acquisitions=history)


if __name__ == "__main__":
    main()
