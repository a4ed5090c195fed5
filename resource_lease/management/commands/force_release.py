"""``manage.py force_release --kind K [--name N ...] [--dry-run] [--json]``

Free resources whose lease is live, whoever holds them (``pool.force_release``): the
holder's next renewal or fenced write is refused.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from resource_lease import pool
from resource_lease.management.commands._operation import OperationCommand
from resource_lease.models import Resource


class Command(OperationCommand):
    help = (
        "Free the selected resources that are leased now, whoever holds them; the holder's next "
        "renewal or fenced write is refused. --dry-run says which, --json for scripts."
    )
    action = "force_release"
    done = "Force-released"
    verb = "force-release"
    skipped_because = "had no live lease"

    def affected(self, selected: QuerySet[Resource]) -> QuerySet[Resource]:
        return pool.releasable(selected)

    def apply(self, pks: list[int], using: str, options: dict[str, Any]) -> int:
        return pool.force_release(pks, using=using)
