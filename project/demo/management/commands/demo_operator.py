"""What a new user trips over, shown fixed: exact kinds and names, ``lease.lost`` a bool,
settings checked at start-up, and the operator commands (seed_resources, quarantine, restore,
force_release, output piped into ``head``).

    python manage.py demo_operator [--json]

Works on its own kinds (``demo-gpu``, ``DEMO-GPU``), which it empties first and leaves
loaded; runs on the embedded SQLite file and on MariaDB/PostgreSQL (DATABASE_URL). Exits 1
if a claim does not hold.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError, connection, transaction
from django.test.utils import override_settings

from resource_lease import NoResourceAvailable, acquire
from resource_lease.checks import check_exact_collation, check_setting_values
from resource_lease.models import Resource

KIND = "demo-gpu"
REPO = Path(settings.BASE_DIR)


def _call(*args: Any, stdin: str | None = None) -> str:
    out = io.StringIO()
    options: dict[str, Any] = {"stdout": out, "stderr": io.StringIO()}
    if stdin is not None:
        options["stdin"] = io.StringIO(stdin)
    call_command(*args, **options)
    return out.getvalue()


class Command(BaseCommand):
    help = "Show the first-hour traps fixed: exact kinds, lease.lost, settings checks, operator commands."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", dest="as_json", help="print the summary as JSON")

    def handle(self, *args: Any, as_json: bool, **options: Any) -> None:
        Resource.objects.filter(kind__in=[KIND, KIND.upper()]).delete()
        claims: dict[str, bool] = {}
        facts: dict[str, Any] = {"database": connection.vendor}

        # 1. Exact kinds and names, whatever the database's default collation.
        Resource.objects.create(kind=KIND, name="a1", data={"device": 0})
        misses = []
        try:
            with transaction.atomic():
                upper_row = Resource.objects.create(kind=KIND.upper(), name="a1", data={"device": 1})  # no collision
        except IntegrityError:
            misses.append(f"{KIND.upper()}/a1 collides with {KIND}/a1")
            upper_row = Resource.objects.create(kind=KIND.upper(), name="a1-other", data={"device": 1})
        upper = acquire(KIND.upper(), ttl=5)  # its own resource, never the lower-case one
        if (upper.resource.kind, upper.resource.data) != (KIND.upper(), {"device": 1}):
            misses.append(f"{KIND.upper()!r} leased {upper.resource}")
        for other in (KIND + " ", "Demo-Gpu"):
            try:
                lease = acquire(other, ttl=5)
                misses.append(f"{other!r} leased {lease.resource}")
                lease.release()
            except NoResourceAvailable as exc:
                if exc.exists:
                    misses.append(f"{other!r} found resources")
        upper.release()
        claims["kinds and names compare exactly"] = not misses and not check_exact_collation(databases=["default"])
        facts["inexact"] = misses
        Resource.objects.filter(pk=upper_row.pk).delete()  # by key: a case-blind kind= would match both

        # 2. lease.lost is a bool.
        lease = acquire(KIND, ttl=30)
        claims["a fresh lease is not lost (`if lease.lost:`)"] = lease.lost is False
        lease.release()

        # 3. Settings: a string TTL is an error naming the setting, at start-up.
        with override_settings(RESOURCE_LEASE={"TTL": "30", "RENEW_FRACTION": 1}):
            errors = check_setting_values()
        facts["checks"] = [f"{e.id}: {e.msg}" for e in errors]
        claims["bad settings are errors naming them"] = [e.id for e in errors] == ["resource_lease.E010"] * 2 and all(
            "RESOURCE_LEASE[" in e.msg for e in errors
        )

        # 4. Operator commands.
        csv = "name,device:json\n" + "".join(f"a{i},{i}\n" for i in range(1, 400))
        _call("seed_resources", "-", "--kind", KIND, "--format", "csv", stdin=csv)
        held = acquire(KIND, ttl=60, holder="demo-job")
        quarantined = json.loads(
            _call("quarantine", "--kind", KIND, "--name", "a2", "a3", "--seconds", "600", "--reason", "demo", "--json")
        )
        restored = json.loads(_call("restore", "--kind", KIND, "--json"))
        dry = json.loads(_call("force_release", "--kind", KIND, "--dry-run", "--json"))
        released = json.loads(_call("force_release", "--kind", KIND, "--json"))
        facts["operations"] = {
            "seeded": Resource.objects.filter(kind=KIND).count(),
            "quarantined": quarantined["count"],
            "restored": restored["count"],
            "force_release_dry_run": dry["count"],
            "force_released": released["count"],
        }
        claims["quarantine, restore, force_release act as asked"] = (
            quarantined["count"] == 2 and restored["count"] == 2 and dry["count"] == 1 and released["count"] == 1
        ) and not held.is_held()
        try:
            _call("quarantine", "--kind", KIND, "--seconds", "60", "--reason", " ")
            claims["a quarantine needs a reason"] = False
        except CommandError:
            claims["a quarantine needs a reason"] = True

        # 5. Piped into head: no traceback.
        with tempfile.TemporaryFile("w+") as errors_file:
            subprocess.run(
                f"{sys.executable} manage.py inspect_pool --kind {KIND} | head -n 1",
                shell=True,  # noqa: S602 - a real shell pipe is the point
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=errors_file,
                timeout=120,
                check=False,
            )
            errors_file.seek(0)
            stderr = errors_file.read()
        claims["`inspect_pool | head` prints no traceback"] = "Traceback" not in stderr

        ok = all(claims.values())
        if as_json:
            self.stdout.write(json.dumps({"ok": ok, "claims": claims, **facts}, indent=2))
        else:
            self.stdout.write(f"demo_operator on {facts['database']}:")
            for claim, holds in claims.items():
                self.stdout.write(f"  [{'ok' if holds else 'FAILED'}] {claim}")
            for line in facts["inexact"]:
                self.stdout.write(f"      {line}")
            for line in facts["checks"]:
                self.stdout.write(f"      {line}")
            self.stdout.write(f"  operations: {facts['operations']}")
        if not ok:
            raise CommandError("a claim did not hold")
