"""A ResourceHolder in another process (tests/procs/holder_worker.py): killed, paused, terminated."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from typing import Any

import pytest

from resource_lease import pool
from resource_lease.exceptions import NoResourceAvailable
from resource_lease.lease import acquire
from resource_lease.models import Resource
from tests.holder_helpers import Holder, state_of, wait_for


class Events:
    """JSON lines from a worker's stdout, read by a thread, waited for by event name."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.queue.put(json.loads(line))

    def next(self, event: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self.queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {event!r} from the worker within {timeout}s") from None
            if item["event"] == event:
                return item


def start_worker(spawn_worker: Any, kind: str, ttl: float, renew_interval: float) -> tuple[Any, Events]:
    proc = spawn_worker("tests.procs.holder_worker", kind, str(ttl), str(renew_interval), stdout=subprocess.PIPE)
    return proc, Events(proc)


def wait_renewed(pk: int) -> Resource:
    def renewed() -> Resource | None:
        row = Resource.objects.get(pk=pk)
        return row if row.renewed_at is not None and row.renewed_at > row.acquired_at else None

    return wait_for(renewed, what="a renewal by the worker")


@pytest.mark.faults
def test_sigkill_frees_the_resource_after_ttl_and_not_before(make_pool: Any, spawn_worker: Any) -> None:
    row = make_pool("h", 1)[0]
    proc, events = start_worker(spawn_worker, "h", 1.5, 0.3)
    held = events.next("acquired")
    wait_renewed(row.pk)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    expiry = Resource.objects.get(pk=row.pk).busy_before  # nobody renews it any more

    refused_while_live = 0
    deadline = time.monotonic() + 20
    while True:
        try:
            lease = acquire("h", ttl=5, timeout=0)
            break
        except NoResourceAvailable:
            if pool.database_now() < expiry:
                refused_while_live += 1
        assert time.monotonic() < deadline, "the killed holder's resource never came free"
        time.sleep(0.02)
    assert refused_while_live >= 1
    assert lease.resource.acquired_at >= expiry  # granted only once the lease had run out
    assert lease.resource.took_over and lease.resource.previous_holder == held["holder"]
    assert lease.fence == held["fence"] + 1
    lease.release()


@pytest.mark.faults
def test_a_paused_holder_notices_on_resume_and_moves_to_another_resource(
    make_pool: Any, spawn_worker: Any, holders: Any
) -> None:
    make_pool("h", 2)
    proc, events = start_worker(spawn_worker, "h", 1.0, 0.2)
    first = events.next("acquired")
    wait_renewed(first["pk"])
    proc.send_signal(signal.SIGSTOP)
    try:

        class Takeover(Holder):
            def search(self) -> Any:
                return self.candidates().filter(pk=first["pk"])

        # While it is paused its lease runs out, and another holder takes the resource.
        taker = holders(Takeover, ttl=5, renew_interval=1)
        taken = taker.acquire(timeout=20)
        taker.start()
        assert taken.resource.pk == first["pk"] and taken.fence == first["fence"] + 1
        assert taken.resource.took_over and taken.resource.previous_holder == first["holder"]
    finally:
        proc.send_signal(signal.SIGCONT)

    lost = events.next("lost")
    assert (lost["pk"], lost["fence"]) == (first["pk"], first["fence"])
    second = events.next("acquired")
    assert second["pk"] != first["pk"]
    assert events.next("fenced")["ok"] is False  # the old lease's fenced write is refused
    assert taken.is_held() and taker.fence == first["fence"] + 1  # untouched by the resumed one


@pytest.mark.faults
def test_sigterm_with_the_handler_installed_releases_at_once(make_pool: Any, spawn_worker: Any) -> None:
    row = make_pool("h", 1)[0]
    proc, events = start_worker(spawn_worker, "h", 30, 10)
    events.next("acquired")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    row.refresh_from_db()
    assert state_of(row.pk) == "free" and row.grant_token == "" and row.released_at is not None
