"""``manage.py inspect_dispensers [--dispenser NAME] [--json]``

Each dispenser's counts (pending, assigned, done, failed) by the database's clock, and how
many live claims each worker holds.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db.models import Count, Min

from resource_lease.db.clock import DbNow
from resource_lease.management.commands._arguments import database_argument
from resource_lease.management.commands._base import LeaseCommand
from resource_lease.models import DispenserItem
from resource_lease.pool import database_now
from resource_lease.recipes.dispenser import dispenser_counts
from resource_lease.validation import resolve_using

STATES = ("pending", "assigned", "done", "failed")


class Command(LeaseCommand):
    help = "Show each dispenser's pending, assigned, done and failed items and its workers' claims; --json for scripts."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dispenser", help="only this dispenser")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print JSON for scripts")
        parser.add_argument("--database", type=database_argument, default=None, help="database alias")

    def handle(self, *args: Any, dispenser: str | None, as_json: bool, database: str | None, **options: Any) -> None:
        using = resolve_using(database or None, "--database")
        counts = dispenser_counts(using, name=dispenser)
        if dispenser is not None and not counts:
            names = DispenserItem.objects.using(using).values_list("dispenser", flat=True)
            # order_by(): the model orders by id too, and DISTINCT would then keep one row per item.
            known = list(names.order_by("dispenser").distinct())
            raise CommandError(
                f"there is no dispenser {dispenser!r} (dispensers: {', '.join(known) if known else 'none'})"
            )
        claims = DispenserItem.objects.using(using).filter(state=DispenserItem.ASSIGNED, expires_at__gt=DbNow())
        if dispenser is not None:
            claims = claims.filter(dispenser=dispenser)
        workers: dict[str, dict[str, dict[str, Any]]] = {}
        for row in (
            claims.values("dispenser", "worker").annotate(n=Count("id"), soonest=Min("expires_at")).order_by("worker")
        ):
            workers.setdefault(row["dispenser"], {})[row["worker"]] = {
                "claims": row["n"],
                "first_expiry": row["soonest"].isoformat().replace("+00:00", "Z"),
            }
        if as_json:
            report = {
                "database_time": database_now(using).isoformat().replace("+00:00", "Z"),
                "dispensers": {
                    name: {**c, "total": sum(c.values()), "workers": workers.get(name, {})}
                    for name, c in counts.items()
                },
            }
            self.stdout.write(json.dumps(report, indent=2))
            return
        if not counts:
            self.stdout.write("No dispenser has items: add some with `manage.py enqueue NAME FILE`.")
            return
        for name, c in counts.items():
            parts = ", ".join(f"{c[s]} {s}" for s in STATES)
            self.stdout.write(f"{name}: {sum(c.values())} items: {parts}")
            for worker, info in workers.get(name, {}).items():
                self.stdout.write(f"  {worker}: {info['claims']} claimed")
