"""The HTTP API served by real uvicorn processes on each database (docs/http.md): two
servers that share nothing but the database, clients and servers SIGKILLed while they wait,
a holder that stops renewing, and 60 bad requests that change nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from resource_lease.api.tokens import create_token
from resource_lease.client.lease_client import ApiError, LeaseClient, LeaseGone, NotGranted
from resource_lease.lease import acquire
from resource_lease.models import ApiToken, IdempotencyKey, LeaseEvent, Resource, Waiter
from tests.conftest import REPO, worker_env

CLIENT = str(REPO / "resource_lease" / "client" / "lease_client.py")


def until(check: Callable[[], bool], seconds: float, what: str) -> None:
    """Wait for ``check()`` (a liveness bound, not a measure of speed)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not within {seconds:g}s: {what}"
        time.sleep(0.05)


def live_waiters(kind: str = "gpu") -> int:
    return Waiter.objects.live().filter(kind=kind).count()


@pytest.fixture
def token(make_pool: Callable[..., Any]) -> str:
    make_pool("gpu", 2)
    return create_token("crawler", "gpu")[1]


def test_renew_through_one_server_release_through_the_other(servers: Any, token: str) -> None:
    a, b = servers(2)
    one, other = LeaseClient(a.url, token), LeaseClient(b.url, token)
    lease = one.acquire("gpu", ttl=10)
    renewed = other.renew(lease["id"], ttl=20)
    assert renewed["fence"] == lease["fence"] and renewed["expires_at"] > lease["expires_at"]
    assert one.get(lease["id"])["held"] is True
    assert other.release(lease["id"]) is True
    assert one.get(lease["id"])["held"] is False
    with pytest.raises(LeaseGone):
        one.renew(lease["id"])
    # A restarted server answers for the leases of its previous life.
    again = one.acquire("gpu", ttl=10)
    a.stop()
    (c,) = servers(1)
    assert LeaseClient(c.url, token).renew(again["id"])["fence"] == again["fence"]


def test_a_long_poll_is_served_in_line_with_python_callers(servers: Any, token: str) -> None:
    """The HTTP waiter came first: the release goes to it, not to the Python waiter behind it,
    and its release goes to the Python waiter (one line, first come, first served)."""
    (a,) = servers(1)
    held = [acquire("gpu", ttl=30), acquire("gpu", ttl=30)]
    answer: dict[str, Any] = {}
    http_waiter = threading.Thread(
        target=lambda: answer.update(LeaseClient(a.url, token).acquire("gpu", ttl=10, wait=60))
    )
    http_waiter.start()
    until(lambda: live_waiters() == 1, 30, "the long poll took a place in line")
    python_got: list[Any] = []
    python_waiter = threading.Thread(target=lambda: python_got.append(acquire("gpu", ttl=10, timeout=60)))
    python_waiter.start()
    until(lambda: live_waiters() == 2, 30, "a Python waiter behind it")
    held[0].release()
    http_waiter.join(60)
    assert answer["name"] == held[0].resource.name and answer["fence"] > held[0].fence
    assert not python_got  # still waiting: the HTTP waiter was ahead
    assert LeaseClient(a.url, token).release(answer["id"])
    python_waiter.join(60)
    assert python_got[0].resource.name == held[0].resource.name and python_got[0].fence > answer["fence"]
    python_got[0].release()
    held[1].release()


@pytest.mark.parametrize("killed", [True, False], ids=["killed", "alive-control"])
def test_a_client_killed_while_waiting_leaves_the_line(servers: Any, token: str, killed: bool) -> None:
    (a,) = servers(1)
    held = [acquire("gpu", ttl=60), acquire("gpu", ttl=60)]
    env = {**worker_env(), "RESOURCE_LEASE_TOKEN": token}
    client = subprocess.Popen(
        [sys.executable, CLIENT, "acquire", "--url", a.url, "--kind", "gpu", "--ttl", "2", "--wait", "60"],
        env=env,
        stdout=subprocess.PIPE,
    )
    try:
        until(lambda: live_waiters() == 1, 30, "the client took a place in line")
        if killed:
            client.send_signal(signal.SIGKILL)
            client.wait(30)
        # Within its ttl (2 s; the server usually leaves at once, when the connection drops).
        deadline = time.monotonic() + 2 * 2 + 5
        while live_waiters() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (live_waiters() == 0) is killed
        if killed:
            held[0].release()
            got = acquire("gpu", ttl=5, timeout=10)  # nobody dead ahead of a Python waiter
            assert got.resource.name == held[0].resource.name
            got.release()
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(30)
        for lease in held:
            lease.release()


