"""The leadership checker: a ledger of leader work and of saved hand-over states.

Worker processes (tests/procs/campaigner.py, tests/procs/leader_job.py) record each unit of
leader work in the ledger of tests/ledger.py (``record_unit``: resource 0, the leadership's
fence, the unit's interval on CLOCK_MONOTONIC, shared by every process on the machine),
taken after a ``check()`` and ended before another, so it lies inside the real leadership;
and every state they saved as ``<ns> SAVED <fence> <units>`` in their event file
(``EventLog``). At most one leader at any instant shows as: no two units overlap, fences never
go down along time, one fence belongs to one worker (tests/grants.py with ``units=True``), and
the saved ``units``, in commit order (by fence), run 1, 2, 3, ... (a leader that missed its
predecessor's last state, or two leaders saving at once, repeat or skip a number).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tests import ledger
from tests.grants import Grant, Violation, exclusion_violations


@dataclass
class Verdict:
    units: int = 0
    leaderships: int = 0
    overlaps: list[Violation] = field(default_factory=list)
    fence_disorder: list[Violation] = field(default_factory=list)
    saved: list[tuple[int, int, int, str]] = field(default_factory=list)  # (ns, fence, units, worker)
    bad_sequence: list[tuple[int, int]] = field(default_factory=list)  # (expected, saved)

    @property
    def violations(self) -> int:
        return len(self.overlaps) + len(self.fence_disorder) + len(self.bad_sequence)

    def summary(self) -> str:
        return (
            f"units={self.units} leaderships={self.leaderships} saves={len(self.saved)} "
            f"overlaps={len(self.overlaps)} fence_disorder={len(self.fence_disorder)} "
            f"bad_sequence={len(self.bad_sequence)}"
        )


class EventLog:
    """A worker's event file, ``events-<worker>`` in ``directory``: one line per event,
    ``<monotonic ns> WORD fields...``."""

    def __init__(self, directory: Path, worker: str) -> None:
        self._file = open(directory / f"events-{worker}", "a", buffering=1)  # noqa: SIM115 (open until the process ends)

    def log(self, *fields: object) -> None:
        self._file.write(" ".join(str(f) for f in (time.monotonic_ns(), *fields)) + "\n")


def record_unit(directory: Path, worker: str, fence: int, start: int, end: int) -> None:
    """One unit of leader work, done from ``start`` to ``end`` (ns) under ``fence``."""
    ledger.record(directory, Grant(0, fence, worker, start, end))


def events(directory: Path) -> dict[str, list[list[str]]]:
    """Each worker's events (``events-<worker>`` files), split into fields."""
    return {
        path.name.removeprefix("events-"): [line.split() for line in path.read_text().splitlines()]
        for path in directory.glob("events-*")
    }


def check(directory: Path, killed: frozenset[str] = frozenset()) -> Verdict:
    """``killed``: workers SIGKILLed, whose last save may have committed without being logged
    (their successor then goes on from one more than their last logged save)."""
    grants = ledger.read(directory)
    found = exclusion_violations(grants, units=True)
    verdict = Verdict(
        units=len(grants),
        leaderships=len({(g.fence, g.worker) for g in grants}),
        overlaps=[v for v in found if v.kind == "overlap"],
        fence_disorder=[v for v in found if v.kind == "fence"],
    )
    for worker, lines in events(directory).items():
        verdict.saved += [(int(f[0]), int(f[2]), int(f[3]), worker) for f in lines if f[1] == "SAVED"]
    # In the order the saves committed: by fence (each leadership's saves commit before the
    # next leadership's grant, which is what fencing guarantees), then by units. Not by when
    # they were logged: a leader SIGSTOPped after its save committed and before it logged it
    # logs it on SIGCONT, after its successor's saves. A save that did commit late (a fencing
    # failure) still shows: its successor read the state without it, so a unit is saved twice.
    verdict.saved.sort(key=lambda s: (s[1], s[2], s[0]))
    last, by = 0, ""
    for _, _, units, worker in verdict.saved:
        unlogged = worker != by and by in killed
        if units != last + 1 and not (unlogged and units == last + 2):
            verdict.bad_sequence.append((last + 1, units))
        last, by = units, worker
    return verdict
