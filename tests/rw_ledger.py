"""The rwlock ledger: what readers and writers (tests/procs/rw_worker.py) recorded, judged.

A grant is (mode, fence, asked, start, end, worker), on CLOCK_MONOTONIC in nanoseconds; a grant
whose worker was killed while holding it ends at its local deadline. Exclusion held if:

- *writer overlap*: no grant, a reader's or a writer's, overlaps a writer's;
- *fence order*: fences are unique, and for every writer, the grants with a lower fence ended
  before it started and those with a higher fence started after it ended (the fence order is
  the order of the holdings);
- *torn reads*: no reader saw the counter change under it; *lost updates*: the counter equals
  the writes (a writer writes only before its deadline; a killed writer's open grant may or
  may not have written).

And no writer starvation (``overtaken``): no reader that asked after a writer took its place in
line was granted before that writer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class RwGrant:
    mode: str  # "R" or "W"
    fence: int
    asked: int
    start: int
    end: int
    worker: str
    closed: bool
    clean: bool


@dataclass
class RwVerdict:
    grants: list[RwGrant] = field(default_factory=list)
    refused: int = 0
    overlaps: list[str] = field(default_factory=list)
    fence_disorder: list[str] = field(default_factory=list)
    torn_reads: int = 0
    lost_updates: str = ""

    @property
    def writes(self) -> int:
        return sum(g.mode == "W" for g in self.grants)

    @property
    def reads(self) -> int:
        return sum(g.mode == "R" for g in self.grants)

    @property
    def violations(self) -> int:
        return len(self.overlaps) + len(self.fence_disorder) + self.torn_reads + bool(self.lost_updates)

    def summary(self) -> str:
        return (
            f"reads={self.reads} writes={self.writes} refused={self.refused} overlaps={len(self.overlaps)}"
            f" fence_disorder={len(self.fence_disorder)} torn_reads={self.torn_reads}"
            f" lost_updates={self.lost_updates or 0}"
        )


def read(directory: Path) -> tuple[list[RwGrant], int]:
    """Every grant recorded in ``directory``, and how many attempts were refused."""
    grants: list[RwGrant] = []
    refused = 0
    for path in directory.glob("rw-*"):
        opened: dict[int, list[str]] = {}
        closed: dict[int, list[str]] = {}
        for line in path.read_text().splitlines():
            parts = line.split()
            if parts[0] == "refused":
                refused += 1
            elif parts[0] == "open":
                opened[int(parts[2])] = parts
            elif parts[0] == "close":
                closed[int(parts[1])] = parts
        for fence, (_, mode, _, asked, start, deadline) in opened.items():
            close = closed.get(fence)
            end = int(close[2]) if close else int(deadline)
            clean = bool(int(close[3])) if close else True
            grants.append(RwGrant(mode, fence, int(asked), int(start), end, path.name, close is not None, clean))
    return grants, refused


def check(directory: Path) -> RwVerdict:
    grants, refused = read(directory)
    verdict = RwVerdict(grants=grants, refused=refused)
    by_fence = sorted(grants, key=lambda g: g.fence)
    for before, after in zip(by_fence, by_fence[1:], strict=False):
        if before.fence == after.fence:
            verdict.fence_disorder.append(f"fence {after.fence} granted twice")
    for writer in (g for g in grants if g.mode == "W"):
        for other in grants:
            if other is writer:
                continue
            if other.start < writer.end and writer.start < other.end:
                verdict.overlaps.append(f"{other.mode} fence {other.fence} overlaps W fence {writer.fence}")
            if other.fence < writer.fence and other.end > writer.start:
                verdict.fence_disorder.append(f"{other.mode} {other.fence} ended after W {writer.fence} started")
            if other.fence > writer.fence and other.start < writer.end:
                verdict.fence_disorder.append(f"{other.mode} {other.fence} started before W {writer.fence} ended")
    verdict.torn_reads = sum(1 for g in grants if g.mode == "R" and not g.clean)  # W: clean = wrote
    path = directory / "counter"
    value = int(path.read_text()) if path.exists() else 0
    done = sum(1 for g in grants if g.mode == "W" and g.closed and g.clean)
    maybe = sum(1 for g in grants if g.mode == "W" and not g.closed)
    if not done <= value <= done + maybe:
        verdict.lost_updates = f"counter {value}, writes {done} (+{maybe} killed)"
    return verdict


def overtaken(grants: list[RwGrant], writer: RwGrant, place_at: int) -> list[RwGrant]:
    """Readers that asked after ``writer`` had its place in line (``place_at``) and were
    granted before it."""
    return [g for g in grants if g.mode == "R" and g.asked > place_at and g.start < writer.start]
