"""The judge of a nemesis run: reads every client's history (client.py) and the nemesis's
own log of faults, and lists the violations.

- **overlap beyond capacity**: trusted intervals (``unit``) of one row by different
  processes never overlap (a lock, a lease, a leadership, a member name, a semaphore slot),
  and for a semaphore no more than ``slots`` of them at any instant;
- **fences**: along time, a row's fences never go down, and one fence belongs to one
  process (tests/grants.py, the suite's one exclusion checker, with ``units=True``);
- **two leaders**: the election's units are the overlap check of its one row, and its saved
  hand-over states, in commit order, count 1, 2, 3, ... (a save lost with a SIGKILLed leader
  excepted: its successor goes on from one more);
- **items done twice**: a dispenser key that two ``done`` calls both counted, or a claim
  fence given to two processes;
- **barrier rounds**: every member of a round saw the same cohort, of the barrier's size,
  and no member of a round was inside while a member of another round was;
- **group view**: a member that trusted its membership found itself in ``view()``;
- **waiters served**: a wait that outlasted its timeout by more than ``slack`` seconds
  (unless the client was stopped or the server down meanwhile); a client alive through the
  quiet tail of the run (``served_from``) none of whose waits ended in it (granted, or timed
  out loudly); a tail in which nothing at all was granted. (How many clients were granted
  something in the tail is a figure, ``served_in_tail``, not a verdict: under load a barrier
  member may time out loudly there, as the contract allows.)
- **unexpected errors**: an exception that is not a LeaseError.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.grants import Grant, exclusion_violations


@dataclass
class ClientHistory:
    name: str
    pid: int
    lines: list[list[str]]
    ended: bool


@dataclass
class Verdict:
    """What the checker found. ``grants``: distinct (row, fence) grants trusted; ``units``:
    trusted intervals; ``operations``: waits, saves, claims, dones, views."""

    grants: int = 0
    units: int = 0
    operations: int = 0
    losses: int = 0
    #: Clients alive through the quiet tail, and how many of them got a grant in it.
    tail_clients: int = 0
    tail_served: int = 0
    #: Grants a release handed to a waiting client (PostgreSQL), and of those how many the
    #: client took as the release's NOTIFY described them, without a read (each client's last
    #: ``line`` record, summed).
    handed: int = 0
    handed_unread: int = 0
    leaves_retried: int = 0
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    @property
    def violation_count(self) -> int:
        return sum(len(found) for found in self.violations.values())

    def add(self, kind: str, text: str) -> None:
        self.violations[kind].append(text)

    def summary(self) -> dict[str, Any]:
        return {
            "grants": self.grants,
            "units": self.units,
            "operations": self.operations,
            "losses": self.losses,
            "served_in_tail": f"{self.tail_served}/{self.tail_clients}",
            "hand_offs": f"{self.handed_unread}/{self.handed}",
            "leaves_retried": self.leaves_retried,
            "violations": self.violation_count,
            "by_kind": {kind: len(found) for kind, found in sorted(self.violations.items()) if found},
            "examples": {kind: found[:3] for kind, found in sorted(self.violations.items()) if found},
        }


def read_histories(directory: Path) -> list[ClientHistory]:
    found = []
    for path in sorted(directory.glob("history-*")):
        _, name, pid = path.name.rsplit("-", 2)
        text = path.read_text()
        lines = [line.split() for line in text.splitlines()]
        if lines and not text.endswith("\n"):
            lines.pop()  # torn by a SIGKILL
        found.append(ClientHistory(name, int(pid), lines, any(line[:1] == ["end"] for line in lines)))
    return found


@dataclass
class FaultLog:
    """The nemesis's log: when each pid was stopped, when the server was down (ns)."""

    stopped: dict[int, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    down: list[tuple[int, int]] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)

    def disturbed(self, pid: int, start: int, end: int) -> bool:
        spans = self.stopped.get(pid, []) + self.down
        return any(a < end and start < b for a, b in spans)