def test_a_server_killed_while_clients_wait_grants_nothing_twice(servers: Any, token: str) -> None:
    """Four clients wait through server A, which is SIGKILLed; each retries through B with its
    idempotency key and gets its lease or none, never two, while the pool is released."""
    a, b = servers(2)
    held = [acquire("gpu", ttl=60), acquire("gpu", ttl=60)]
    results: dict[int, Any] = {}

    def client(i: int) -> None:
        url, key = a.url, f"job-{i}"
        for _ in range(60):
            try:
                lease = LeaseClient(url, token).acquire("gpu", ttl=3, wait=20, idempotency_key=key)
            except NotGranted:
                results[i] = None
                return
            except ApiError as exc:
                if exc.status != 0:
                    results[i] = exc
                    return
                url = b.url  # the server is gone: the same key through the other one
                continue
            renewed = LeaseClient(b.url, token).renew(lease["id"], ttl=30)  # it is really ours
            results[i] = (lease["name"], lease["fence"], renewed["fence"])
            return

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    until(lambda: live_waiters() == 4, 30, "four long polls in line")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(30)
    for lease in held:
        lease.release()
    for thread in threads:
        thread.join(120)
    assert len(results) == 4 and not any(isinstance(r, Exception) for r in results.values()), results
    grants = [r for r in results.values() if r is not None]
    assert len(grants) <= 2 and len({(name, fence) for name, fence, _ in grants}) == len(grants)
    assert all(fence == renewed for _, fence, renewed in grants)
    for key in IdempotencyKey.objects.all():
        assert Resource.objects.live().filter(holder=key.holder).count() <= 1


def test_a_retry_while_the_first_attempt_waits_gets_the_same_lease(servers: Any, token: str) -> None:
    """Two requests with one idempotency key, through two servers: the second takes no place
    in line, waits for the first, and answers its lease."""
    a, b = servers(2)
    held = [acquire("gpu", ttl=60), acquire("gpu", ttl=60)]
    answers: dict[str, Any] = {}

    def ask(name: str, url: str) -> None:
        answers[name] = LeaseClient(url, token).acquire("gpu", ttl=10, wait=30, idempotency_key="once")

    first = threading.Thread(target=ask, args=("first", a.url))
    first.start()
    until(lambda: live_waiters() == 1, 30, "the first attempt in line")
    second = threading.Thread(target=ask, args=("second", b.url))
    second.start()
    time.sleep(0.5)  # the second asks meanwhile; it must not take a place of its own
    assert live_waiters() == 1
    held[0].release()
    first.join(60)
    second.join(60)
    assert (answers["first"]["name"], answers["first"]["fence"]) == (
        answers["second"]["name"],
        answers["second"]["fence"],
    )
    assert Resource.objects.live().filter(kind="gpu").count() == 2  # held[1] and the one lease
    held[1].release()


@pytest.mark.parametrize("renewing", [False, True], ids=["stops-renewing", "renewing-control"])
def test_a_client_that_stops_renewing_gets_410_and_the_next_holder_a_higher_fence(
    servers: Any, token: str, renewing: bool
) -> None:
    a, b = servers(2)
    held = acquire("gpu", ttl=60)  # one left to lease
    first = LeaseClient(a.url, token).acquire("gpu", ttl=1)
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(0.25):
            LeaseClient(a.url, token).renew(first["id"])

    keeper = threading.Thread(target=keep)
    if renewing:
        keeper.start()
    try:
        try:
            second = LeaseClient(b.url, token).acquire("gpu", ttl=10, wait=4)
        except NotGranted:
            second = None
    finally:
        stop.set()
        if renewing:
            keeper.join()
    if renewing:
        assert second is None
        assert LeaseClient(b.url, token).renew(first["id"])["fence"] == first["fence"]
    else:
        assert second is not None and second["name"] == first["name"] and second["fence"] > first["fence"]
        with pytest.raises(LeaseGone):
            LeaseClient(b.url, token).renew(first["id"])
    held.release()


