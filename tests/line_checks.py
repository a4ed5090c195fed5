"""Whether callers were served in line: the checker of tests/test_line*.py.

Each acquisition (tests/procs/line_waiter.py) records, on the host's monotonic clock, when
the call started (``asked``), the places in line it took (``places``: id and the moment the
insert had returned, so the place was committed by then) and its grant (``fence``, and the
database's clock of the grant, ``acquired_at``).

A grant G *overtook* an acquisition J when J was already waiting in line before G's call even
started (J's first place committed before ``G.asked``), J had at least G's priority, J was
granted after G, and G's grant left no row for J: the waiters G passed so (J and any other)
were at least as many as the rows free when G was granted, G's own included. Whatever G was
(a newcomer, or a waiter that entered the line after J), the line's rule is that J goes
first: so an overtake is a violation, provided J's place stayed live (no kills or pauses in
the scenarios this is applied to). For one row (a lock) a free row is G's, so any J passed
counts. In a pool the line serves as many of its first waiters at once as it has free rows
(``statements.LINE_CLEAR``), in whatever order their statements reach the database: a waiter
behind J that is granted one of two free rows did not take J's, even if J is slow to take
the other and gets some later row. A row counts as free at a moment when no grant of it in
the histories held it then (from ``granted`` to ``released``, on the host's clock: the
narrowest bounds of the real hold, so a row is counted free rather than held when in doubt).
Grants are ordered by fence for one row (a lock) and by the database's clock of the grant for
a pool (``acquired_at``: microseconds, SQLite milliseconds; fences are per row there). Two
grants of a pool at the same instant of that clock cannot be ordered, so neither overtook
the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Acquisition:
    worker: str
    asked: float
    entered: float | None  # when its first place in line was committed; None: granted at once
    order: tuple[float, int]  # when it was granted, in grant order
    priority: int
    granted: float
    released: float
    row: int | None = None


def acquisitions(histories: Mapping[str, Sequence[Mapping[str, Any]]], *, by_fence: bool) -> list[Acquisition]:
    found = []
    for worker, history in histories.items():
        for entry in history:
            places = entry["places"]
            order = (float(entry["fence"]), 0) if by_fence else (float(entry["acquired_at"]), int(entry["fence"]))
            found.append(
                Acquisition(
                    worker=worker,
                    asked=float(entry["asked"]),
                    entered=float(places[0]["at"]) if places else None,
                    order=order,
                    priority=int(entry["priority"]),
                    granted=float(entry["granted"]),
                    released=float(entry.get("released", entry["granted"])),
                    row=entry.get("row"),
                )
            )
    found.sort(key=lambda a: a.order)
    return found


def free_rows(grants: Sequence[Acquisition], at: float, *, besides: Sequence[Acquisition] = ()) -> int:
    """How many rows the histories know were not held at the moment ``at`` (host clock), the
    grants ``besides`` left out (granted later in the database's order, whatever the host's
    clock says of the moment their statements returned)."""
    rows = {a.row for a in grants}
    held = {a.row for a in grants if a.granted <= at <= a.released and a not in besides}
    return len(rows - held)


def overtakes(grants: Sequence[Acquisition]) -> list[tuple[Acquisition, Acquisition]]:
    """Every (G, J) where grant G overtook J, which was already waiting in line (see above)."""
    found = []
    for i, g in enumerate(grants):
        passed = [
            j
            for j in grants[i + 1 :]
            if j.order[0] != g.order[0]  # granted at the same instant of the database's clock: no order
            and j.worker != g.worker
            and j.entered is not None
            and j.entered < g.asked
            and j.priority >= g.priority
        ]
        if passed and len(passed) >= free_rows(grants, g.granted - 1e-9, besides=passed):
            found.extend((g, j) for j in passed)
    return found


def describe(pairs: Sequence[tuple[Acquisition, Acquisition]]) -> str:
    """Overtakes as an assertion message: who took what when, on the host's clock."""

    def one(a: Acquisition) -> str:
        return (
            f"{a.worker} asked {a.asked:.4f} entered {a.entered} granted {a.granted:.4f}"
            f" released {a.released:.4f} row {a.row} order {a.order}"
        )

    return "; ".join(f"[{one(g)}] overtook [{one(j)}]" for g, j in pairs)


def worst_wait(grants: Sequence[Acquisition]) -> float:
    return max((a.granted - a.asked for a in grants), default=0.0)


def counts(grants: Sequence[Acquisition]) -> dict[str, int]:
    result: dict[str, int] = {}
    for a in grants:
        result[a.worker] = result.get(a.worker, 0) + 1
    return result


def jain(values: Sequence[float]) -> float:
    total, squares = sum(values), sum(v * v for v in values)
    return 1.0 if not squares else total * total / (len(values) * squares)