def check(
    directory: Path,
    *,
    primitive: str,
    faults: FaultLog,
    slots: int = 1,
    size: int = 0,
    served_from: int = 0,
    slack: float = 5.0,
) -> Verdict:
    histories = read_histories(directory)
    verdict = Verdict()
    units: list[Grant] = []
    saves: dict[str, list[tuple[int, int, int]]] = defaultdict(list)  # row: (fence, units, pid)
    unsaved: dict[str, list[int]] = defaultdict(list)  # row: fences of saves whose answer was lost
    semaphores: dict[str, list[Grant]] = defaultdict(list)
    rounds: dict[str, dict[int, list[tuple[str, int, int, int]]]] = defaultdict(lambda: defaultdict(list))
    dones: Counter[str] = Counter()
    claims: dict[tuple[str, int], set[int]] = defaultdict(set)
    for h in histories:
        served = answered = False
        handed = (0, 0, 0)  # this client's hand-offs and retried leaves, as its last "line" record says
        for line in h.lines:
            word = line[0]
            if word == "unit":
                row, fence, t0, t1 = line[1], int(line[2]), int(line[3]), int(line[4])
                units.append(Grant(_row(row), fence, str(h.pid), t0, t1))
                if len(line) > 5:
                    semaphores[line[5]].append(units[-1])
                served = served or t1 >= served_from
            elif word == "round":
                barrier, number, fence, cohort = line[1], int(line[2]), int(line[3]), line[4]
                t0, t1 = int(line[5]), int(line[6])
                rounds[barrier][number].append((cohort, h.pid, t0, t1))  # round: (cohort, pid, t0, t1)
                units.append(Grant(_row(f"round-member:{h.pid}"), fence, str(h.pid), t0, t1))
                served = served or t1 >= served_from
            elif word == "wait":
                verdict.operations += 1
                t0, t1, outcome, timeout = int(line[1]), int(line[2]), line[3], float(line[4])
                answered = answered or t1 >= served_from
                if (t1 - t0) / 1e9 > timeout + slack and not faults.disturbed(h.pid, t0, t1):
                    verdict.add("waiter_stuck", f"{h.name}/{h.pid}: a wait ({outcome}) took {(t1 - t0) / 1e9:.1f}s")
            elif word == "save":
                verdict.operations += 1
                saves[line[1]].append((int(line[2]), int(line[3]), h.pid))
            elif word == "unsaved":
                verdict.operations += 1
                unsaved[line[1]].append(int(line[2]))
            elif word == "claim":
                verdict.operations += 1
                claims[(line[1], int(line[2]))].add(h.pid)
            elif word == "done":
                verdict.operations += 1
                dones[line[1]] += int(line[3])
                served = served or int(line[4]) >= served_from
            elif word == "view":
                verdict.operations += 1
                if line[1] != "OK":
                    verdict.add("group_view", f"{h.name}/{h.pid} trusted its membership and was not in view()")
            elif word == "line":
                handed = (int(line[1]), int(line[2]), int(line[3]) if len(line) > 3 else 0)
            elif word == "loss":
                verdict.losses += 1
            elif word == "error":
                verdict.add("unexpected_error", f"{h.name}/{h.pid}: {' '.join(line[2:])}")
        verdict.handed += handed[0]
        verdict.handed_unread += handed[1]
        verdict.leaves_retried += handed[2]
        started = next((int(line[3]) for line in h.lines if line[0] == "start"), 0)
        # A client that was alive through the quiet tail (one that replaced a killed one
        # and was still starting when the tail began is not judged).
        alive_at_end = h.ended and h.pid not in faults.killed and started <= served_from
        if served_from and alive_at_end:
            verdict.tail_clients += 1
            verdict.tail_served += served
            if not answered:
                verdict.add("not_served", f"{h.name}/{h.pid}: no wait of it ended in the quiet tail of the run")

    if served_from and primitive != "dispenser" and not any(g.end >= served_from for g in units):
        verdict.add("no_progress", "nothing was granted in the quiet tail of the run")
    verdict.units = len(units)
    verdict.grants = len({(g.resource, g.fence) for g in units})
    for found in exclusion_violations(units, units=True):
        verdict.add("overlap" if found.kind == "overlap" else "fence", str(found))
    if slots > 1:
        for name, held in semaphores.items():
            for text in _over_capacity(held, slots):
                verdict.add("over_capacity", f"{name}: {text}")
    for row, saved in saves.items():
        for text in _bad_saves(saved, faults.killed, unsaved[row]):
            verdict.add("state_sequence", f"election row {row}: {text}")
    for barrier, seen in rounds.items():
        for text in _bad_rounds(seen, size):
            verdict.add("barrier_round", f"{barrier}: {text}")
    if primitive == "dispenser":
        verdict.grants = len(claims)
        for key, count in dones.items():
            if count > 1:
                verdict.add("done_twice", f"item {key} counted done {count} times")
        for (key, fence), pids in claims.items():
            if len(pids) > 1:
                verdict.add("fence", f"item {key}: claim fence {fence} given to {len(pids)} processes")
    return verdict


