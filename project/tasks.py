"""The demo's Celery tasks: crawling pages through leased proxies (``manage.py demo_celery``)."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from celery import shared_task

from resource_lease.contrib.celery import LeaseTask


@shared_task(
    bind=True,
    base=LeaseTask,
    lease_kind="proxy",
    # The ttl comes from RESOURCE_LEASE["TTL"]; the lease is renewed while the body runs.
    lease_retry_countdown=0.25,
    lease_retry_countdown_max=2.0,
    max_retries=None,  # wait for a proxy as long as it takes; each wait is a retry, not a busy slot
    acks_late=True,
)
def crawl(self: LeaseTask, page: str, work: float = 0.2) -> dict[str, Any]:
    """Pretend to fetch ``page`` through the leased proxy for ``work`` seconds.

    Returns what the demo's ledger needs: which resource under which fence, and when (the
    machine's monotonic clock, shared by every process on it), so the summary can check that
    no proxy served two tasks at once.
    """
    lease = self.lease
    proxy_url = lease.resource.data.get("url", "")
    start = time.monotonic_ns()
    deadline = time.monotonic() + work
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))
        lease.check()  # raises LeaseLost if the proxy is no longer ours: stop using it
    end = time.monotonic_ns()
    return {
        "task": self.request.id,
        "page": page,
        "resource": lease.resource.name,
        "resource_id": lease.resource.pk,
        "proxy": proxy_url,
        "fence": lease.fence,
        "start_ns": start,
        "end_ns": end,
        "attempts": self.request.retries + 1,
        "worker": f"{socket.gethostname()}:{os.getpid()}",
    }
