"""``manage.py nemesis --primitive lock --seconds 60 [--processes 6] [--database URL ...]``

Many processes use one primitive while a nemesis SIGKILLs and SIGSTOPs them, ends their
database sessions, restarts the server (unless RESOURCE_LEASE_FAULTS_NO_RESTART is set) and
moves their wall clocks; a checker judges the history. Prints one line per primitive and
database (operations, faults injected by type, violations); exits 1 if any violation was
found. docs/jepsen.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from project.arguments import names, positive, positive_int
from project.bench.nemesis.failover import KINDS as FAILOVER_KINDS
from project.bench.nemesis.runner import FAULTS, PRIMITIVES, Plan, run
from project.bench.targets import resolve, url_from_alias


def _primitives(text: str) -> list[str]:
    return list(names(text, PRIMITIVES, "primitive", every="all"))


def _faults(text: str) -> list[str]:
    return list(names(text, FAULTS, "fault"))


def _failover_kinds(text: str) -> list[str]:
    return list(names(text, FAILOVER_KINDS, "failover kind"))


class Command(BaseCommand):
    help = "Use a primitive from many processes under a nemesis (kills, pauses, cut sessions, restarts, skewed clocks) and judge the history."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--primitive",
            type=_primitives,
            required=True,
            help=f"one or more of {','.join(PRIMITIVES)} (comma-separated), or all",
        )
        parser.add_argument("--seconds", type=positive, required=True, help="how long the nemesis works")
        parser.add_argument("--processes", type=positive_int, default=6)
        parser.add_argument(
            "--database",
            action="append",
            help="an alias of DATABASES or a URL (mysql://, postgres://, sqlite:///); repeatable; default: default",
        )
        parser.add_argument(
            "--objects",
            type=positive_int,
            default=0,
            help="locks, semaphores, elections, groups or barriers (the lease: its pool size); "
            "default processes / 2 (semaphores: processes / 2 slots; barriers: processes / size)",
        )
        parser.add_argument("--ttl", type=positive, default=2.0)
        parser.add_argument("--hold", type=positive, default=0.01, help="seconds of work per trusted unit")
        parser.add_argument("--interval", type=positive, default=0.5, help="mean seconds between faults")
        parser.add_argument(
            "--restart-every",
            type=positive,
            default=60.0,
            help="seconds between server restarts, and between failovers",
        )
        parser.add_argument(
            "--failover-kinds",
            type=_failover_kinds,
            default=list(FAILOVER_KINDS),
            help=f"the failover fault's ways, in turn: {','.join(FAILOVER_KINDS)} (a Patroni cluster: docs/ha.md)",
        )
        parser.add_argument("--faults", type=_faults, default=list(FAULTS), help=",".join(FAULTS))
        parser.add_argument("--seed", type=int, default=None)
        parser.add_argument("--keep", type=Path, default=None, help="keep the histories in this directory")
        parser.add_argument("--json", action="store_true", help="print the reports as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        primitives = options["primitive"]
        plans = {}
        for primitive in primitives:  # every plan checked before a database is touched
            try:
                plans[primitive] = Plan(
                    primitive=primitive,
                    seconds=options["seconds"],
                    processes=options["processes"],
                    ttl=options["ttl"],
                    hold=options["hold"],
                    interval=options["interval"],
                    restart_every=options["restart_every"],
                    faults=tuple(options["faults"]),
                    seed=options["seed"],
                    objects=options["objects"],
                    failover_kinds=tuple(options["failover_kinds"]),
                )
            except ValueError as exc:
                raise CommandError(f"--primitive {primitive}: {exc}") from exc
        targets = []
        for item in options["database"] or ["default"]:
            try:
                target = resolve(item)
                target.describe()
                if "://" in item:  # a database of its own: make the tables if need be
                    call_command("migrate", "resource_lease", database=target.alias, verbosity=0)
            except (ValueError, DatabaseError) as exc:
                raise CommandError(f"--database {item}: {exc}") from exc
            targets.append(target)
        reports = []
        for target in targets:
            url = target.url or url_from_alias(target.alias)
            for primitive, plan in plans.items():
                keep = options["keep"] / f"{target.key}-{primitive}" if options["keep"] else None
                report = run(plan, alias=target.alias, url=url, label=target.label, keep=keep)
                reports.append(report)
                if not options["json"]:
                    self.stdout.write(report.line())
                    for kind, why in report.not_injected.items():
                        self.stdout.write(f"  not injected: {kind} ({why})")
                    for kind, examples in report.examples.items():
                        for example in examples:
                            self.stdout.write(f"  {kind}: {example}")
                    if report.directory:
                        self.stdout.write(f"  histories: {report.directory}")
        if options["json"]:
            self.stdout.write(json.dumps([r.as_dict() for r in reports], indent=1))
        bad = sum(r.violations for r in reports)
        if bad:
            raise CommandError(f"{bad} violations")
