"""The exclusion checker: a ledger of who held what, when, written by worker processes.

Each worker appends ``resource fence start_ns end_ns worker`` for every grant, where start is
taken after the grant and end before the release (CLOCK_MONOTONIC, shared by all processes on
the machine), so the recorded interval lies inside the real holding. Inside that interval it
runs a deliberately non-atomic critical section on a per-resource counter file (read, sleep,
write back). Two holders of one resource at once show up as overlapping intervals, as fences
out of order, and as a counter short of the grants.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Grant:
    resource: int
    fence: int
    start: int
    end: int
    worker: str


@dataclass
class Verdict:
    grants: int = 0
    overlaps: list[tuple[Grant, Grant]] = field(default_factory=list)
    fence_disorder: list[tuple[Grant, Grant]] = field(default_factory=list)
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
    import time

    path = directory / f"counter-{resource}"
    value = int(path.read_text()) if path.exists() else 0
    time.sleep(hold)
    # Written whole and renamed into place, so an overlapping holder reads a stale value
    # (a lost update, which the check counts), never a torn one.
    scratch = directory / f"counter-{resource}.{os.getpid()}"
    scratch.write_text(str(value + 1))
    os.replace(scratch, path)


def record(directory: Path, worker: str, grant: Grant) -> None:
    with open(directory / f"ledger-{worker}", "a") as f:
        f.write(f"{grant.resource} {grant.fence} {grant.start} {grant.end} {grant.worker}\n")


def check(directory: Path) -> Verdict:
    by_resource: dict[int, list[Grant]] = defaultdict(list)
    for path in directory.glob("ledger-*"):  # one file per worker
        for line in path.read_text().splitlines():
            rid, fence, start, end, worker = line.split()
            by_resource[int(rid)].append(Grant(int(rid), int(fence), int(start), int(end), worker))
    verdict = Verdict()
    for rid, grants in by_resource.items():
        grants.sort(key=lambda g: g.start)
        verdict.grants += len(grants)
        for before, after in zip(grants, grants[1:], strict=False):
            if after.start < before.end:
                verdict.overlaps.append((before, after))
            if after.fence <= before.fence:
                verdict.fence_disorder.append((before, after))
        counter_path = directory / f"counter-{rid}"
        counter = int(counter_path.read_text()) if counter_path.exists() else 0
        if counter != len(grants):
            verdict.lost_updates[rid] = (counter, len(grants))
    return verdict
