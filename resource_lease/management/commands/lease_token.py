"""``manage.py lease_token create NAME [--kinds k1,k2]`` | ``list [--json]`` | ``revoke NAME``

The HTTP API's bearer tokens (docs/http.md#tokens). ``create`` prints the token's text once:
only its SHA-256 digest is stored. A revoked token is refused at once (401) and keeps its
name, which is recorded in the holder of every lease it took.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser

from resource_lease.api.tokens import create_token, revoke_token
from resource_lease.management.commands._base import LeaseCommand
from resource_lease.models.api import ApiToken


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


class Command(LeaseCommand):
    help = "Create, list and revoke the HTTP API's bearer tokens."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{create,list,revoke}")
        create = actions.add_parser("create", help="make a token and print its text (shown once)")
        create.add_argument("name", help="the token's name (recorded in its leases' holder)")
        create.add_argument("--kinds", default="", help="comma-separated kinds it may lease (default: every kind)")
        listing = actions.add_parser("list", help="every token, its kinds, last use and whether revoked")
        listing.add_argument("--json", action="store_true", help="one JSON document")
        revoke = actions.add_parser("revoke", help="refuse a token from now on")
        revoke.add_argument("name")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "create":
            try:
                token, text = create_token(options["name"], options["kinds"])
            except ValidationError as exc:
                messages = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in exc.message_dict.items())
                raise CommandError(f"cannot create token {options['name']!r}: {messages}") from exc
            kinds = token.kinds or "every kind"
            if options["verbosity"] >= 1:
                self.stderr.write(f"Token {token.name!r} ({kinds}); it is shown only this once:")
            self.stdout.write(text)
        elif action == "list":
            rows: list[dict[str, Any]] = [
                {
                    "name": token.name,
                    "prefix": token.prefix,
                    "kinds": token.kind_list(),
                    "created_at": _iso(token.created_at),
                    "last_used_at": _iso(token.last_used_at),
                    "revoked_at": _iso(token.revoked_at),
                }
                for token in ApiToken.objects.all()
            ]
            if options["json"]:
                self.stdout.write(json.dumps(rows, indent=2))
                return
            for row in rows:
                state = "revoked" if row["revoked_at"] else "active"
                kinds = ",".join(row["kinds"]) or "*"
                self.stdout.write(
                    f"{row['name']}\t{row['prefix']}…\t{kinds}\t{state}\tlast used {row['last_used_at'] or 'never'}"
                )
        else:
            if not revoke_token(options["name"]):
                raise CommandError(f"no active token named {options['name']!r}")
            self.stdout.write(f"Token {options['name']!r} revoked.")
