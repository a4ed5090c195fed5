"""Worker classes that ``manage.py run_worker`` imports by dotted path in the tests."""

from __future__ import annotations

import os
from typing import Any

from resource_lease import FolderWorker, Worker


class Echo(Worker):
    """Done unless the key starts with "bad"; ttl short enough for tests."""

    dispenser = "cmd"
    batch = 4
    ttl = 10.0
    max_attempts = 1
    poll = 0.2

    def do_work(self, key: str, payload: Any) -> bool:
        return not key.startswith("bad")


class CutFiles(FolderWorker):
    """The crawler farm's task folder: only ``*-cut`` files are this worker's (folder from
    ``RESOURCE_LEASE_TEST_FOLDER``)."""

    folder = os.environ.get("RESOURCE_LEASE_TEST_FOLDER", ".")
    pattern = r".*-cut"
    poll = 0.2

    def do_work(self, key: str, payload: Any) -> bool:
        return True


class OnDown(Echo):
    """A worker whose database alias never answers (tests/test_database_down.py)."""

    using = "down"