def _raw(url: str, method: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _bad_requests(lease_id: str, other_lease_id: str) -> list[tuple[str, str, Any, str | None]]:
    """60 bad requests: (method, path, body: bytes or JSON-able, token: None = the good one,
    "" = none, else that text)."""
    big = {"kind": "gpu", "holder": "x" * 70_000}
    cases: list[tuple[str, str, Any, str | None]] = []
    for body in (
        {},  # no kind
        {"kind": ""},
        {"kind": 5},
        {"kind": ["gpu"]},
        {"kind": "@lock"},
        {"kind": "x" * 101},
        {"kind": "gp\u0000u"},
        {"kind": "gpu", "ttl": 0},
        {"kind": "gpu", "ttl": -1},
        {"kind": "gpu", "ttl": "30"},
        {"kind": "gpu", "ttl": True},
        {"kind": "gpu", "ttl": 1e300},
        {"kind": "gpu", "wait": -1},
        {"kind": "gpu", "wait": 301},
        {"kind": "gpu", "wait": "soon"},
        {"kind": "gpu", "where": "region=eu"},
        {"kind": "gpu", "where": {"region": 1.5}},
        {"kind": "gpu", "where": {"": "eu"}},
        {"kind": "gpu", "where": {"region": ["eu"]}},
        {"kind": "gpu", "priority": 1.5},
        {"kind": "gpu", "priority": "high"},
        {"kind": "gpu", "priority": 2**40},
        {"kind": "gpu", "priority": False},
        {"kind": "gpu", "holder": ""},
        {"kind": "gpu", "holder": 7},
        {"kind": "gpu", "holder": "h" * 101},
        {"kind": "gpu", "idempotency_key": ""},
        {"kind": "gpu", "idempotency_key": 42},
        {"kind": "gpu", "idempotency_key": "k" * 201},
        {"kind": "gpu", "target": "t" * 201},
        {"kind": "gpu", "session": ""},
        {"kind": "gpu", "colour": "red"},
    ):
        cases.append(("POST", "leases", body, None))
    for raw in (b"{", b"[]", b'"gpu"', b"null", b"\xff\xfe", b'{"kind": "gpu",}', b"{'kind': 'gpu'}"):
        cases.append(("POST", "leases", raw, None))
    cases.append(("POST", "leases", big, None))  # too large: 413
    cases.append(("POST", "leases", b"[" * 100_000, None))  # too large, and too deep
    cases += [
        ("POST", "leases", {"kind": "gpu"}, ""),  # no token
        ("POST", "leases", {"kind": "gpu"}, "rl_wrong"),
        ("POST", "leases", {"kind": "gpu"}, "Basic abc"),
        ("GET", "pools", None, "rl_wrong"),
        ("POST", "leases", {"kind": "proxy"}, None),  # outside the token's kinds: 403
        ("POST", f"leases/{lease_id}/renew", {"ttl": 0}, None),
        ("POST", f"leases/{lease_id}/renew", {"ttl": "10"}, None),
        ("POST", f"leases/{lease_id}/renew", {"fence": 99}, None),
        ("POST", f"leases/{lease_id}/renew", b"{oops", None),
        ("POST", f"leases/{lease_id}/release", {"cooldown": -5}, None),
        ("POST", f"leases/{lease_id}/release", {"cooldown": 5}, None),  # a lease without a target
        ("POST", f"leases/{lease_id}/report", {"outcome": "great"}, None),
        ("POST", f"leases/{lease_id}/report", {"outcome": "blocked", "retry_after": 0}, None),
        ("POST", f"leases/{lease_id}/report", {}, None),
        ("POST", "leases/not-an-id/renew", {}, None),
        ("POST", f"leases/{lease_id[:-3]}xyz/release", {}, None),
        ("POST", f"leases/{other_lease_id}/release", {}, None),  # another token's: 403
        ("GET", f"leases/{other_lease_id}", None, None),
        ("GET", "leases", None, None),  # wrong method: 405
    ]
    return cases


def _snapshot() -> Any:
    return (
        list(Resource.objects.order_by("pk").values_list("pk", "holder", "fence", "busy_before", "grant_token")),
        Waiter.objects.count(),
        IdempotencyKey.objects.count(),
        list(ApiToken.objects.order_by("pk").values_list("pk", "revoked_at")),
        LeaseEvent.objects.count(),
    )


def test_sixty_bad_requests_each_a_clear_4xx_and_nothing_written(servers: Any, token: str) -> None:
    (a,) = servers(1)
    lease = LeaseClient(a.url, token).acquire("gpu", ttl=60)
    other = LeaseClient(a.url, create_token("other", "gpu")[1]).acquire("gpu", ttl=60)
    cases = _bad_requests(lease["id"], other["id"])
    assert len(cases) == 60
    before = _snapshot()
    tally: dict[int, int] = {}
    for method, path, body, who in cases:
        headers = {"Content-Type": "application/json"}
        auth = f"Bearer {token}" if who is None else who if who.startswith("Basic") else f"Bearer {who}" if who else ""
        if auth:
            headers["Authorization"] = auth
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        status, answer = _raw(a.url + path, method, data, headers)
        assert 400 <= status < 500, (method, path, body, status, answer)
        tally[status] = tally.get(status, 0) + 1
        if status not in (405,):
            parsed = json.loads(answer)
            assert parsed["error"], (path, body, parsed)
            if status == 400:
                assert parsed["field"], (path, body, parsed)
    assert _snapshot() == before
    print("60 bad requests:", dict(sorted(tally.items())))