_ROWS: dict[str, int] = {}


def _row(text: str) -> int:
    """Rows are numbers in tests/grants.py: name the non-numeric ones (member names)."""
    if text.isdigit():
        return int(text)
    return _ROWS.setdefault(text, -1 - len(_ROWS))


def _over_capacity(units: list[Grant], slots: int) -> list[str]:
    edges = sorted(itertools.chain(((g.start, 1) for g in units), ((g.end, -1) for g in units)))
    found, inside = [], 0
    for t, step in edges:
        inside += step
        if inside > slots:
            found.append(f"{inside} holders of {slots} slots at {t}")
    return found


def _bad_saves(saves: list[tuple[int, int, int]], killed: set[int], unknown: Sequence[int] = ()) -> list[str]:
    """Each leader saves the state it read plus one. A save is only ever lost from the log
    when its leader was killed between saving and logging (at most one per term, its last),
    or when its answer was lost with the connection (``unknown``: the fences of such saves,
    logged as such; the leader may go on in the same term). So between two logged saves the
    state may jump by one more for the previous saver if it was killed, for each term between
    them that logged nothing (its leader may have saved once and died) and for each save of
    unknown outcome in those terms; anything else, and a state that does not go up, is two
    leaders' work."""
    found, last, last_fence, by = [], 0, 0, 0
    for fence, units, pid in sorted(saves):
        maybe = sum(1 for f in unknown if last_fence <= f <= fence)
        unlogged = int(pid != by and by in killed) + max(0, fence - last_fence - 1) + maybe
        if not last + 1 <= units <= last + 1 + unlogged:
            found.append(f"saved units={units} under fence {fence} after units={last}")
        last, last_fence, by = units, fence, pid
    return found


def _bad_rounds(rounds: dict[int, list[tuple[str, int, int, int]]], size: int) -> list[str]:
    found = []
    spans = []
    for number, seen in sorted(rounds.items()):
        cohorts = {cohort for cohort, _, _, _ in seen}
        if len(cohorts) > 1:
            found.append(f"round {number}: members saw different cohorts {sorted(cohorts)}")
        for cohort in cohorts:
            if size and len(cohort.split(",")) != size:
                found.append(f"round {number}: cohort of {len(cohort.split(','))}, not {size}")
        spans.append((number, min(s[2] for s in seen), max(s[3] for s in seen)))
    for (a, _, a_end), (b, b_start, _) in itertools.pairwise(spans):
        if b_start < a_end:
            found.append(f"round {b} had a member inside {(a_end - b_start) / 1e6:.1f} ms before round {a} was out")
    return found
