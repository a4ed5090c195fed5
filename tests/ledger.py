"""The exclusion ledger: who held what, when, written by worker processes.

Each worker appends ``resource fence start_ns end_ns worker`` for every grant to its own
``ledger-<worker>`` file, where start is taken after the grant and end before the release
(CLOCK_MONOTONIC, shared by all processes on the machine), so the recorded interval lies
inside the real holding. Inside that interval it runs a deliberately non-atomic critical
section on a per-resource counter file (read, sleep, write back). Two holders of one resource
at once show up as overlapping intervals and fences out of order (tests/grants.py), and as a
counter short of the grants (a lost update).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.grants import Grant, Violation, exclusion_violations


@dataclass
class Verdict:
    grants: int = 0
    overlaps: list[Violation] = field(default_factory=list)
    fence_disorder: list[Violation] = field(default_factory=list)
    lost_updates: dict[int, tuple[int, int]] = field(default_factory=dict)  # resource: (counter, grants)

    @property
    def violations(self) -> int:
        return len(self.overlaps) + len(self.fence_disorder) + len(self.lost_updates)

    def summary(self) -> str:
        return (
            f"grants={self.grants} overlaps={len(self.overlaps)} fence_disorder={len(self.fence_disorder)} "
            f"lost_updates={len(self.lost_updates)}"
        )


def critical_section(directory: Path, resource: int, hold: float) -> None:
    """Read the resource's counter, wait, write it back plus one: unsafe unless exclusive."""
    path = directory / f"counter-{resource}"
    value = int(path.read_text()) if path.exists() else 0
    time.sleep(hold)
    # Written whole and renamed into place, so an overlapping holder reads a stale value
    # (a lost update, which the check counts), never a torn one.
    scratch = directory / f"counter-{resource}.{os.getpid()}"
    scratch.write_text(str(value + 1))
    os.replace(scratch, path)


def record(directory: Path, grant: Grant) -> None:
    """Append ``grant`` (times in nanoseconds) to its worker's ledger file."""
    with open(directory / f"ledger-{grant.worker}", "a") as f:
        f.write(f"{grant.resource} {grant.fence} {int(grant.start)} {int(grant.end)} {grant.worker}\n")


def work_and_record(directory: Path, worker: str, resource: int, fence: int, hold: float) -> None:
    """One grant's work: the critical section on ``resource``, then its line in the ledger."""
    start = time.monotonic_ns()
    critical_section(directory, resource, hold)
    record(directory, Grant(resource, fence, worker, start, time.monotonic_ns()))


def read(directory: Path) -> list[Grant]:
    """Every grant recorded in ``directory`` (one ledger file per worker)."""
    grants = []
    for path in directory.glob("ledger-*"):
        for line in path.read_text().splitlines():
            resource, fence, start, end, worker = line.split()
            grants.append(Grant(int(resource), int(fence), worker, int(start), int(end)))
    return grants


def check(directory: Path) -> Verdict:
    """Judge the ledger: overlaps and fences (tests/grants.py), and each counter against the
    number of grants of its resource."""
    grants = read(directory)
    found = exclusion_violations(grants)
    verdict = Verdict(
        grants=len(grants),
        overlaps=[v for v in found if v.kind == "overlap"],
        fence_disorder=[v for v in found if v.kind == "fence"],
    )
    for resource, granted in Counter(g.resource for g in grants).items():
        counter_path = directory / f"counter-{resource}"
        counter = int(counter_path.read_text()) if counter_path.exists() else 0
        if counter != granted:
            verdict.lost_updates[resource] = (counter, granted)
    return verdict
