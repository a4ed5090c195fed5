"""The base of the app's commands.

- A database that is down, or that fails, is one line naming the alias and what failed
  (``CommandError``: ``cannot connect to database 'replica' (...)``), never a driver's
  traceback; ``--traceback`` still shows it.
- Run from the command line (``manage.py <command>``, a process of its own), a command
  gives back every lease, lock and place in line it holds on SIGTERM and at exit
  (``resource_lease.install_sigterm_handler``), so a stopped ``run_worker`` frees its
  resources at once instead of at their ttl.
- Output piped into ``head`` (or a pager that quits) ends the command quietly, never with a
  BrokenPipeError traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import Error as DjangoDatabaseError

from resource_lease.db.connections import database_error
from resource_lease.exceptions import LeaseDatabaseError
from resource_lease.shutdown import install_sigterm_handler
from resource_lease.validation import resolve_using


class LeaseCommand(BaseCommand):
    def execute(self, *args: Any, **options: Any) -> str | None:
        alias = resolve_using(options.get("database") or None, "--database")
        try:
            return super().execute(*args, **options)
        except (DjangoDatabaseError, LeaseDatabaseError) as exc:
            error = database_error(alias, f"manage.py {self._name()}", exc)
            raise CommandError(str(error)) from exc

    def _name(self) -> str:
        return type(self).__module__.rsplit(".", 1)[-1]

    def run_from_argv(self, argv: list[str]) -> None:
        install_sigterm_handler()
        try:
            super().run_from_argv(argv)
            # Buffered output reaches a closed pipe here rather than at interpreter exit,
            # where the error could only be printed.
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader went away: whatever is still buffered has nowhere to go. Point
            # stdout at /dev/null so the interpreter's final flush is silent too.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            sys.exit(1)
