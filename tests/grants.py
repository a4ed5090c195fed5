"""Grants, and whether any two of them broke exclusion: the one checker of the suite.

A grant is one worker trusting one resource, under one fence, over an interval of the host's
monotonic clock (CLOCK_MONOTONIC, which every process on the machine shares, so intervals
reported by different processes compare). Exclusion held if, for every resource, its grants
in the order they started:

- never overlap: each one started at or after the previous one ended. An *overlap* is two
  workers trusting the resource at the same instant.
- carry increasing fences: each fence is above the previous one. A *fence* violation is a
  fence granted twice, or a later grant given an older fence (which would let a stale
  holder's fenced write through).

The core suite's ledger (tests/ledger.py, times in nanoseconds), the leadership ledger
(tests/leadership.py) and the fault scenarios (tests/faults/harness.py, times in seconds)
all judge their grants with ``exclusion_violations``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Grant:
    """``worker`` trusting ``resource`` under ``fence`` from ``start`` to ``end``.

    ``start`` is taken once the grant was received and ``end`` before the worker stopped
    trusting it (its release was sent, it was killed, or its local deadline passed), so the
    interval lies inside the real holding. Both are on the host's monotonic clock, in one unit
    for all the grants of one check (nanoseconds in the ledger files, seconds in the fault
    scenarios).
    """

    resource: int
    fence: int
    worker: str
    start: float
    end: float


@dataclass(frozen=True, repr=False)
class Violation:
    """Two grants of one resource, one right after the other by start, that break exclusion.

    ``kind`` is ``"overlap"``: ``after`` started before ``before`` ended (two holders at
    once); or ``"fence"``: ``after``'s fence is not above ``before``'s.
    """

    kind: Literal["overlap", "fence"]
    before: Grant
    after: Grant

    def __str__(self) -> str:
        b, a = self.before, self.after
        where = f"resource {a.resource}:"
        if self.kind == "overlap":
            return (
                f"{where} {a.worker} got fence {a.fence} at {a.start} before {b.worker} (fence {b.fence})"
                f" stopped trusting it at {b.end}"
            )
        if a.fence == b.fence:
            return f"{where} fence {a.fence} granted twice ({b.worker} at {b.start}, {a.worker} at {a.start})"
        return f"{where} fence {a.fence} ({a.worker}) granted at {a.start}, after fence {b.fence} ({b.worker}) at {b.start}"

    __repr__ = __str__  # a failed assertion lists them readably


def exclusion_violations(grants: Iterable[Grant], *, units: bool = False) -> list[Violation]:
    """Every overlap and every fence violation among ``grants``, resource by resource.

    ``units``: each grant is one unit of work, and one holding (a leadership) does many units
    under one fence. A fence may then repeat, by the worker that holds it; it must still
    never go down, nor pass to another worker unchanged.
    """
    by_resource: dict[int, list[Grant]] = {}
    for grant in grants:
        by_resource.setdefault(grant.resource, []).append(grant)
    found: list[Violation] = []
    for items in by_resource.values():
        items.sort(key=lambda g: (g.start, g.fence))
        for before, after in zip(items, items[1:], strict=False):
            if after.start < before.end:
                found.append(Violation("overlap", before, after))
            same_holding = units and after.fence == before.fence and after.worker == before.worker
            if after.fence <= before.fence and not same_holding:
                found.append(Violation("fence", before, after))
    return found
