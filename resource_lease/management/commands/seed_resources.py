"""``manage.py seed_resources [FILE|-] --kind K [--format json|csv] [--replace] [--dry-run] [--json]``

Load any kind of resource (GPUs, API accounts, licences) from JSON or CSV, with the same
rules as ``seed_proxies``: every entry is checked first and one bad entry means nothing is
written; re-running adds no duplicates; a changed payload is merged into the stored one;
``--replace`` never removes a resource that is leased right now.

JSON: a list of objects ``{"name": "gpu-0", "data": {"device": 0}, "enabled": true}``
(``data`` and ``enabled`` optional), or one object mapping each name to its data.
CSV: a header row with a ``name`` column; an ``enabled`` column (true/false, yes/no, 1/0)
is optional; every other column is a key of ``data``, as text, or parsed as JSON when its
header ends with ``:json`` (``device:json`` -> ``{"device": 0}``). Empty cells are left out.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import IO, Any

from django.core.management.base import CommandError, CommandParser

from resource_lease.management.commands._seeding import Progress, SeedCommand
from resource_lease.seeding import Entry, SeedList
from resource_lease.validation import MAX_JSON_DEPTH

FORMATS = ("json", "csv")
_TRUE = {"true", "yes", "1", "y", "t"}
_FALSE = {"false", "no", "0", "n", "f"}


class Command(SeedCommand):
    help = (
        "Load resources of a kind (GPUs, API accounts, ...) from JSON or CSV. Every entry is checked "
        "before anything is written; re-running adds no duplicates; --replace keeps leased resources."
    )
    noun = "resources"
    unit = "entry"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--format", choices=FORMATS, default=None, help="json or csv (default: from the file's extension)"
        )

    def read(self, source: str, stdin: IO[Any], progress: Progress, options: dict[str, Any]) -> SeedList:
        fmt = options.get("format") or _format_of(source)
        raw = self.read_bytes(source, stdin)
        label = "standard input" if source == "-" else source
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise CommandError(
                f"{label}: not UTF-8 text ({exc.reason} at byte {exc.start}), nothing was written"
            ) from None
        return read_json(text, label) if fmt == "json" else read_csv(text, label)


def _format_of(source: str) -> str:
    suffix = Path(source).suffix.lower().lstrip(".")
    if source == "-" or suffix not in FORMATS:
        where = "standard input" if source == "-" else f"{source} (its extension is not .json or .csv)"
        raise CommandError(f"--format json or --format csv is needed to read {where}")
    return suffix


def _data_conflict(seen: Entry, entry: Entry) -> str:
    return f"{entry.name} is already in {seen.where} with other data"


def read_json(text: str, label: str) -> SeedList:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(
            f"{label}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}; nothing was written"
        ) from None
    except RecursionError:  # json.loads of lists and dicts nested thousands deep
        raise CommandError(
            f"{label}: JSON nested too deep (data may nest lists and dicts at most {MAX_JSON_DEPTH} deep);"
            " nothing was written"
        ) from None
    seed = SeedList()
    if isinstance(document, dict):
        for name, data in document.items():
            where = f"the entry {name!r}"
            if not isinstance(data, dict):
                seed.error(where, f"data must be a JSON object, got {json.dumps(data)[:60]}")
                continue
            seed.add(Entry(name=name, data=data, where=where), conflict=_data_conflict)
        return seed
    if not isinstance(document, list):
        raise CommandError(
            f"{label}: expected a JSON list of resources or an object of name: data, got {type(document).__name__};"
            " nothing was written"
        )
    for number, item in enumerate(document, 1):
        where = f"item {number}"
        if not isinstance(item, dict):
            seed.error(where, f"expected an object with a name, got {json.dumps(item)[:60]}")
            continue
        unknown = sorted(set(item) - {"name", "data", "enabled"})
        if unknown:
            seed.error(
                where,
                f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} (put them under data)",
            )
            continue
        data = item.get("data", {})
        enabled = item.get("enabled")
        if not isinstance(data, dict):
            seed.error(where, f"data must be a JSON object, got {json.dumps(data)[:60]}")
        elif enabled is not None and not isinstance(enabled, bool):
            seed.error(where, f"enabled must be true or false, got {json.dumps(enabled)[:60]}")
        else:
            seed.add(Entry(name=item.get("name"), data=data, enabled=enabled, where=where), conflict=_data_conflict)  # type: ignore[arg-type]
    return seed


def read_csv(text: str, label: str) -> SeedList:
    reader = csv.reader(io.StringIO(text, newline=""))
    seed = SeedList()
    try:
        header = next(reader, None)
        if header is None:
            return seed
        columns = [column.strip() for column in header]
        if "name" not in columns:
            raise CommandError(f"{label}: line 1: the header has no 'name' column ({', '.join(columns)})")
        duplicated = sorted({c for c in columns if columns.count(c) > 1})
        if duplicated or "" in columns:
            what = f"repeated columns {', '.join(duplicated)}" if duplicated else "an empty column name"
            raise CommandError(f"{label}: line 1: the header has {what}")
        for row in reader:
            where = f"line {reader.line_num}"
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(columns):
                seed.error(where, f"{len(row)} cells, the header has {len(columns)}")
                continue
            entry = _csv_entry(dict(zip(columns, row, strict=True)), where, seed)
            if entry is not None:
                seed.add(entry, conflict=_data_conflict)
    except csv.Error as exc:
        raise CommandError(f"{label}: line {reader.line_num}: not valid CSV: {exc}; nothing was written") from None
    return seed


def _csv_entry(cells: dict[str, str], where: str, seed: SeedList) -> Entry | None:
    data: dict[str, Any] = {}
    enabled: bool | None = None
    for column, cell in cells.items():
        if column == "name" or cell == "":
            continue
        if column == "enabled":
            word = cell.strip().lower()
            if word not in _TRUE | _FALSE:
                seed.error(where, f"enabled must be true or false, got {cell!r}")
                return None
            enabled = word in _TRUE
        elif column.endswith(":json"):
            try:
                data[column.removesuffix(":json")] = json.loads(cell)
            except json.JSONDecodeError as exc:
                seed.error(where, f"column {column}: not valid JSON ({exc.msg}): {cell[:60]!r}")
                return None
            except RecursionError:
                seed.error(where, f"column {column}: JSON nested more than {MAX_JSON_DEPTH} deep")
                return None
        else:
            data[column] = cell
    return Entry(name=cells["name"], data=data, enabled=enabled, where=where)
