"""``manage.py inspect_groups [--group G] [--json]``

Every group with its live members (holder, time left, data) and every barrier with its round,
frozen cohort, who of it is still inside and who waits for the next round, by the database's
clock.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.core.management.base import CommandParser

from resource_lease.management.commands._arguments import database_argument
from resource_lease.management.commands._base import LeaseCommand
from resource_lease.recipes.barrier import barriers
from resource_lease.recipes.groups import groups
from resource_lease.validation import resolve_using


def _iso(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


class Command(LeaseCommand):
    help = "Show groups with their live members and barriers with who is inside; --json for scripts."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", dest="as_json", help="print JSON for scripts")
        parser.add_argument(
            "--database", type=database_argument, default=None, help="database alias (default: the lease database)"
        )

    def handle(self, *args: Any, as_json: bool, database: str | None, **options: Any) -> None:
        using = resolve_using(database or None, "--database")
        group_list = groups(using)
        barrier_list = barriers(using)
        if as_json:
            report = {
                "groups": [
                    {
                        "name": g["name"],
                        "size": len(g["members"]),
                        "members": [
                            {**m, "expires_at": _iso(m["expires_at"]), "time_left": round(m["time_left"], 3)}
                            for m in g["members"]
                        ],
                    }
                    for g in group_list
                ],
                "barriers": barrier_list,
            }
            self.stdout.write(json.dumps(report, indent=2))
            return
        if not group_list and not barrier_list:
            self.stdout.write("No group or barrier has been used yet.")
            return
        for g in group_list:
            self.stdout.write(self.style.MIGRATE_HEADING(f"group {g['name']}: {len(g['members'])} live members"))
            for i, m in enumerate(g["members"]):
                data = json.dumps(m["data"], ensure_ascii=False)
                self.stdout.write(
                    f"  {i}  {m['member']}  holder {m['holder']}  fence {m['fence']}"
                    f"  {m['time_left']:.1f}s left  {data}"
                )
        for b in barrier_list:
            inside = ", ".join(b["inside"]) or "all left"
            self.stdout.write(self.style.MIGRATE_HEADING(f"barrier {b['name']}: round {b['round']}"))
            self.stdout.write(f"  cohort: {', '.join(b['cohort']) or '-'}")
            self.stdout.write(f"  inside: {inside}")
            self.stdout.write(f"  waiting for the next round: {', '.join(b['waiting']) or '-'}")
