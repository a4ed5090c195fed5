"""``manage.py inspect_pool [--kind K] [--state S] [--json]``

Each resource's state (free, held, expired, quarantined, disabled) by the database's clock,
its holder, fence and time left, and the counts per state of each kind.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from resource_lease.conf import lease_settings
from resource_lease.display import current_holder, format_duration, payload_url, quarantine_left, with_display_state
from resource_lease.management.commands._arguments import database_argument, kind_argument
from resource_lease.models import Resource
from resource_lease.pool import QUARANTINED, STATES, counts, database_now

COLUMNS = ("KIND", "NAME", "STATE", "HOLDER", "FENCE", "LEASE LEFT", "URL", "NOTE")
WIDEST = {"NAME": 40, "HOLDER": 40, "URL": 60, "NOTE": 60}


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _seconds(value: dt.timedelta | None) -> float | None:
    return None if value is None else round(value.total_seconds(), 3)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class Command(BaseCommand):
    help = (
        "Show each resource's state (free, held, expired, quarantined, disabled), holder, fence and "
        "time left by the database's clock, and the counts per state; --json for scripts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--kind", type=kind_argument, help="only this kind")
        parser.add_argument("--state", choices=STATES, help="only resources in this state (counts stay complete)")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print JSON for scripts")
        parser.add_argument(
            "--database", type=database_argument, default=None, help="database alias (default: the lease database)"
        )

    def handle(
        self,
        *args: Any,
        kind: str | None,
        state: str | None,
        as_json: bool,
        database: str | None,
        **options: Any,
    ) -> None:
        using = database or str(lease_settings.DATABASE)
        pool = Resource.objects.using(using).pools()
        if kind is not None:
            pool = pool.filter(kind=kind)
            if not pool.exists():
                known = sorted(set(Resource.objects.using(using).pools().values_list("kind", flat=True).distinct()))
                raise CommandError(
                    f"there are no resources of kind {kind!r} (kinds: {', '.join(known) if known else 'none'})"
                )
        per_kind = counts(pool)
        rows = with_display_state(pool).order_by("kind", "name")
        if state is not None:
            rows = rows.filter(state=state)  # type: ignore[misc]
        resources = list(rows)
        if as_json:
            self._json(resources, per_kind, using)
        else:
            self._table(resources, per_kind)

    def _json(self, resources: list[Any], per_kind: dict[str, dict[str, int]], using: str) -> None:
        report = {
            "database_time": _iso(resources[0].db_now if resources else database_now(using)),
            "counts": per_kind,
            "resources": [
                {
                    "kind": r.kind,
                    "name": r.name,
                    "state": r.state,
                    "holder": current_holder(r) or None,
                    "fence": r.fence,
                    "expires_at": _iso(r.busy_before) if current_holder(r) else None,
                    "time_left": _seconds(r.time_left),
                    "quarantined_until": _iso(r.quarantined_until) if r.state == QUARANTINED else None,
                    "quarantine_left": _seconds(quarantine_left(r)),
                    "quarantine_reason": r.quarantine_reason or None,
                    "enabled": r.enabled,
                    "url": payload_url(r) or None,
                }
                for r in resources
            ],
        }
        self.stdout.write(json.dumps(report, indent=2))

    def _table(self, resources: list[Any], per_kind: dict[str, dict[str, int]]) -> None:
        if not per_kind:
            self.stdout.write("The pool is empty: load it with `manage.py seed_proxies FILE`.")
            return
        table: list[tuple[str, ...]] = [COLUMNS]
        for r in resources:
            note = ""
            if r.state == QUARANTINED:
                note = f"quarantined {format_duration(quarantine_left(r))} more"
                note += f": {r.quarantine_reason}" if r.quarantine_reason else ""
            elif r.state == "expired":
                note = "lease ran out unreleased; free to take"
            elif r.took_over and current_holder(r):
                note = f"taken over from {r.previous_holder}"
            cells = (
                r.kind,
                r.name,
                r.state,
                current_holder(r),
                str(r.fence),
                format_duration(r.time_left),
                payload_url(r),
                note,
            )
            table.append(tuple(_clip(c, WIDEST.get(h, 1000)) for h, c in zip(COLUMNS, cells, strict=True)))
        if len(table) > 1:
            widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
            for i, row in enumerate(table):
                line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                self.stdout.write(self.style.MIGRATE_HEADING(line) if i == 0 else line)
            self.stdout.write("")
        else:
            self.stdout.write("No resource matches.\n")
        for name, states in per_kind.items():
            parts = ", ".join(f"{states[s]} {s}" for s in STATES)
            self.stdout.write(f"{name}: {states['total']} total: {parts}")
