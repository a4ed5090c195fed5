"""``manage.py seed_proxies [FILE|-|--sample] [--kind proxy] [--replace] [--dry-run] [--json]``

Load a proxy list into the pool of a kind: one proxy per line (``host:port``,
``scheme://host:port``, ``scheme://user:pass@host:port``), blank lines and ``#`` comments
allowed. Every line is checked before anything is written: one bad line and nothing is.
``--sample`` loads the sample list shipped with the package (documentation addresses).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from django.core.management.base import CommandError, CommandParser

from resource_lease.management.commands._seeding import Progress, SeedCommand
from resource_lease.models import Resource
from resource_lease.proxy_urls import mask_url, parse_proxy, strip_line
from resource_lease.seeding import Entry, SeedList

#: The sample list shipped with the package (package data).
SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "sample_proxies.txt"


def _url_conflict(seen: Entry, entry: Entry) -> str:
    return (
        f"{entry.name} is already on {seen.where} with another URL "
        f"(there {mask_url(seen.data['url'])}, here {mask_url(entry.data['url'])})"
    )


class Command(SeedCommand):
    help = (
        "Load proxies (one per line: host:port, scheme://host:port or scheme://user:pass@host:port; "
        "blank lines and # comments allowed) into the pool of a kind. Re-running adds no duplicates; "
        "a bad line is reported with its number and nothing is written."
    )
    noun = "proxies"
    unit = "line"
    units = "lines"
    default_kind = "proxy"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--sample",
            action="store_true",
            help="load the sample list shipped with the package (documentation addresses, nothing behind them)",
        )

    def default_source(self, options: dict[str, Any]) -> str | None:
        return str(SAMPLE) if options.get("sample") else None

    def handle(self, *args: Any, **options: Any) -> None:
        if options.get("sample") and options.get("source") is not None:
            raise CommandError("give either a FILE or --sample, not both")
        super().handle(*args, **options)

    def describe(self, entry: Entry | Resource) -> str:
        return mask_url(entry.data["url"])

    def read(self, source: str, stdin: IO[Any], progress: Progress, options: dict[str, Any]) -> SeedList:
        return read_proxies(self._lines(source, stdin), progress)


def read_proxies(lines: Iterable[str | bytes], progress: Progress | None = None) -> SeedList:
    """Parse a proxy list (bytes or text lines) into entries named ``[user@]host:port``."""
    seed = SeedList()
    for number, raw in enumerate(lines, 1):
        if progress is not None and number % 5000 == 0:
            progress.show(f"reading: {number:,} lines")
        where = f"line {number}"
        try:
            line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as exc:
            seed.error(where, f"not UTF-8 text ({exc.reason} at byte {exc.start})")
            continue
        if number == 1:
            line = line.removeprefix("\ufeff")
        text = strip_line(line)
        if not text:
            continue
        try:
            proxy = parse_proxy(text)
        except ValueError as exc:
            seed.error(where, f"{exc}: {mask_url(text)[:100]}")
            continue
        seed.add(Entry(name=proxy.name, data={"url": proxy.url}, where=where), conflict=_url_conflict)
    return seed
