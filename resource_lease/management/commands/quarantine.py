"""``manage.py quarantine --kind K [--name N ...] --seconds S --reason R [--dry-run] [--json]``

Take resources out of service for S seconds with a reason (required), as
``pool.quarantine``: a free resource is out of reach at once; a leased one stays with its
holder until released, and is then kept out until the quarantine ends.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser
from django.db.models import QuerySet

from resource_lease import pool
from resource_lease.display import current_holder, format_duration
from resource_lease.management.commands._arguments import reason_argument, seconds_argument
from resource_lease.management.commands._operation import OperationCommand
from resource_lease.models import Resource


class Command(OperationCommand):
    help = (
        "Take the selected resources out of service for --seconds with a --reason (both required); "
        "a leased one stays with its holder until released. --dry-run says which, --json for scripts."
    )
    action = "quarantine"
    done = "Quarantined"
    verb = "quarantine"
    skipped_because = ""

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--seconds", required=True, type=seconds_argument, help="how long (seconds > 0)")
        parser.add_argument("--reason", required=True, type=reason_argument, help="why (kept and shown)")

    def affected(self, selected: QuerySet[Resource]) -> QuerySet[Resource]:
        return selected

    def apply(self, pks: list[int], using: str, options: dict[str, Any]) -> int:
        return pool.quarantine(pks, reason=options["reason"], seconds=options["seconds"], using=using)

    def extra(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"seconds": options["seconds"], "reason": options["reason"]}

    def note(self, rows: list[Any], affected: set[int], options: dict[str, Any]) -> str:
        held = sum(1 for r in rows if current_holder(r) and r.state == pool.HELD)
        line = f"For {format_duration(options['seconds'])}: {options['reason']}"
        if held:
            line += (
                f"\n{held} {'is' if held == 1 else 'are'} leased right now: the holder keeps it until it releases"
                " (or its lease runs out), then it stays out until the quarantine ends."
            )
        return line
