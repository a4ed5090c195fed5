"""The shared body of ``force_release``, ``quarantine`` and ``restore``: select resources by
``--kind K [--name N ...]``, say what would change (``--dry-run``) or change it with one
conditional UPDATE (``resource_lease.pool``), and report it as text or ``--json``.

Bad input (an unknown kind or name) is a CommandError naming it, and nothing is changed.
"""

from __future__ import annotations

import getpass
import json
import os
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db.models import QuerySet

from resource_lease.audit import acting_as
from resource_lease.display import current_holder, with_display_state
from resource_lease.management.commands._arguments import (
    database_argument,
    kind_argument,
    name_argument,
    pool_resources,
)
from resource_lease.management.commands._base import LeaseCommand
from resource_lease.models import Resource
from resource_lease.validation import resolve_using

#: Names listed in the text report; the rest are counted (--json lists all).
SHOWN = 50


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a container)
        return f"uid {os.getuid()}"


class OperationCommand(LeaseCommand):
    #: The operation's name in JSON and in the audit trail's actor ("force_release").
    action = ""
    #: Past tense and infinitive for the report ("Force-released", "force-release").
    done = ""
    verb = ""
    #: Why a selected resource is left alone ("had no live lease").
    skipped_because = ""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--kind", required=True, type=kind_argument, help="the pool")
        parser.add_argument(
            "--name",
            dest="names",
            nargs="+",
            action="extend",
            type=name_argument,
            metavar="NAME",
            help="only these resources (default: every resource of the kind)",
        )
        parser.add_argument("--dry-run", action="store_true", help="say what would change; change nothing")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print the result as JSON")
        parser.add_argument(
            "--database", type=database_argument, default=None, help="database alias (default: the lease database)"
        )

    # -- to override --------------------------------------------------------------------

    def affected(self, selected: QuerySet[Resource]) -> QuerySet[Resource]:
        """Those of ``selected`` the operation changes."""
        raise NotImplementedError

    def apply(self, pks: list[int], using: str, options: dict[str, Any]) -> int:
        """Run the operation on ``pks``; how many it changed."""
        raise NotImplementedError

    def extra(self, options: dict[str, Any]) -> dict[str, Any]:
        """More fields for the JSON report (the quarantine's reason and length)."""
        return {}

    def note(self, rows: list[Any], affected: set[int], options: dict[str, Any]) -> str:
        """A last line for the text report, if any."""
        return ""

    # -- the shared body -----------------------------------------------------------------

    def select(self, kind: str, names: list[str] | None, using: str) -> QuerySet[Resource]:
        pool = pool_resources(using)
        selected = pool.filter(kind=kind)
        if not selected.exists():
            known = sorted(set(pool.values_list("kind", flat=True).distinct()))
            raise CommandError(
                f"there are no resources of kind {kind!r} (kinds: {', '.join(known) if known else 'none'}); "
                "nothing was changed"
            )
        if names:
            wanted = set(names)
            selected = selected.filter(name__in=wanted)
            missing = sorted(wanted - set(selected.values_list("name", flat=True)))
            if missing:
                raise CommandError(
                    f"no resource of kind {kind!r} is named {', '.join(map(repr, missing))}; nothing was changed"
                )
        return selected

    def handle(
        self,
        *args: Any,
        kind: str,
        names: list[str] | None,
        dry_run: bool,
        as_json: bool,
        database: str | None,
        verbosity: int = 1,
        **options: Any,
    ) -> None:
        using = resolve_using(database or None, "--database")
        selected = self.select(kind, names, using)
        rows: list[Any] = list(with_display_state(selected).order_by("name"))
        affected = set(self.affected(selected).values_list("pk", flat=True))
        if dry_run:
            count = len(affected)
        else:
            with acting_as(f"manage.py {self.action}: {_operator()}"):
                count = self.apply([r.pk for r in rows], using, options)
        if as_json:
            report = {
                "action": self.action,
                "kind": kind,
                "dry_run": dry_run,
                "selected": len(rows),
                "count": count,
                **self.extra(options),
                "resources": [
                    {
                        "name": r.name,
                        "state": r.state,
                        "holder": current_holder(r) or None,
                        "fence": r.fence,
                        "affected": r.pk in affected,
                    }
                    for r in rows
                ],
            }
            self.stdout.write(json.dumps(report, indent=2))
            return
        if verbosity < 1:
            return
        shown = [r for r in rows if r.pk in affected]
        for r in shown[:SHOWN]:
            holder = current_holder(r)
            self.stdout.write(f"  {r.name}  {r.state}" + (f", held by {holder} (fence {r.fence})" if holder else ""))
        if len(shown) > SHOWN:
            self.stdout.write(f"  ... and {len(shown) - SHOWN} more")
        what = f"{len(rows)} selected resource{'s' if len(rows) != 1 else ''} of kind {kind!r}"
        if dry_run:
            line = f"Dry run: would {self.verb} {count} of the {what}"
        else:
            line = f"{self.done} {count} of the {what}"
        skipped = len(rows) - len(affected)
        if skipped:
            line += f"; {skipped} {self.skipped_because}"
        self.stdout.write(self.style.SUCCESS(line + ".") if count else self.style.WARNING(line + "."))
        if note := self.note(rows, affected, options):
            self.stdout.write(note)
