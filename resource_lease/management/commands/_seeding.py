"""The shared body of ``seed_proxies`` and ``seed_resources``: read a list from a file or
standard input, refuse it whole if any entry is bad, then add, update and (``--replace``)
remove in one transaction, with ``--dry-run`` and ``--json``. Subclasses only read."""

from __future__ import annotations

import json
import sys
import time
from typing import IO, Any

from django.core.management.base import CommandError, CommandParser
from django.db import IntegrityError, transaction

from resource_lease import seeding
from resource_lease.management.commands._arguments import database_argument, kind_argument
from resource_lease.management.commands._base import LeaseCommand
from resource_lease.validation import resolve_using

#: Bad entries shown in the error; the rest are counted.
SHOWN_ERRORS = 20
#: Names listed in the summary of resources kept by --replace; the rest are counted.
SHOWN_KEPT = 20


class Progress:
    """``\\r``-updated counts on a terminal; silent anywhere else."""

    def __init__(self, stream: Any, enabled: bool) -> None:
        self.stream, self.enabled = stream, enabled
        self._shown = 0.0

    def show(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.enabled and (force or now - self._shown >= 0.1):
            self._shown = now
            self.stream.write(f"\r\x1b[K{text}", ending="")
            self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K", ending="")
            self.stream.flush()


class SeedCommand(LeaseCommand):
    #: What the list holds, for messages and the JSON summary's count key.
    noun = "resources"
    #: The kind loaded when --kind is not given; None makes --kind required.
    default_kind: str | None = None
    # Tests (and callers of call_command) may pass stdin=<stream>, as with createsuperuser.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "source",
            nargs="?",
            metavar="FILE|-",
            help="the list; '-' reads standard input (also the default when it is not a terminal)",
        )
        if self.default_kind is None:
            parser.add_argument("--kind", required=True, type=kind_argument, help="the pool to load")
        else:
            parser.add_argument(
                "--kind",
                default=self.default_kind,
                type=kind_argument,
                help=f"the pool to load (default: {self.default_kind})",
            )
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

    # -- to override --------------------------------------------------------------------

    def read(self, source: str, stdin: IO[Any], progress: Progress, options: dict[str, Any]) -> seeding.SeedList:
        """Read and check the whole list (``source`` is a path or ``-``)."""
        raise NotImplementedError

    def describe(self, entry: seeding.Entry | Any) -> str:
        """What verbose output shows next to a name (never a secret); default nothing."""
        return ""

    def default_source(self, options: dict[str, Any]) -> str | None:
        return None

    # -- the shared body -----------------------------------------------------------------

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
        using = resolve_using(database or None, "--database")
        stdin: IO[Any] = options.get("stdin") or sys.stdin
        progress = Progress(self.stderr, enabled=verbosity >= 1 and not as_json and self.stderr.isatty())

        if source is None:
            source = self.default_source(options)
        if source is None:
            if stdin.isatty():
                raise CommandError(f"give a FILE to read, or '-' to read the {self.noun} from standard input")
            source = "-"
        label = "standard input" if source == "-" else source
        seed = self.read(source, stdin, progress, options)
        if seed.errors:
            shown = seed.errors[:SHOWN_ERRORS]
            more = len(seed.errors) - len(shown)
            raise CommandError(
                f"{label}: {len(seed.errors)} bad {self.unit if len(seed.errors) == 1 else self.units}, "
                "nothing was written:\n  " + "\n  ".join(shown) + (f"\n  ... and {more} more" if more else "")
            )
        if replace and not seed.entries:
            raise CommandError(
                f"{label} has no {self.noun}: --replace would remove every resource of kind {kind!r}; "
                "nothing was written"
            )

        if dry_run:
            plan = seeding.plan(seed, kind=kind, using=using, replace=replace)
            seeding.dry_run_replace(plan, using=using)
        else:
            try:
                with transaction.atomic(using=using):
                    plan = seeding.plan(seed, kind=kind, using=using, replace=replace)
                    seeding.write(plan, kind=kind, using=using, progress=progress.show)
            except IntegrityError as exc:
                raise CommandError(
                    f"another process added resources of kind {kind!r} at the same time ({exc}); "
                    "nothing was written: run the command again"
                ) from exc
        progress.done()
        self.report(
            seed, plan, kind=kind, label=label, dry_run=dry_run, replace=replace, as_json=as_json, verbosity=verbosity
        )

    #: What one entry of the list is called in errors ("line", "entry"), and several.
    unit = "entry"
    units = "entries"

    def _lines(self, source: str, stdin: IO[Any]) -> Any:
        if source == "-":
            yield from getattr(stdin, "buffer", stdin)
            return
        try:
            with open(source, "rb") as stream:
                yield from stream
        except OSError as exc:
            raise CommandError(f"cannot read {source}: {exc.strerror or exc}") from exc

    def read_bytes(self, source: str, stdin: IO[Any]) -> bytes:
        data = b"".join(line if isinstance(line, bytes) else line.encode() for line in self._lines(source, stdin))
        return data

    # -- reporting ------------------------------------------------------------------------

    def report(
        self,
        seed: seeding.SeedList,
        plan: seeding.Plan,
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
                self.noun: len(seed.entries),
                "duplicate_lines" if self.unit == "line" else "duplicates": seed.duplicates,
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
            for entry in plan.create:
                self.stdout.write(f"  {would}added   {entry.name}  {self.describe(entry)}".rstrip())
            for resource in plan.update:
                self.stdout.write(f"  {would}updated {resource.name}  {self.describe(resource)}".rstrip())
            for name in plan.removed:
                self.stdout.write(f"  {would}removed {name}")
        unit = self.unit if seed.duplicates == 1 else self.units
        duplicates = f", {seed.duplicates} duplicate {unit} skipped"
        self.stdout.write(
            f"{'Dry run: ' if dry_run else ''}{label}: {len(seed.entries)} {self.noun} for kind {kind!r}"
            f"{duplicates if seed.duplicates else ''}."
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
