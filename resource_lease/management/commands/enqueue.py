"""``manage.py enqueue NAME [FILE|-]``: put work items into a dispenser, one per line.

Each line is a key, optionally followed by whitespace and a JSON payload; blank lines and
lines starting with ``#`` are skipped. Every bad line is reported with its number (as
``seed_proxies`` does), and then nothing is written. ``--file-names``: every key must be one
plain file name (no ``/``, ``\\``, ``.`` or ``..``), as a ``FolderWorker``'s keys are (it
refuses the others when it claims them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from resource_lease.management.commands._arguments import database_argument
from resource_lease.management.commands._base import LeaseCommand
from resource_lease.management.commands._seeding import SHOWN_ERRORS
from resource_lease.recipes.dispenser import Dispenser, check_file_key, check_key
from resource_lease.validation import MAX_JSON_DEPTH, check_json, check_name


class Command(LeaseCommand):
    help = "Put work items (a key and an optional JSON payload per line) into a dispenser."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the dispenser's name")
        parser.add_argument("file", nargs="?", default="-", help="file of items, or - for standard input (default)")
        parser.add_argument(
            "--recreate",
            action="store_true",
            help="make the pending pool exactly these items (assigned items stay with their workers)",
        )
        parser.add_argument(
            "--file-names",
            action="store_true",
            help="refuse keys that are not one plain file name (the dispenser of a FolderWorker)",
        )
        parser.add_argument("--database", type=database_argument, default=None, help="database alias")

    def handle(
        self,
        *args: Any,
        name: str,
        file: str,
        recreate: bool,
        file_names: bool,
        database: str | None,
        **options: Any,
    ) -> None:
        try:
            name = check_name(name, "name")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if file == "-":
            text = sys.stdin.read()
        else:
            try:
                text = Path(file).read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise CommandError(f"cannot read {file}: {exc}") from None
        items: dict[str, Any] = {}
        errors: list[str] = []
        # Lines end at \n (and \r\n) only: splitlines() also splits at \x85 or \u2028, which a
        # JSON payload may hold as they are.
        for number, line in enumerate(text.split("\n"), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, *more = line.split(None, 1)
            rest = more[0] if more else ""
            try:
                (check_file_key if file_names else check_key)(key)
                payload = json.loads(rest) if rest else None
                check_json(payload, "payload")
            except (ValueError, json.JSONDecodeError) as exc:
                errors.append(f"line {number}: {exc}")
                continue
            except RecursionError:  # json.loads of lists nested thousands deep
                errors.append(f"line {number}: payload must not nest lists and dicts more than {MAX_JSON_DEPTH} deep")
                continue
            if key in items:
                errors.append(f"line {number}: key {key!r} appears twice")
                continue
            items[key] = payload
        if errors:
            label = "standard input" if file == "-" else file
            shown = errors[:SHOWN_ERRORS]
            more = f"\n  ... and {len(errors) - len(shown)} more" if len(errors) > len(shown) else ""
            raise CommandError(
                f"{label}: {len(errors)} bad line{'' if len(errors) == 1 else 's'}, nothing was written:\n  "
                + "\n  ".join(shown)
                + more
            )
        dispenser = Dispenser(name, using=database)
        if recreate:
            result = dispenser.recreate(items)
            self.stdout.write(
                f"{name}: {len(items)} items: {result['added']} added, {result['requeued']} queued again, "
                f"{result['removed']} removed from the pending pool"
            )
        else:
            new = dispenser.put(items)
            self.stdout.write(f"{name}: {new} new of {len(items)} items")
