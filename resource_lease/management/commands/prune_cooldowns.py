"""``manage.py prune_cooldowns [--days N] [--dry-run] [--database ALIAS]``: delete cooldowns
that ended long ago.

A pool that learns keeps one ``Cooldown`` row per resource and target it was used for
(docs/learning.md#targets); a crawler farm that visits many sites piles them up. A row whose
cooldown ended more than N days ago (default 7) decides nothing any more: its grant times are
no later than its end (each write moves the end to at least its own time), so they are older
than any window a policy counts, as long as no policy's ``target_rate`` window is longer than
N days (the command refuses N shorter than a policy's window, naming the kind). Judged by the
database's clock, in batches, so it never holds long locks on a table every targeted grant
reads. Run it from cron (daily, say).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db.models import Q

from resource_lease.management.commands._arguments import database_argument, positive_days_argument
from resource_lease.management.commands._base import LeaseCommand
from resource_lease.management.commands._pruning import days_ago, delete_in_batches
from resource_lease.models import Cooldown, PoolPolicy
from resource_lease.validation import resolve_using

DAYS = 7.0


class Command(LeaseCommand):
    help = "Delete targets' cooldowns that ended more than --days ago (default 7)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days",
            type=positive_days_argument,
            default=DAYS,
            help=f"keep those that ended this recently (default {DAYS:g})",
        )
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")
        parser.add_argument(
            "--database", type=database_argument, default=None, help="database alias (default: the lease database)"
        )

    def handle(self, *args: Any, days: float, dry_run: bool, database: str | None, **options: Any) -> None:
        using = resolve_using(database or None, "--database")
        longest = (
            PoolPolicy.objects.using(using)
            .filter(target_rate_per__gt=days * 86400)
            .order_by("-target_rate_per")
            .values_list("kind", "target_rate_per")
            .first()
        )
        if longest is not None:
            kind, per = longest
            raise CommandError(
                f"--days {days:g} is shorter than the target_rate window of kind {kind!r} ({per:g} s): its cooldowns'"
                " grant times still count; pass --days of at least that window"
            )
        cutoff = days_ago(days)
        old = Cooldown.objects.using(using).filter(until__lt=cutoff)
        if dry_run:
            self.stdout.write(f"Dry run: {old.count()} cooldowns ended more than {days:g} days ago.")
            return
        # The row's end judged again in each DELETE: a grant that counted meanwhile keeps it.
        deleted = delete_in_batches(old, "until", again=Q(until__lt=cutoff))
        if options.get("verbosity", 1) >= 1:
            self.stdout.write(f"Deleted {deleted} cooldowns that ended more than {days:g} days ago.")
