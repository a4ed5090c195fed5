"""``manage.py inspect_locks [--json] [--database ALIAS]``

Named locks, semaphores, rate limits, read/write locks and leader elections, by the database's
clock: who holds each lock, its fence and time left; each semaphore's slots in force and its
holders; each rate limit's n, slots used in the current window and when the first frees;
each rwlock's writer, or its readers (how many, the last granted); each election's
leader, fence, time left and hand-over state. ``inspect_pool`` shows the pools.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.core.management.base import CommandParser

from resource_lease.display import current_holder, format_duration, lock_delay_until, with_display_state
from resource_lease.management.commands._arguments import database_argument
from resource_lease.management.commands._base import LeaseCommand
from resource_lease.models import COORDINATION_PREFIX, ElectionRow, LockRow, Resource, RwLockRow, SemaphoreSlot
from resource_lease.pool import DISABLED, HELD, database_now
from resource_lease.validation import resolve_using

SEMAPHORE_PREFIX = f"{COORDINATION_PREFIX}semaphore:"
RATE_LIMIT_PREFIX = f"{COORDINATION_PREFIX}ratelimit:"


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _seconds(value: dt.timedelta | None) -> float | None:
    return None if value is None else round(value.total_seconds(), 3)


def _grant(row: Any) -> dict[str, Any]:
    """Who holds a row and until when (``holder`` None when nobody does: free or expired)."""
    live = row.time_left is not None  # annotated only for a live grant (even of a retired slot)
    return {
        "state": HELD if live else row.state,
        "holder": current_holder(row) if live else None,
        "fence": row.fence,
        "expires_at": _iso(row.busy_before) if live else None,
        "time_left": _seconds(row.time_left),
        "took_over_from": row.previous_holder if live and row.took_over else None,
        "lock_delay_until": _iso(lock_delay_until(row)),
    }


def _rw_mode(row: Any) -> dict[str, Any]:
    """An rwlock's mode: held by a writer, or by ``readers`` readers (the holder: the last)."""
    if row.time_left is None:
        return {"mode": None, "readers": 0}
    return {"mode": "read" if row.readers else "write", "readers": row.readers}


def report(using: str) -> dict[str, Any]:
    """Every lock, semaphore and election as JSON-ready data, read on ``using``."""
    locks: list[Any] = list(with_display_state(LockRow.objects.using(using)).order_by("name"))
    slots: list[Any] = list(with_display_state(SemaphoreSlot.objects.using(using)).order_by("kind", "name"))
    rwlocks: list[Any] = list(with_display_state(RwLockRow.objects.using(using)).order_by("name"))
    elections: list[Any] = list(with_display_state(ElectionRow.objects.using(using)).order_by("name"))
    now = next((r.db_now for r in (*locks, *slots, *rwlocks, *elections)), None) or database_now(using)
    limits: dict[str, dict[str, Any]] = {}
    rate_slots = Resource.objects.using(using).filter(kind__startswith=RATE_LIMIT_PREFIX).order_by("kind", "name")
    for row in rate_slots:
        key = row.kind[len(RATE_LIMIT_PREFIX) :]
        entry = limits.setdefault(key, {"key": key, "n": 0, "used": 0, "next_free_at": None})
        entry["n"] += 1 if row.enabled else 0
        if row.busy_before > now:  # granted within its last ``per`` seconds
            entry["used"] += 1
            first = entry["next_free_at"]
            entry["next_free_at"] = row.busy_before if first is None else min(first, row.busy_before)
    semaphores: dict[str, dict[str, Any]] = {}
    for row in slots:
        name = row.kind[len(SEMAPHORE_PREFIX) :]
        entry = semaphores.setdefault(name, {"name": name, "slots": 0, "held": 0, "holders": []})
        retired = row.state == DISABLED
        entry["slots"] += 0 if retired else 1
        if row.time_left is not None:  # a live grant, of a retired slot or not
            entry["held"] += 1
            entry["holders"].append({"slot": int(row.name), "retired": retired, **_grant(row)})
    return {
        "database_time": _iso(now),
        "locks": [{"name": row.name, **_grant(row)} for row in locks],
        "semaphores": list(semaphores.values()),
        "rate_limits": [{**e, "next_free_at": _iso(e["next_free_at"])} for e in limits.values()],
        "rwlocks": [{"name": row.name, **_grant(row), **_rw_mode(row)} for row in rwlocks],
        "elections": [
            {"name": row.name, **_grant(row), "leader": _grant(row)["holder"], "state_data": row.data}
            for row in elections
        ],
    }


class Command(LeaseCommand):
    help = (
        "Show named locks (holder, fence, time left), semaphores (slots, holders), rate limits (n, used), "
        "read/write locks "
        "(writer or readers) and leader "
        "elections (leader, fence, time left, hand-over state) by the database's clock; --json for scripts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", dest="as_json", help="print JSON for scripts")
        parser.add_argument(
            "--database", type=database_argument, default=None, help="database alias (default: the lease database)"
        )

    def handle(self, *args: Any, as_json: bool, database: str | None, **options: Any) -> None:
        data = report(resolve_using(database or None, "--database"))
        if as_json:
            self.stdout.write(json.dumps(data, indent=2))
            return
        self._section(
            "Locks",
            ("NAME", "STATE", "HOLDER", "FENCE", "LEFT"),
            [(e["name"], e["state"], e["holder"] or "", str(e["fence"]), _left(e)) for e in data["locks"]],
        )
        semaphore_rows = []
        for sem in data["semaphores"]:
            holders = ", ".join(
                f"{h['slot']}:{h['holder']} ({format_duration(h['time_left'])}{', retired' if h['retired'] else ''})"
                for h in sem["holders"]
            )
            semaphore_rows.append((sem["name"], str(sem["slots"]), str(sem["held"]), holders or "-"))
        self._section("Semaphores", ("NAME", "SLOTS", "HELD", "HOLDERS (slot:holder, time left)"), semaphore_rows)
        self._section(
            "Rate limits",
            ("KEY", "N", "USED", "NEXT FREE"),
            [(e["key"], str(e["n"]), str(e["used"]), e["next_free_at"] or "-") for e in data["rate_limits"]],
        )
        self._section(
            "RW locks",
            ("NAME", "STATE", "MODE", "HOLDER", "FENCE", "LEFT"),
            [
                (
                    e["name"],
                    e["state"],
                    "-" if e["mode"] is None else "write" if e["mode"] == "write" else f"read ({e['readers']})",
                    e["holder"] or "",
                    str(e["fence"]),
                    _left(e),
                )
                for e in data["rwlocks"]
            ],
        )
        self._section(
            "Elections",
            ("NAME", "STATE", "LEADER", "FENCE", "LEFT", "HAND-OVER STATE"),
            [
                (
                    e["name"],
                    e["state"],
                    e["leader"] or "",
                    str(e["fence"]),
                    _left(e),
                    _clip(json.dumps(e["state_data"])),
                )
                for e in data["elections"]
            ],
        )
        self.stdout.write(f"(database clock: {data['database_time']})")

    def _section(self, title: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"{title}: {len(rows)}"))
        if not rows:
            self.stdout.write("  none\n")
            return
        table = [columns, *(tuple(str(cell) for cell in row) for row in rows)]
        widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
        for row in table:
            self.stdout.write("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        self.stdout.write("")


def _left(entry: dict[str, Any]) -> str:
    if entry.get("lock_delay_until"):
        return f"lock delay until {entry['lock_delay_until'][11:19]}"
    return format_duration(entry["time_left"]) or "-"


def _clip(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


__all__ = ["Command", "report"]
