"""Worker classes that ``manage.py run_worker`` imports by dotted path in the tests."""

from __future__ import annotations

from typing import Any

from resource_lease import Worker


class Echo(Worker):
    """Done unless the key starts with "bad"; ttl short enough for tests."""

    dispenser = "cmd"
    batch = 4
    ttl = 10.0
    max_attempts = 1
    poll = 0.2

    def do_work(self, key: str, payload: Any) -> bool:
        return not key.startswith("bad")
