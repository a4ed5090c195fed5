"""Tasks that tests/test_celery.py runs in a real worker (``celery -A project worker -I tests.procs.celery_tasks``).

They lease from the kind ``celery-test`` with short ttls, and leave evidence in a directory
the test names: a ``started-<task id>.<retry>`` marker (holder and fence) as soon as the body
runs, and a line in the exclusion ledger (tests/ledger.py) for every grant they finish.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from project.celery import app
from resource_lease.contrib.celery import LeaseTask
from resource_lease.exceptions import LeaseLost
from tests.grants import Grant
from tests.ledger import critical_section, record

KIND = "celery-test"

_short = {
    "bind": True,
    "base": LeaseTask,
    "lease_kind": KIND,
    "lease_ttl": 2.0,
    "lease_retry_countdown": 0.2,
    "lease_retry_countdown_max": 1.0,
    "max_retries": None,
    "acks_late": True,
}


def _started(task: LeaseTask, directory: str) -> Path:
    lease = task.lease
    marker = Path(directory) / f"started-{task.request.id}.{task.request.retries}"
    # Whole or not at all: the test reads the marker as soon as it exists (it once read an
    # empty file written halfway).
    partial = marker.with_name(f".partial-{marker.name}")
    partial.write_text(f"{lease.holder}\n{lease.fence}\n{os.getpid()}\n")
    os.replace(partial, marker)
    return marker


def _hold(task: LeaseTask, directory: str, seconds: float) -> dict[str, Any]:
    lease = task.lease
    worker = f"{os.getpid()}-{threading.get_ident()}"
    start = time.monotonic_ns()
    critical_section(Path(directory), lease.resource.pk, seconds)
    end = time.monotonic_ns()
    lease.check()  # the ledger may only record a grant that was still ours at the end
    record(Path(directory), Grant(lease.resource.pk, lease.fence, worker, start, end))
    return {
        "resource": lease.resource.pk,
        "fence": lease.fence,
        "holder": lease.holder,
        "retries": task.request.retries,
        "took_over": lease.resource.took_over,
        "previous_holder": lease.resource.previous_holder,
        "acquired_at": lease.resource.acquired_at.isoformat() if lease.resource.acquired_at else None,
    }


def _hold_once_long(task: LeaseTask, directory: str, seconds: float, first_seconds: float | None) -> dict[str, Any]:
    redelivery = any(Path(directory).glob(f"started-{task.request.id}.*"))
    _started(task, directory)
    if first_seconds is not None and not redelivery:
        seconds = first_seconds
    return _hold(task, directory, seconds)


@app.task(name="tests.hold", **_short)
def hold(self: LeaseTask, directory: str, seconds: float, first_seconds: float | None = None) -> dict[str, Any]:
    """Hold the lease ``seconds`` in the ledger's critical section.

    With ``first_seconds``, the first delivery of the message holds that long instead (so a
    test can kill it) and a redelivery, which finds its own earlier marker, holds ``seconds``.
    """
    return _hold_once_long(self, directory, seconds, first_seconds)


@app.task(name="tests.hold_requeue_on_worker_lost", **(_short | {"reject_on_worker_lost": True}))
def hold_requeue_on_worker_lost(
    self: LeaseTask, directory: str, seconds: float, first_seconds: float | None = None
) -> dict[str, Any]:
    """Like hold; if the pool process running it dies, the message goes back to the queue."""
    return _hold_once_long(self, directory, seconds, first_seconds)


@app.task(name="tests.hold_long_ttl", **(_short | {"lease_ttl": 60.0}))
def hold_long_ttl(self: LeaseTask, directory: str, seconds: float) -> dict[str, Any]:
    """Like hold, with a ttl far longer than any test: only a release frees the resource."""
    _started(self, directory)
    return _hold(self, directory, seconds)


@app.task(name="tests.hold_few_retries", **(_short | {"max_retries": 2}))
def hold_few_retries(self: LeaseTask, directory: str) -> dict[str, Any]:
    return _hold(self, directory, 0.01)


@app.task(name="tests.retry_once", **(_short | {"lease_ttl": 60.0}))
def retry_once(self: LeaseTask, directory: str) -> dict[str, Any]:
    """Asks Celery for a retry on its first run: the resource must be free for the second."""
    _started(self, directory)
    if self.request.retries == 0:
        raise self.retry(countdown=0.1)
    return _hold(self, directory, 0.01)


@app.task(name="tests.fail", **(_short | {"lease_ttl": 60.0}))
def fail(self: LeaseTask, directory: str) -> None:
    _started(self, directory)
    raise RuntimeError("the body failed on purpose")


# 4 s: room for a fresh pool process's first connection and grant on a loaded machine (with
# 1.5 s, a long run once saw the limit kill the task before it wrote its marker).
@app.task(name="tests.stuck", time_limit=4.0, **_short)
def stuck(self: LeaseTask, directory: str) -> None:
    """Runs into its hard time limit, which kills the pool process holding the lease."""
    _started(self, directory)
    time.sleep(60)


@app.task(name="tests.watch_loss", **_short)
def watch_loss(self: LeaseTask, directory: str, seconds: float) -> dict[str, Any]:
    """Waits for the lease to be lost (a test force-releases it), then checks it."""
    _started(self, directory)
    lost = self.lease.lost_event.wait(seconds)
    try:
        self.lease.check()
        check_raised = False
    except LeaseLost:
        check_raised = True
    return {"lost": lost, "reason": self.lease.lost_reason, "check_raised": check_raised}


@app.task(name="tests.plain_noop")
def plain_noop() -> int:
    """The overhead benchmark's baseline: a task that does nothing."""
    return os.getpid()


@app.task(name="tests.leased_noop", bind=True, base=LeaseTask, lease_kind="celery-bench", lease_ttl=30.0)
def leased_noop(self: LeaseTask) -> int:
    """The same nothing, holding a lease while doing it."""
    return self.lease.fence
