"""``manage.py inspect_pool [--kind K] [--state S] [--where KEY=VALUE ...] [--json] [--watch [--interval S]]``

Each resource's state (free, held, expired, quarantined, disabled) by the database's clock,
its holder, fence and time left, its health (error score, backoff level: ``lease.report``), its
cooldowns per target and its live session bindings, the counts per state of each kind, and who waits in each
kind's line (place, holder, priority, since when, where=). ``--where region=eu`` lists only
the resources whose data holds that value (as ``acquire(where=...)`` compares it); the keys
of ``DATA_KEYS`` and of ``--where`` are columns (``data`` in the JSON), never ``url``'s
password. ``--watch`` shows it
again every ``--interval`` seconds (a refreshing view on a terminal; one report after another
in a pipe, one JSON document per line with ``--json``) until Ctrl-C, which ends it cleanly.
Coordination rows (kinds starting with ``@``) are not part of any pool and are not shown.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

from django.core.management.base import CommandError, CommandParser

from resource_lease import health, sessions, targets
from resource_lease.conf import lease_settings
from resource_lease.display import current_holder, format_duration, payload_url, quarantine_left, with_display_state
from resource_lease.management.commands._arguments import (
    database_argument,
    interval_argument,
    kind_argument,
    pool_resources,
    where_argument,
)
from resource_lease.management.commands._base import LeaseCommand
from resource_lease.models.api import http_token_name, is_http_holder
from resource_lease.pool import QUARANTINED, STATES, counts, database_now, waiting
from resource_lease.validation import resolve_using, where_matches

COLUMNS = ("KIND", "NAME", "STATE", "HOLDER", "FENCE", "LEASE LEFT", "HEALTH", "URL", "NOTE")
WIDEST = {"NAME": 40, "HOLDER": 40, "URL": 60, "NOTE": 60}


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _seconds(value: dt.timedelta | None) -> float | None:
    return None if value is None else round(value.total_seconds(), 3)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _value(resource: Any, key: str) -> Any:
    """``data[key]`` of a resource (None when absent)."""
    return resource.data.get(key) if isinstance(resource.data, dict) else None


def _text(resource: Any, key: str) -> str:
    """``data[key]`` for the table: a string as it is, anything else as JSON, "" when absent."""
    if not isinstance(resource.data, dict) or key not in resource.data:
        return ""
    value = resource.data[key]
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _health(resource: Any) -> str:
    """The error score and, while it backs off, the backoff level (``lease.report``)."""
    if not resource.health_score and not resource.backoff_level:
        return ""
    level = f" L{resource.backoff_level}" if resource.backoff_level else ""
    return f"{resource.health_score:.3g}{level}"


#: Moves the cursor home and clears the screen: each refresh of --watch replaces the last.
CLEAR = "\x1b[H\x1b[2J"


class Command(LeaseCommand):
    help = (
        "Show each resource's state (free, held, expired, quarantined, disabled), holder, fence and "
        "time left by the database's clock, and the counts per state; --json for scripts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--kind", type=kind_argument, help="only this kind")
        parser.add_argument("--state", choices=STATES, help="only resources in this state (counts stay complete)")
        parser.add_argument(
            "--where",
            type=where_argument,
            action="append",
            metavar="KEY=VALUE",
            help="only resources whose data holds this value (repeatable; a number, true, false or null as JSON,"
            " else text); counts stay complete",
        )
        parser.add_argument("--json", action="store_true", dest="as_json", help="print JSON for scripts")
        parser.add_argument(
            "--database", type=database_argument, default=None, help="database alias (default: the lease database)"
        )
        parser.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
        parser.add_argument(
            "--interval",
            type=interval_argument,
            default=2.0,
            help="seconds between refreshes with --watch (default 2)",
        )

    cooldowns: dict[int, list[dict[str, Any]]]
    bindings: dict[int, list[str]]

    def handle(
        self,
        *args: Any,
        kind: str | None,
        state: str | None,
        as_json: bool,
        database: str | None,
        watch: bool = False,
        interval: float = 2.0,
        where: list[tuple[str, Any]] | None = None,
        **options: Any,
    ) -> None:
        using = resolve_using(database or None, "--database")
        self.where = dict(where or [])
        if len(self.where) != len(where or []):
            raise CommandError("--where names a key twice")
        keys = [*lease_settings.DATA_KEYS, *self.where]
        self.keys = [key for i, key in enumerate(keys) if key != "url" and key not in keys[:i]]
        if not watch:
            self.show(using, kind, state, as_json)
            return
        terminal = self.stdout.isatty() and not as_json
        try:
            while True:
                if terminal:
                    self.stdout.write(CLEAR, ending="")
                if not as_json:
                    now = database_now(using).strftime("%Y-%m-%d %H:%M:%S")
                    self.stdout.write(f"Pool at {now} UTC (database clock), every {interval:g}s; Ctrl-C stops.\n")
                self.show(using, kind, state, as_json, compact=True)
                if not as_json and not terminal:
                    self.stdout.write("")
                self.stdout.flush()
                time.sleep(interval)
        except KeyboardInterrupt:
            # Ctrl-C is how a watch ends: no traceback, a clean line and status 0.
            if not as_json:
                self.stdout.write("")

    def show(self, using: str, kind: str | None, state: str | None, as_json: bool, *, compact: bool = False) -> None:
        pool = pool_resources(using)
        if kind is not None:
            every_kind = pool
            pool = pool.filter(kind=kind)
            if not pool.exists():
                known = sorted(set(every_kind.values_list("kind", flat=True).distinct()))
                raise CommandError(
                    f"there are no resources of kind {kind!r} (kinds: {', '.join(known) if known else 'none'})"
                )
        per_kind = counts(pool)
        rows = with_display_state(pool).order_by("kind", "name")
        if state is not None:
            rows = rows.filter(state=state)  # type: ignore[misc]
        resources = [r for r in rows if where_matches(self.where, r.data)]
        lines = {k: line for k, line in waiting(kind, using=using).items() if k in per_kind}
        pks = [r.pk for r in resources]
        self.cooldowns = targets.live_cooldowns(pks, using)
        idle = {k: health.policy_of(using, k).session_idle for k in per_kind}
        self.bindings = sessions.live_bindings(pks, using, idle)
        if as_json:
            self._json(resources, per_kind, lines, using, compact=compact)
        else:
            self._table(resources, per_kind)
            self._lines(lines)

    def _json(
        self,
        resources: list[Any],
        per_kind: dict[str, dict[str, int]],
        lines: dict[str, list[Any]],
        using: str,
        *,
        compact: bool,
    ) -> None:
        report = {
            "database_time": _iso(resources[0].db_now if resources else database_now(using)),
            "counts": per_kind,
            "waiting": {
                kind: [
                    {
                        "place": w.place,
                        "holder": w.holder,
                        "priority": w.priority,
                        "since": _iso(w.since),
                        "waited": _seconds(w.waited),
                        "place_expires_at": _iso(w.expires_at),
                        "where": w.where,
                    }
                    for w in line
                ]
                for kind, line in lines.items()
            },
            "resources": [
                {
                    "kind": r.kind,
                    "name": r.name,
                    "state": r.state,
                    "holder": current_holder(r) or None,
                    "over_http": is_http_holder(current_holder(r)),
                    "fence": r.fence,
                    "expires_at": _iso(r.busy_before) if current_holder(r) else None,
                    "time_left": _seconds(r.time_left),
                    "quarantined_until": _iso(r.quarantined_until) if r.state == QUARANTINED else None,
                    "quarantine_left": _seconds(quarantine_left(r)),
                    "quarantine_reason": r.quarantine_reason or None,
                    "health_score": r.health_score,
                    "backoff_level": r.backoff_level,
                    "cooldowns": [
                        {"target": c["target"], "until": _iso(c["until"]), "left": _seconds(c["left"])}
                        for c in self.cooldowns.get(r.pk, [])
                    ],
                    "sessions": self.bindings.get(r.pk, []),
                    "enabled": r.enabled,
                    "url": payload_url(r) or None,
                    **({"data": {key: _value(r, key) for key in self.keys}} if self.keys else {}),
                }
                for r in resources
            ],
        }
        # --watch --json: one document per line, for a reader that parses line by line.
        self.stdout.write(json.dumps(report) if compact else json.dumps(report, indent=2))

    def _table(self, resources: list[Any], per_kind: dict[str, dict[str, int]]) -> None:
        if not per_kind:
            self.stdout.write(
                "The pool is empty: load it with `manage.py seed_proxies FILE` (or `seed_resources FILE --kind K`)."
            )
            return
        # The DATA_KEYS and --where keys, before the URL.
        at = COLUMNS.index("URL")
        headers = (*COLUMNS[:at], *(key.upper() for key in self.keys), *COLUMNS[at:])
        table: list[tuple[str, ...]] = [headers]
        for r in resources:
            note = ""
            if r.state == QUARANTINED:
                note = f"quarantined {format_duration(quarantine_left(r))} more"
                note += f": {r.quarantine_reason}" if r.quarantine_reason else ""
            elif r.state == "expired":
                note = "lease ran out unreleased; free to take"
            elif r.took_over and current_holder(r):
                note = f"taken over from {r.previous_holder}"
            elif is_http_holder(current_holder(r)):
                note = f"leased over HTTP (token {http_token_name(current_holder(r))})"
            cooling = self.cooldowns.get(r.pk, [])
            if cooling:
                first = cooling[0]
                more = f" (+{len(cooling) - 1} more)" if len(cooling) > 1 else ""
                note += ("; " if note else "") + f"cooling for {first['target']} {format_duration(first['left'])}{more}"
            bound = self.bindings.get(r.pk, [])
            if bound:
                note += ("; " if note else "") + f"sessions: {', '.join(bound[:3])}{'…' if len(bound) > 3 else ''}"
            shown = [_text(r, key) for key in self.keys]
            cells = (
                r.kind,
                r.name,
                r.state,
                current_holder(r),
                str(r.fence),
                format_duration(r.time_left),
                _health(r),
                *shown,
                payload_url(r),
                note,
            )
            table.append(
                tuple(
                    _clip(c, WIDEST.get(h, 1000 if h in COLUMNS else 40)) for h, c in zip(headers, cells, strict=True)
                )
            )
        if len(table) > 1:
            widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
            for i, row in enumerate(table):
                line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                self.stdout.write(self.style.MIGRATE_HEADING(line) if i == 0 else line)
            self.stdout.write("")
        else:
            self.stdout.write("No resource matches.\n")
        for name, states in per_kind.items():
            parts = ", ".join(f"{states[s]} {s}" for s in STATES)
            self.stdout.write(f"{name}: {states['total']} total: {parts}")

    def _lines(self, lines: dict[str, list[Any]]) -> None:
        """Who waits in each kind's line, in the order they will be served."""
        for kind, line in lines.items():
            self.stdout.write("")
            self.stdout.write(self.style.MIGRATE_HEADING(f"Waiting for {kind}: {len(line)} in line"))
            for w in line:
                priority = f", priority {w.priority}" if w.priority else ""
                where = f", where {json.dumps(w.where)}" if w.where else ""
                self.stdout.write(
                    f"  {w.place}. {_clip(w.holder, 60)}, waiting {format_duration(w.waited)}{priority}{where}"
                )
