"""``manage.py prune_lease_events [--days N] [--dry-run]``: delete old audit trail entries.

Run it from cron (daily, say). Deletes in small batches so it never holds long locks on a
table the audit writer keeps inserting into.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from resource_lease.conf import lease_settings
from resource_lease.management.commands._arguments import database_argument, positive_days_argument
from resource_lease.management.commands._base import LeaseCommand
from resource_lease.management.commands._pruning import days_ago, delete_in_batches
from resource_lease.models import LeaseEvent
from resource_lease.validation import resolve_using


class Command(LeaseCommand):
    help = "Delete lease events (the audit trail) older than --days (default: RESOURCE_LEASE['AUDIT_RETENTION_DAYS'])."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days", type=positive_days_argument, default=None, help="keep this many days (default: the setting)"
        )
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")
        parser.add_argument(
            "--database", type=database_argument, default=None, help="database alias (default: the lease database)"
        )

    def handle(self, *args: Any, days: float | None, dry_run: bool, database: str | None, **options: Any) -> None:
        using = resolve_using(database or None, "--database")
        days = float(lease_settings.AUDIT_RETENTION_DAYS) if days is None else days
        old = LeaseEvent.objects.using(using).filter(at__lt=days_ago(days))
        if dry_run:
            self.stdout.write(f"Dry run: {old.count()} lease events are older than {days:g} days.")
            return
        deleted = delete_in_batches(old, "at")
        if options.get("verbosity", 1) >= 1:
            self.stdout.write(f"Deleted {deleted} lease events older than {days:g} days.")
