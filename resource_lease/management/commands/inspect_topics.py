"""``manage.py inspect_topics [--topic NAME] [--namespace NS] [--counter NAME] [--json]``

Every notification topic (version, last payload, when), every live-configuration key
(type, stored value or default, version, when) and every shared counter (value, when), as a
table or as JSON for scripts.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.core.management.base import CommandParser

from resource_lease.management.commands._arguments import database_argument
from resource_lease.management.commands._base import LeaseCommand
from resource_lease.models import ConfigEntry, Counter, Topic
from resource_lease.validation import resolve_using

SHORT = 60


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= SHORT else text[: SHORT - 1] + "…"


class Command(LeaseCommand):
    help = (
        "Show notification topics (version, last payload), live configuration keys and shared counters;"
        " --json for scripts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--topic", help="only this topic")
        parser.add_argument("--namespace", help="only this configuration namespace")
        parser.add_argument("--counter", help="only this counter")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print JSON for scripts")
        parser.add_argument(
            "--database", type=database_argument, default=None, help="database alias (default: the lease database)"
        )

    def handle(
        self,
        *args: Any,
        topic: str | None,
        namespace: str | None,
        counter: str | None,
        as_json: bool,
        database: str | None,
        **options: Any,
    ) -> None:
        using = resolve_using(database or None, "--database")
        topics = Topic.objects.using(using).order_by("name")
        configs = ConfigEntry.objects.using(using).order_by("namespace", "key")
        if topic is not None:
            topics = topics.filter(name=topic)
        if namespace is not None:
            configs = configs.filter(namespace=namespace)
        counters = Counter.objects.using(using).order_by("name")
        if counter is not None:
            counters = counters.filter(name=counter)
        if as_json:
            report = {
                "topics": [
                    {"name": t.name, "version": t.version, "payload": t.payload, "updated_at": _iso(t.updated_at)}
                    for t in topics
                ],
                "configs": [
                    {
                        "namespace": c.namespace,
                        "key": c.key,
                        "type": c.type,
                        "value": c.default if c.value is None else c.value,
                        "stored": c.value is not None,
                        "default": c.default,
                        "version": c.version,
                        "updated_at": _iso(c.updated_at),
                    }
                    for c in configs
                ],
                "counters": [{"name": c.name, "value": c.value, "updated_at": _iso(c.updated_at)} for c in counters],
            }
            self.stdout.write(json.dumps(report, indent=2, ensure_ascii=False))
            return
        self._table(
            "Topics",
            ("TOPIC", "VERSION", "LAST PAYLOAD", "UPDATED"),
            [(t.name, str(t.version), _short(t.payload), _iso(t.updated_at) or "") for t in topics],
        )
        self._table(
            "Configuration",
            ("NAMESPACE", "KEY", "TYPE", "VALUE", "VERSION", "UPDATED"),
            [
                (
                    c.namespace,
                    c.key,
                    c.type,
                    f"{_short(c.default)} (default)" if c.value is None else _short(c.value),
                    str(c.version),
                    _iso(c.updated_at) or "",
                )
                for c in configs
            ],
        )
        self._table(
            "Counters",
            ("COUNTER", "VALUE", "UPDATED"),
            [(c.name, str(c.value), _iso(c.updated_at) or "") for c in counters],
        )

    def _table(self, title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"{title}: {len(rows)}"))
        if not rows:
            self.stdout.write("(none)\n")
            return
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for i, row in enumerate([header, *rows]):
            line = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            self.stdout.write(self.style.MIGRATE_HEADING(line) if i == 0 else line)
        self.stdout.write("")
