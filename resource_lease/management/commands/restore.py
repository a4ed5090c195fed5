"""``manage.py restore --kind K [--name N ...] [--dry-run] [--json]``

End the quarantine of resources now (``pool.restore``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from resource_lease import pool
from resource_lease.management.commands._operation import OperationCommand
from resource_lease.models import Resource


class Command(OperationCommand):
    help = "End the quarantine of the selected resources now. --dry-run says which, --json for scripts."
    action = "restore"
    done = "Restored"
    verb = "restore"
    skipped_because = "were not quarantined"

    def affected(self, selected: QuerySet[Resource]) -> QuerySet[Resource]:
        return pool.restorable(selected)

    def apply(self, pks: list[int], using: str, options: dict[str, Any]) -> int:
        return pool.restore(pks, using=using)
