"""The base of the app's commands: output piped into ``head`` (or a pager that quits) ends
the command quietly, never with a BrokenPipeError traceback."""

from __future__ import annotations

import os
import sys

from django.core.management.base import BaseCommand


class LeaseCommand(BaseCommand):
    def run_from_argv(self, argv: list[str]) -> None:
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
