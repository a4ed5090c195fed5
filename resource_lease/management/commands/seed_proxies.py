"""``manage.py seed_proxies [FILE|-] [--kind proxy] [--replace] [--dry-run] [--json]``

Load a proxy list into the pool of a kind: one proxy per line (``host:port``,
``scheme://host:port``, ``scheme://user:pass@host:port``), blank lines and ``#`` comments
allowed. Every line is checked before anything is written: one bad line and nothing is.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError, transaction
from django.db.models import Q

from resource_lease.bulk import insert_many, update_many
from resource_lease.conf import lease_settings
from resource_lease.db import DbNow
from resource_lease.management.commands._arguments import database_argument, kind_argument
from resource_lease.models import Resource
from resource_lease.proxy_urls import ProxyURL, mask_url, parse_proxy, strip_line

#: Bad lines shown in the error; the rest are counted.
SHOWN_ERRORS = 20
#: Names listed in the summary of resources kept by --replace; the rest are counted.
SHOWN_KEPT = 20
CHUNK = 1000
#: Rows per batch of INSERTs (between two updates of the progress indicator).
INSERT_CHUNK = 2000


@dataclass
class ProxyList:
    proxies: dict[str, tuple[int, ProxyURL]] = field(default_factory=dict)  # name -> (line, proxy)
    duplicates: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class Plan:
    create: list[tuple[str, str]] = field(default_factory=list)  # (name, url)
    update: list[Resource] = field(default_factory=list)
    unchanged: int = 0
    stale: dict[int, str] = field(default_factory=dict)  # pk -> name, for --replace
    removed: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (name, holder)


class Progress:
    """``\\r``-updated counts on a terminal; silent anywhere else."""

    def __init__(self, stream: Any, enabled: bool) -> None:
        self.stream, self.enabled = stream, enabled
        self._shown = 0.0

    def show(self, text: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.enabled and (force or now - self._shown >= 0.1):
            self._shown = now
            self.stream.write(f"\r\x1b[K{text}", ending="")
            self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K", ending="")
            self.stream.flush()


class Command(BaseCommand):
    help = (
        "Load proxies (one per line: host:port, scheme://host:port or scheme://user:pass@host:port; "
        "blank lines and # comments allowed) into the pool of a kind. Re-running adds no duplicates; "
        "a bad line is reported with its number and nothing is written."
    )
    # Tests (and callers of call_command) may pass stdin=<stream>, as with createsuperuser.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "source",
            nargs="?",
            metavar="FILE|-",
            help="the proxy list; '-' reads standard input (also the default when it is not a terminal)",
        )
        parser.add_argument("--kind", default="proxy", type=kind_argument, help="the pool to load (default: proxy)")
        parser.add_argument(
            "--replace",
            action="store_true",
            help="remove the kind's resources that are not in the list, except those leased right now",
        )
        parser.add_argument("--dry-run", action="store_true", help="say what would change; write nothing")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print the summary as JSON")
        parser.add_argument(
            "--database", type=database_argument, default=None, help="database alias (default: the lease database)"
        )

    def handle(
        self,
        *args: Any,
        source: str | None,
        kind: str,
        replace: bool,
        dry_run: bool,
        as_json: bool,
        database: str | None,
        verbosity: int = 1,
        **options: Any,
    ) -> None:
        using = database or str(lease_settings.DATABASE)
        stdin: IO[Any] = options.get("stdin") or sys.stdin
        progress = Progress(self.stderr, enabled=verbosity >= 1 and not as_json and self.stderr.isatty())

        if source is None:
            if stdin.isatty():
                raise CommandError("give a FILE to read, or '-' to read the proxies from standard input")
            source = "-"
        label = "standard input" if source == "-" else source
        plist = self._read(self._lines(source, stdin), progress)
        if plist.errors:
            shown = plist.errors[:SHOWN_ERRORS]
            more = len(plist.errors) - len(shown)
            raise CommandError(
                f"{label}: {len(plist.errors)} bad line{'s' if len(plist.errors) != 1 else ''}, nothing was written:\n  "
                + "\n  ".join(shown)
                + (f"\n  ... and {more} more" if more else "")
            )
        if replace and not plist.proxies:
            raise CommandError(
                f"{label} has no proxies: --replace would remove every resource of kind {kind!r}; nothing was written"
            )

        if dry_run:
            plan = self._plan(plist, kind=kind, using=using, replace=replace)
            self._dry_run_replace(plan, using)
        else:
            try:
                with transaction.atomic(using=using):
                    plan = self._plan(plist, kind=kind, using=using, replace=replace)
                    self._write(plan, kind, using, progress)
            except IntegrityError as exc:
                raise CommandError(
                    f"another process added resources of kind {kind!r} at the same time ({exc}); "
                    "nothing was written: run the command again"
                ) from exc
        progress.done()
        self._report(
            plist, plan, kind=kind, label=label, dry_run=dry_run, replace=replace, as_json=as_json, verbosity=verbosity
        )

    # -- reading ----------------------------------------------------------------------

    def _lines(self, source: str, stdin: IO[Any]) -> Iterator[str | bytes]:
        if source == "-":
            yield from getattr(stdin, "buffer", stdin)
            return
        try:
            with open(source, "rb") as stream:
                yield from stream
        except OSError as exc:
            raise CommandError(f"cannot read {source}: {exc.strerror or exc}") from exc

    def _read(self, lines: Iterable[str | bytes], progress: Progress) -> ProxyList:
        plist = ProxyList()
        for number, raw in enumerate(lines, 1):
            if number % 5000 == 0:
                progress.show(f"reading: {number:,} lines")
            try:
                line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
            except UnicodeDecodeError as exc:
                plist.errors.append(f"line {number}: not UTF-8 text ({exc.reason} at byte {exc.start})")
                continue
            if number == 1:
                line = line.removeprefix("\ufeff")
            text = strip_line(line)
            if not text:
                continue
            try:
                proxy = parse_proxy(text)
            except ValueError as exc:
                plist.errors.append(f"line {number}: {exc}: {mask_url(text)[:100]}")
                continue
            seen = plist.proxies.get(proxy.name)
            if seen is None:
                plist.proxies[proxy.name] = (number, proxy)
            elif seen[1].url == proxy.url:
                plist.duplicates += 1
            else:
                plist.errors.append(
                    f"line {number}: {proxy.name} is already on line {seen[0]} with another URL "
                    f"(there {seen[1].masked}, here {proxy.masked})"
                )
        return plist

    # -- planning and writing ----------------------------------------------------------

    def _plan(self, plist: ProxyList, *, kind: str, using: str, replace: bool) -> Plan:
        # A plain read (no lock): locking the whole kind would stall every acquire while the
        # list loads. Two seedings at once collide on (kind, name) and the loser writes nothing.
        plan = Plan()
        existing: set[str] = set()
        rows = Resource.objects.using(using).filter(kind=kind).values_list("pk", "name", "data")
        for pk, name, data in rows.iterator(chunk_size=5000):
            existing.add(name)
            entry = plist.proxies.get(name)
            if entry is None:
                if replace:
                    plan.stale[pk] = name
                continue
            url = entry[1].url
            data = data if isinstance(data, dict) else {}
            if data.get("url") == url:
                plan.unchanged += 1
            else:
                plan.update.append(Resource(pk=pk, kind=kind, name=name, data={**data, "url": url}))
        plan.create = [(name, proxy.url) for name, (_, proxy) in plist.proxies.items() if name not in existing]
        return plan

    def _write(self, plan: Plan, kind: str, using: str, progress: Progress) -> None:
        total = len(plan.create) + len(plan.update)
        done = 0
        for start in range(0, len(plan.create), INSERT_CHUNK):
            new = plan.create[start : start + INSERT_CHUNK]
            insert_many(
                Resource,
                ({"name": name, "data": {"url": url}} for name, url in new),
                using=using,
                defaults={"kind": kind},
            )
            done += len(new)
            progress.show(f"writing: {done:,}/{total:,}", force=done == total)
        for start in range(0, len(plan.update), CHUNK):
            update_many(Resource, "data", {r.pk: r.data for r in plan.update[start : start + CHUNK]}, using=using)
            done += len(plan.update[start : start + CHUNK])
            progress.show(f"writing: {done:,}/{total:,}", force=done == total)
        stale = list(plan.stale)
        for start in range(0, len(stale), CHUNK):
            chunk = stale[start : start + CHUNK]
            # Lock the rows that are not leased now; a locked row cannot be granted before
            # this transaction ends, and then it is gone. A leased one is never deleted.
            free = set(
                Resource.objects.using(using)
                .select_for_update()
                .filter(pk__in=chunk)
                .filter(Q(grant_token="") | Q(busy_before__lte=DbNow()))
                .values_list("pk", flat=True)
            )
            if free:
                Resource.objects.using(using).filter(pk__in=free).delete()
            plan.removed.extend(plan.stale[pk] for pk in chunk if pk in free)
            held = [pk for pk in chunk if pk not in free]
            plan.kept.extend(self._holders(held, using))
            progress.show(f"removing: {start + len(chunk):,}/{len(stale):,}")

    def _dry_run_replace(self, plan: Plan, using: str) -> None:
        stale = list(plan.stale)
        for start in range(0, len(stale), CHUNK):
            chunk = stale[start : start + CHUNK]
            held = set(
                Resource.objects.using(using)
                .filter(pk__in=chunk)
                .exclude(Q(grant_token="") | Q(busy_before__lte=DbNow()))
                .values_list("pk", flat=True)
            )
            plan.removed.extend(plan.stale[pk] for pk in chunk if pk not in held)
            plan.kept.extend(self._holders(sorted(held), using))

    @staticmethod
    def _holders(pks: list[int], using: str) -> list[tuple[str, str]]:
        if not pks:
            return []
        return list(Resource.objects.using(using).filter(pk__in=pks).order_by("name").values_list("name", "holder"))

    # -- reporting ----------------------------------------------------------------------

    def _report(
        self,
        plist: ProxyList,
        plan: Plan,
        *,
        kind: str,
        label: str,
        dry_run: bool,
        replace: bool,
        as_json: bool,
        verbosity: int,
    ) -> None:
        if as_json:
            summary = {
                "kind": kind,
                "dry_run": dry_run,
                "proxies": len(plist.proxies),
                "duplicate_lines": plist.duplicates,
                "added": len(plan.create),
                "updated": len(plan.update),
                "unchanged": plan.unchanged,
                "removed": len(plan.removed),
                "kept": [{"name": name, "holder": holder} for name, holder in plan.kept],
            }
            self.stdout.write(json.dumps(summary, indent=2))
            return
        if verbosity < 1:
            return
        would = "would be " if dry_run else ""
        if verbosity >= 2:
            for name, url in plan.create:
                self.stdout.write(f"  {would}added   {name}  {mask_url(url)}")
            for resource in plan.update:
                self.stdout.write(f"  {would}updated {resource.name}  {mask_url(resource.data['url'])}")
            for name in plan.removed:
                self.stdout.write(f"  {would}removed {name}")
        duplicates = f", {plist.duplicates} duplicate line{'s' if plist.duplicates != 1 else ''} skipped"
        self.stdout.write(
            f"{'Dry run: ' if dry_run else ''}{label}: {len(plist.proxies)} proxies for kind {kind!r}"
            f"{duplicates if plist.duplicates else ''}."
        )
        counts = f"{len(plan.create)} {would}added, {len(plan.update)} {would}updated, {plan.unchanged} unchanged"
        if replace:
            counts += f", {len(plan.removed)} {would}removed (not in the list)"
        self.stdout.write(self.style.SUCCESS(counts[0].upper() + counts[1:] + "."))
        if plan.kept:
            self.stdout.write(
                self.style.WARNING(
                    f"Kept {len(plan.kept)} not in the list because {'it is' if len(plan.kept) == 1 else 'they are'} "
                    "leased right now (run again once released):"
                )
            )
            for name, holder in plan.kept[:SHOWN_KEPT]:
                self.stdout.write(f"  {name}  (held by {holder})")
            if len(plan.kept) > SHOWN_KEPT:
                self.stdout.write(f"  ... and {len(plan.kept) - SHOWN_KEPT} more")
