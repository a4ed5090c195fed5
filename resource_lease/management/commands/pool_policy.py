"""``manage.py pool_policy KIND [--error-threshold X] [--error-decay X] [--backoff BASE CAP]
[--target-rate N PER | --no-target-rate] [--cooldown S] [--session-idle S]
[--max-uses N | --no-max-uses] [--max-age S | --no-max-age] [--json] [--database ALIAS]``

Show a pool's policy (how it learns: ``resource_lease.pool_policy``), or change the settings
given and show the result. Bad values are a CommandError naming the setting, nothing written.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from resource_lease.conf import lease_settings
from resource_lease.health import pool_policy
from resource_lease.management.commands._arguments import database_argument, kind_argument
from resource_lease.management.commands._base import LeaseCommand


class Command(LeaseCommand):
    help = (
        "Show a pool's policy (error threshold, decay, backoff, target rate, cooldown, session idle, "
        "max uses, max age), or change the settings given; --json for scripts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kind", type=kind_argument, help="the pool's kind")
        parser.add_argument("--error-threshold", type=float, help="error score that quarantines a resource (> 0)")
        parser.add_argument("--error-decay", type=float, help="each 'ok' multiplies the score by this, in [0, 1)")
        parser.add_argument("--backoff", type=float, nargs=2, metavar=("BASE", "CAP"), help="seconds, base <= cap")
        rate = parser.add_mutually_exclusive_group()
        rate.add_argument("--target-rate", nargs=2, metavar=("N", "PER"), help="grants per target per PER seconds")
        rate.add_argument("--no-target-rate", action="store_true", help="no target rate")
        parser.add_argument("--cooldown", type=float, help="default cooldown of a release with a target, seconds")
        parser.add_argument("--session-idle", type=float, help="seconds a session's binding lives after its grant")
        uses = parser.add_mutually_exclusive_group()
        uses.add_argument("--max-uses", type=int, help="grants after which a resource retires")
        uses.add_argument("--no-max-uses", action="store_true", help="never retire by uses")
        age = parser.add_mutually_exclusive_group()
        age.add_argument("--max-age", type=float, help="seconds after its creation that a resource retires")
        age.add_argument("--no-max-age", action="store_true", help="never retire by age")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print JSON for scripts")
        parser.add_argument(
            "--database", type=database_argument, default=None, help="database alias (default: the lease database)"
        )

    def handle(self, *args: Any, kind: str, as_json: bool, database: str | None, **options: Any) -> None:
        changes: dict[str, Any] = {}
        for name in ("error_threshold", "error_decay", "cooldown", "session_idle", "max_uses", "max_age"):
            if options.get(name) is not None:
                changes[name] = options[name]
        if options.get("backoff") is not None:
            changes["backoff"] = tuple(options["backoff"])
        if options.get("target_rate") is not None:
            n, per = options["target_rate"]
            try:
                changes["target_rate"] = (int(n), float(per))
            except ValueError:
                raise CommandError(f"target_rate must be an integer and seconds, got {n!r} {per!r}") from None
        for flag, name in (("no_target_rate", "target_rate"), ("no_max_uses", "max_uses"), ("no_max_age", "max_age")):
            if options.get(flag):
                changes[name] = None
        try:
            policy = pool_policy(kind, using=database or str(lease_settings.DATABASE), **changes)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        data = dataclasses.asdict(policy)
        if as_json:
            self.stdout.write(json.dumps(data, indent=2))
            return
        if changes and options.get("verbosity", 1):
            self.stdout.write(self.style.SUCCESS(f"Stored the policy of {kind!r}."))
        for name, value in data.items():
            self.stdout.write(f"{name}: {'-' if value is None else value}")
