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
   connection per process); elsewhere the first waiter looks at its line (``LineStatements.look``,
   one indexed read) every ``LINE_POLL`` seconds and those behind it less often. Every waiter
   also looks at least every ``LINE_POLL_MAX`` and at the moment the first held row of its
   line expires (a holder that died), so a missed wake-up costs time, never the turn.
4. When it is served, gives up (timeout) or is cancelled, it leaves the line at once
   (``LEAVE_LINE``); if it cannot (the database is down), the keeper leaves it as soon as
   the database answers (``line.leaving``), or its place expires after its ttl.
5. A statement of its wait that could not even connect (``DatabaseUnavailable``: nothing
   was sent, so nothing to settle) is asked again after a pause (``BACKOFF_BASE`` doubling up
   to ``BACKOFF_MAX``) while its timeout lasts (``Waiting.unavailable``); the last refusal
   is raised once the timeout has run out. A one-attempt call (``timeout=0``) raises at once.

The rooms of this package:

- ``places``: a ``Line``, a ``Place`` in it (leased like a grant), the marks on the line's
  rows and this process's memory of them, taking a place (``enter``), purging, looking.
- ``steps``: one wait as steps (``Waiting.steps``: attempt, call, pause), sans-IO.
- ``threads``: the thread driver (``wait_in_line``) and ``Wait``, the checked call every
  entry point builds once and runs (``Wait.run``) or awaits.
- ``aio``: the asyncio driver (``arun``, ``Acquiring``), the same steps on an event loop.
- ``wakeups``: how a waiter is woken (``Waker``, the process's ``Board``, LISTEN/NOTIFY).
- ``leaving``: leaving the line, at once or by the keeper once the database answers.
- ``counters``: what this process's waiters did (``stats``).

The vendor's statements of the line are in ``resource_lease.db.line`` and
``resource_lease.db.line_operations``.
"""

from __future__ import annotations

from resource_lease.line.counters import stats
from resource_lease.line.places import Line, Place, forget_lines, fresh_mark, marked_now, waiters
from resource_lease.line.steps import Attempt, Call, Pause, Waiting
from resource_lease.line.threads import Wait, in_time, left, wait_in_line

__all__ = [
    "Attempt",
    "Call",
    "Line",
    "Pause",
    "Place",
    "Wait",
    "Waiting",
    "forget_lines",
    "fresh_mark",
    "in_time",
    "left",
    "marked_now",
    "stats",
    "wait_in_line",
    "waiters",
]
