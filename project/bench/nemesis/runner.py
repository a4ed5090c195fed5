"""One nemesis run: clients on one primitive, the nemesis at work, then a quiet tail, then the
checker's verdict.

Timeline: the clients start and write their first line; the nemesis injects a fault every
``interval`` seconds (on average) for ``seconds``; then it wakes every stopped client, waits
until every replacement of a killed one has started, and rests for ``settle`` (2.5 ttl + 1 s: every grant of a stopped or killed client has expired)
and a quiet tail of ``heal`` seconds in which every living client must be served (a
dispenser must be drained); then the clients are told to stop (the file ``stop``) and the
histories are judged.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from django.db import connections

from project.bench.nemesis import checker
from project.bench.nemesis.failover import KINDS as FAILOVER_KINDS
from project.bench.nemesis.failover import failover_allowed
from project.bench.nemesis.faults import Nemesis, restart_allowed, skew_available

PRIMITIVES = ("lease", "lock", "semaphore", "election", "group", "barrier", "dispenser")
FAULTS = ("kill", "stop", "cut", "restart", "skew", "failover")


@dataclass
class Plan:
    primitive: str
    seconds: float
    processes: int = 6
    ttl: float = 2.0
    hold: float = 0.01
    wait: float = 2.0
    interval: float = 0.5
    restart_every: float = 60.0
    faults: tuple[str, ...] = FAULTS
    slots: int = 2
    #: Locks, semaphores, elections (clients pick one at random each time), lease pool size,
    #: barriers (clients split between them); 0: processes // 2 (semaphores: processes //
    #: 2 slots, barriers: processes // size).
    objects: int = 0
    size: int = 3
    heal: float = 0.0
    #: Seconds between the last fault and the quiet tail (default 2.5 ttl + 1: every grant
    #: of a stopped or killed client has expired by then).
    settle: float = -1.0
    patch: str = ""
    seed: int | None = None
    #: The failover fault's ways of taking the primary away, in turn (failover.KINDS).
    failover_kinds: tuple[str, ...] = FAILOVER_KINDS

    def __post_init__(self) -> None:
        if self.primitive not in PRIMITIVES:
            raise ValueError(f"primitive must be one of {', '.join(PRIMITIVES)}, got {self.primitive!r}")
        unknown = set(self.faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"faults: unknown {', '.join(sorted(unknown))}; choose from {', '.join(FAULTS)}")
        wrong = set(self.failover_kinds) - set(FAILOVER_KINDS)
        if wrong or not self.failover_kinds:
            raise ValueError(
                f"failover kinds: {', '.join(sorted(wrong)) or 'none'}; choose from {', '.join(FAILOVER_KINDS)}"
            )
        if self.primitive == "barrier" and self.processes < self.size:
            raise ValueError(f"processes: a barrier of size {self.size} needs at least {self.size}")
        if self.processes < 2:
            raise ValueError("processes: at least 2 (a race needs two)")
        if self.primitive == "barrier" and self.objects and self.processes // self.objects < self.size:
            # Clients are split between the barriers (client i enters barrier i % objects): a
            # barrier with fewer members than its size never fills, and the run reports
            # "no_progress" for a plan that could not make any.
            raise ValueError(
                f"objects: {self.objects} barriers of size {self.size} need at least"
                f" {self.objects * self.size} processes, got {self.processes}"
            )
        self.heal = self.heal or max(5.0, 3 * self.ttl)
        if self.settle < 0:
            self.settle = 2.5 * self.ttl + 1.0
        if not self.objects:
            per_object = {"barrier": self.size, "semaphore": 2 * self.slots}.get(self.primitive, 2)
            self.objects = max(1, self.processes // per_object)


@dataclass
class Report:
    primitive: str
    database: str
    seconds: float
    processes: int
    ttl: float
    elapsed: float = 0.0
    operations: int = 0
    grants: int = 0
    units: int = 0
    losses: int = 0
    served_in_tail: str = ""
    #: Hand-offs taken without a read / handed (PostgreSQL; "0/0" elsewhere).
    hand_offs: str = ""
    #: Places the clients' keepers left for waiters that could not (the database away).
    leaves_retried: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    not_injected: dict[str, str] = field(default_factory=dict)
    #: The longest time between two grants in a row, anybody's (seconds): how long the
    #: primitive stood still (a failover: from the fault to the first grant on the new primary).
    longest_pause: float = 0.0
    #: Failovers (the failover fault): seconds from each fault to a new primary accepting writes.
    failover_seconds: list[float] = field(default_factory=list)
    violations: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    directory: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        faults = " ".join(f"{k}={v}" for k, v in self.faults.items()) or "none"
        kinds = " ".join(f"{k}={v}" for k, v in self.by_kind.items())
        return (
            f"{self.primitive:<10} {self.database:<14} {self.seconds:g}s x{self.processes}: "
            f"operations={self.operations} grants={self.grants} units={self.units} losses={self.losses} "
            f"served_in_tail={self.served_in_tail} hand_offs={self.hand_offs} leaves_retried={self.leaves_retried} "
            f"longest_pause={self.longest_pause:.1f}s "
            f"faults: {faults}; violations={self.violations}{' ' + kinds if kinds else ''}"
        )


def run(plan: Plan, *, alias: str, url: str, label: str = "", keep: Path | None = None) -> Report:
    """Run ``plan`` on the database ``alias`` (this process: the nemesis's own connection)
    whose clients connect to ``url``. The histories go to a temporary directory, removed
    afterwards unless ``keep`` names one (or a violation was found: then it is kept and named)."""
    directory = keep or Path(tempfile.mkdtemp(prefix=f"nemesis-{plan.primitive}-"))
    directory.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    connection = connections[alias]
    report = Report(plan.primitive, label or connection.vendor, plan.seconds, plan.processes, plan.ttl)
    kinds = list(plan.faults)
    for kind, allowed in (("restart", restart_allowed), ("skew", skew_available), ("failover", failover_allowed)):
        why = allowed(alias) if kind in kinds else ""  # (failover_allowed asks scripts/patroni)
        if kind in kinds and why:
            kinds.remove(kind)
            report.not_injected[kind] = why
    if connection.vendor == "sqlite" and "cut" in kinds:
        kinds.remove("cut")
        report.not_injected["cut"] = "SQLite has no server sessions"
    obj = f"nemesis-{plan.primitive}-{secrets.token_hex(3)}"
    prepare(plan, alias, obj)

    env = dict(os.environ, DATABASE_URL=url, DJANGO_SETTINGS_MODULE="project.settings", RESOURCE_LEASE_AUDIT="0")
    env.pop("RESOURCE_LEASE_TEST_DB_NAME", None)
    import random

    nemesis = Nemesis(
        alias=alias,
        directory=directory,
        env=env,
        ttl=plan.ttl,
        kinds=tuple(kinds),
        restart_every=plan.restart_every,
        skew="skew" in kinds,
        rng=random.Random(plan.seed),
        failover_kinds=plan.failover_kinds,
    )
    try:
        for i in range(plan.processes):
            nemesis.spawn(f"c{i}", client_args(plan, directory, obj, i))
        nemesis.wait_for_starts()
        faults_until = time.monotonic() + plan.seconds
        while kinds and time.monotonic() < faults_until:
            time.sleep(nemesis.rng.expovariate(1 / plan.interval))
            nemesis.step()
        nemesis.wake(time.monotonic(), everyone=True)
        (directory / "drain").touch()
        nemesis.wait_for_starts()  # the replacements of the last clients killed, too
        served_from = time.monotonic() + plan.settle
        time.sleep(max(0.0, served_from - time.monotonic()) + plan.heal)
        if plan.primitive == "dispenser":
            dispenser_drain(alias, obj, plan.heal * 4)
        (directory / "stop").touch()
        hung = nemesis.finish(time.monotonic() + plan.wait + 3 * plan.ttl + 30)
    finally:
        (directory / "stop").touch()
        for proc in nemesis.procs.values():
            if proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait()

    verdict = checker.check(
        directory,
        primitive=plan.primitive,
        faults=nemesis.log,
        slots=plan.slots if plan.primitive == "semaphore" else 1,
        size=plan.size if plan.primitive == "barrier" else 0,
        served_from=int(served_from * 1e9),
    )
    for name in hung:
        verdict.add("hung", f"client {name} did not stop within its wait and 3 ttl")
    if plan.primitive == "dispenser":
        for text in dispenser_end(alias, obj, directory, len(nemesis.log.killed)):
            verdict.add("not_drained", text)
    summary = verdict.summary()
    report.operations = summary["operations"]
    report.grants, report.units, report.losses = summary["grants"], summary["units"], summary["losses"]
    report.served_in_tail = summary["served_in_tail"]
    report.hand_offs = summary["hand_offs"]
    report.leaves_retried = summary["leaves_retried"]
    report.violations, report.by_kind, report.examples = summary["violations"], summary["by_kind"], summary["examples"]
    report.faults = nemesis.summary()
    report.longest_pause = longest_pause(directory)
    report.failover_seconds = [round(made.seconds, 1) for made in nemesis.failovers]
    if "failover" in kinds and not nemesis.failovers:
        report.not_injected["failover"] = (
            f"the cluster was not whole at any of {nemesis.failover_not_whole} tries"
            f" (scripts/patroni status said last: {nemesis.failover_last_status or 'nothing'})"
        )
    report.elapsed = time.monotonic() - started
    if report.violations or keep:
        report.directory = str(directory)
    else:
        shutil.rmtree(directory, ignore_errors=True)
    return report


def longest_pause(directory: Path) -> float:
    """The longest time between two grants in a row (trusted units, barrier rounds, items
    done), anybody's, in seconds."""
    starts = []
    for history in checker.read_histories(directory):
        for line in history.lines:
            if line[0] == "unit":
                starts.append(int(line[3]))
            elif line[0] == "round":
                starts.append(int(line[5]))
            elif line[0] == "done" and line[3:4] == ["1"]:
                starts.append(int(line[4]))
    starts.sort()
    return max((b - a for a, b in zip(starts, starts[1:], strict=False)), default=0) / 1e9


def prepare(plan: Plan, alias: str, obj: str) -> None:
    """What must exist before the clients start: a lease pool (the other primitives make
    their rows on first use)."""
    from resource_lease.models import Resource

    if plan.primitive == "lease":
        pool = plan.objects
        Resource.objects.using(alias).bulk_create([Resource(kind=obj, name=f"{obj}-{i}", data={}) for i in range(pool)])


def client_args(plan: Plan, directory: Path, obj: str, index: int) -> list[str]:
    args = [
        "--primitive", plan.primitive, "--dir", str(directory), "--name", f"c{index}", "--object", obj,
        "--ttl", str(plan.ttl), "--hold", str(plan.hold), "--wait", str(plan.wait),
        "--slots", str(plan.slots), "--size", str(plan.size), "--member", f"m{index // 2}",
        "--objects", str(plan.objects), "--barrier", f"{obj}-{index % plan.objects}",
    ]  # fmt: skip
    return args + (["--patch", plan.patch] if plan.patch else [])


def dispenser_drain(alias: str, obj: str, limit: float) -> None:
    from resource_lease import Dispenser

    dispenser = Dispenser(obj, using=alias)
    end = time.monotonic() + limit
    while time.monotonic() < end:
        counts = dispenser.counts()
        if not counts.get("pending") and not counts.get("assigned"):
            return
        time.sleep(0.5)


def dispenser_end(alias: str, obj: str, directory: Path, kills: int) -> list[str]:
    """Every item put was done once: nothing pending or assigned at the end, and the items the
    database has done are those the clients counted (plus at most one per SIGKILLed client,
    whose answer it did not live to write down, and one per ``done`` whose answer a lost
    connection took: ``unknown`` in the history, a failover's), every item counted done is
    done, and every item whose ``put`` was acknowledged is still there."""
    from resource_lease import Dispenser

    counts = Dispenser(obj, using=alias).counts()
    found = []
    if counts.get("pending") or counts.get("assigned") or counts.get("failed"):
        found.append(f"left at the end: {counts}")
    logged, put, unknown = set(), set(), 0
    for history in checker.read_histories(directory):
        unknown += sum(1 for line in history.lines if line[0] == "unknown")
        logged |= {line[1] for line in history.lines if line[0] == "done" and line[3] == "1"}
        put |= {f"{line[1]}:{i}" for line in history.lines if line[0] == "put" for i in range(int(line[2]))}
    # Every item a put() acknowledged is still there (a failover that lost commits loses them).
    there = {item.key: item.state for item in Dispenser(obj, using=alias).items()}
    lost = sorted(put - set(there))
    if lost:
        found.append(f"{len(lost)} items put and acknowledged are gone, e.g. {lost[:3]}")
    undone = sorted(key for key in logged if there.get(key) != "done")
    if undone:
        found.append(f"{len(undone)} items counted done are not done in the database, e.g. {undone[:3]}")
    done = counts.get("done", 0)
    if not len(logged) <= done <= len(logged) + kills + unknown:
        found.append(
            f"the database has {done} items done, the clients counted {len(logged)}"
            f" ({kills} killed, {unknown} answers lost)"
        )
    return found
