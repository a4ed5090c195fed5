"""Programs that tests run as separate processes (``python -m tests.procs.NAME``)."""

from __future__ import annotations

import os


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
