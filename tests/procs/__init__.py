"""Programs that tests run as separate processes (``python -m tests.procs.NAME``).

Most take their arguments on the command line and print or record what they saw. The fault
suite's workers (churn, dispenser_op, fork, holder, resource_holder) speak JSON lines
instead, events out and commands in, and share instrument.py; tests/faults/conftest.py's
``start_child`` runs them.
"""

from __future__ import annotations

import os


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
