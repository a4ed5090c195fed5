"""What the ResourceHolder tests (tests/test_holder_*.py) share: a test holder, and helpers.

The ``holders`` fixture (holders made by a test are terminated after it) is in tests/conftest.py.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from resource_lease import pool
from resource_lease.holder import ResourceHolder
from resource_lease.lease import Lease
from resource_lease.models import Resource

OLD = dt.datetime(1960, 1, 1, tzinfo=dt.UTC)


class Holder(ResourceHolder):
    """A test holder: ``data["valid"] = False`` is invalid, ``data["boom"]`` makes is_valid raise."""

    kind = "h"
    ttl = 1.0
    renew_interval = 0.2

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.losses: list[tuple[int, int, str]] = []
        self.on_lost_called = threading.Event()
        self.broken: set[int] = set()

    def is_valid(self) -> bool:
        resource = self.resource
        assert resource is not None
        if resource.data.get("boom"):
            raise RuntimeError("a bug in is_valid")
        if not resource.data.get("valid", True) or resource.pk in self.broken:
            self.invalid_reason = f"{resource.name} is marked invalid"
            return False
        return True

    def on_lost(self) -> None:
        lease = self.lost_lease
        assert lease is not None
        self.losses.append((lease.resource.pk, lease.fence, self.lost_reason))
        self.on_lost_called.set()
        super().on_lost()


class Searching(Holder):
    """The same through the search/lock steps instead of the engine's acquire."""

    def search(self) -> Any:
        return self.candidates()


class ReportsStops:
    """Test mixin for a holder: ``closed`` is set when a close() (terminate()'s too) has
    returned, ``loss_handled`` when the thread's handling of a loss (its re-acquire) is over."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # type: ignore[call-arg]
        self.closed = threading.Event()
        self.loss_handled = threading.Event()

    def close(self) -> bool:
        released: bool = super().close()  # type: ignore[misc]
        self.closed.set()
        return released

    def _handle_loss(self, lease: Lease, validated: bool, reason: str) -> None:
        try:
            super()._handle_loss(lease, validated, reason)  # type: ignore[misc]
        finally:
            self.loss_handled.set()


def wait_for(condition: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def state_of(pk: int) -> str:
    return str(pool.with_state(Resource.objects.filter(pk=pk)).values_list("state", flat=True)[0])


# -- local HTTP servers, for the proxy tests ----------------------------------------------


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def url_of(server: ThreadingHTTPServer, credentials: str = "") -> str:
    host, port = server.server_address[:2]
    return f"http://{credentials}{host!s}:{port}"
