"""ProxyHolder: real proxies on 127.0.0.1, some of them broken."""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.db import connections as django_connections

from resource_lease import pool
from resource_lease.contrib.proxy import ProxyHolder, probe_proxy
from resource_lease.db.connections import close_connections
from resource_lease.exceptions import NoResourceAvailable
from resource_lease.models import Resource
from tests.holder_helpers import OLD, QuietHandler, ReportsStops, serve, state_of, url_of, wait_for


@pytest.fixture
def proxies() -> Iterator[dict[str, Any]]:
    """A target site, two working proxies (one with credentials) and broken ones."""
    hits: list[str] = []
    release = threading.Event()

    class Target(QuietHandler):
        def do_GET(self) -> None:
            hits.append(self.headers.get("X-Proxied-By", "directly"))
            body = b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def relay(name: str, credentials: str | None = None) -> type[BaseHTTPRequestHandler]:
        class Relay(QuietHandler):
            def do_GET(self) -> None:
                if credentials is not None:
                    expected = "Basic " + base64.b64encode(credentials.encode()).decode()
                    if self.headers.get("Proxy-Authorization") != expected:
                        self.send_response(407, "Proxy Authentication Required")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                target = urlsplit(self.path)  # a proxy is sent the absolute URL
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=5)
                conn.request("GET", target.path or "/", headers={"X-Proxied-By": name})
                answer = conn.getresponse()
                body = answer.read()
                conn.close()
                self.send_response(answer.status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Relay

    class BadGateway(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(502, "Bad Gateway")
            self.send_header("Content-Length", "0")
            self.end_headers()

    class Hang(QuietHandler):
        def do_GET(self) -> None:
            release.wait(30)  # never answers within the probe's timeout

    servers = {
        "target": serve(Target),
        "good1": serve(relay("good1", credentials="user:secret")),
        "good2": serve(relay("good2")),
        "bad_gateway": serve(BadGateway),
        "hang": serve(Hang),
    }
    with socket.socket() as sock:  # a port nobody listens on: connections are refused
        sock.bind(("127.0.0.1", 0))
        refused_port = sock.getsockname()[1]
    yield {"servers": servers, "hits": hits, "refused_port": refused_port}
    release.set()
    for server in servers.values():
        server.shutdown()
        server.server_close()


def test_proxy_holder_holds_only_working_proxies_and_quarantines_broken_ones(
    make_pool: Any, holders: Any, proxies: dict[str, Any]
) -> None:
    servers = proxies["servers"]
    good = {
        url_of(servers["good1"], "user:secret@"),
        url_of(servers["good2"]).removeprefix("http://"),  # bare host:port is a proxy too
    }
    broken = {
        "refused": (f"http://127.0.0.1:{proxies['refused_port']}", "refused"),
        "bad-gateway": (url_of(servers["bad_gateway"]), "HTTP 502 Bad Gateway"),
        "hang": (url_of(servers["hang"]), "timed out"),
        "wrong-password": (url_of(servers["good1"], "user:wrong@"), "HTTP 407"),
        "no-url": (None, 'no proxy URL in data["url"]'),
    }
    # Broken ones sort first (least recently used), so every one of them is probed.
    for i, (name, (url, _)) in enumerate(broken.items()):
        data = {} if url is None else {"url": url}
        Resource.objects.create(kind="proxy", name=name, data=data, busy_before=OLD + dt.timedelta(days=i))
    for i, url in enumerate(sorted(good)):
        Resource.objects.create(kind="proxy", name=f"good-{i}", data={"url": url})

    class Crawler(ProxyHolder):
        probe_timeout = 0.5

    target = url_of(servers["target"]) + "/probe"
    first, second = (holders(Crawler, probe_url=target, ttl=10, quarantine_seconds=60) for _ in range(2))
    first.acquire(timeout=30)
    second.acquire(timeout=30)
    assert {first.proxy_url, second.proxy_url} == good
    assert first.holding and second.holding
    assert sorted(set(proxies["hits"])) == ["good1", "good2"]  # really fetched through them
    with pytest.raises(NoResourceAvailable):
        holders(Crawler, probe_url=target).acquire(timeout=0.3)

    for name, (_, reason) in broken.items():
        row = Resource.objects.get(kind="proxy", name=name)
        assert state_of(row.pk) == "quarantined", name
        assert reason in row.quarantine_reason, (name, row.quarantine_reason)
        assert "secret" not in row.quarantine_reason and "wrong" not in row.quarantine_reason
    assert pool.counts()["proxy"] == {
        "free": 0,
        "held": 2,
        "expired": 0,
        "quarantined": 5,
        "disabled": 0,
        "total": 7,
    }


@pytest.mark.parametrize("stop", ["close", "terminate"])
def test_close_while_the_threads_re_acquire_checks_a_working_proxy_does_not_quarantine_it(
    make_pool: Any, holders: Any, proxies: dict[str, Any], stop: str
) -> None:
    servers = proxies["servers"]
    row = Resource.objects.create(kind="proxy", name="good", data={"url": url_of(servers["good2"])})

    class PausedCheck(ReportsStops, ProxyHolder):
        """The thread's is_valid() waits for ``go_on`` before it looks at the candidate."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.checking, self.go_on = threading.Event(), threading.Event()

        def is_valid(self) -> bool:
            if threading.current_thread() is self:
                self.checking.set()
                assert self.go_on.wait(30), "the test never let the thread go on"
            return super().is_valid()

    holder = holders(PausedCheck, probe_url=url_of(servers["target"]) + "/probe", ttl=2, renew_interval=0.2)
    old = holder.acquire(timeout=10)
    holder.start()
    pool.force_release([row])
    assert holder.checking.wait(15), "the thread never re-acquired"
    candidate = holder.lease
    assert candidate is not None and candidate.fence == old.fence + 1 and not holder.holding

    stopper = None
    if stop == "close":
        assert holder.close() is True  # the candidate was stored: close() releases it
    else:
        stopper = threading.Thread(target=holder.terminate, kwargs={"timeout": 30})
        stopper.start()
        assert holder.closed.wait(10), "terminate() never got through close()"
    holder.go_on.set()  # is_valid() now finds no resource: that is no verdict on the proxy
    assert holder.loss_handled.wait(15), "the thread's re-acquire never ended"
    if stopper is not None:
        stopper.join(30)
    else:
        holder.terminate(timeout=30)
    assert not holder.is_alive()

    final = Resource.objects.get(pk=row.pk)
    assert (final.quarantined_until, final.quarantine_reason) == (None, ""), final.quarantine_reason
    assert state_of(row.pk) == "free" and final.fence == candidate.fence
    assert holder.lease is None and holder.close() is False


def _call_in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Start ``call`` in a thread of its own; the list gets its result or the exception it
    raised. The thread closes its own connections (the engine's and Django's) at the end."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # noqa: BLE001  (the outcome is what the test checks)
            outcome.append(exc)
        finally:
            close_connections()
            django_connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_a_candidate_lost_while_is_valid_checks_it_is_not_quarantined(
    make_pool: Any, holders: Any, proxies: dict[str, Any]
) -> None:
    """acquire() (caller's thread) asks is_valid() of a fresh candidate while the holder's
    thread, renewing it, finds it force-released and drops it: is_valid() then sees no
    resource. That is no verdict on the proxy: it is not quarantined, and acquire() goes on to
    a fresh grant."""
    servers = proxies["servers"]
    row = Resource.objects.create(kind="proxy", name="good", data={"url": url_of(servers["good2"])})

    class PausedOnce(ProxyHolder):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.checking, self.go_on, self.paused = threading.Event(), threading.Event(), False

        def is_valid(self) -> bool:
            if not self.paused and threading.current_thread() is not self:
                self.paused = True
                self.checking.set()
                assert self.go_on.wait(30), "the test never let acquire() go on"
            return super().is_valid()

    holder = holders(PausedOnce, probe_url=url_of(servers["target"]) + "/probe", ttl=2, renew_interval=0.1)
    holder.start()  # its thread renews the candidate while it is being checked
    acquirer, got = _call_in_thread(lambda: holder.acquire(timeout=20))
    assert holder.checking.wait(15), "acquire() never asked is_valid()"
    first = holder.lease
    assert first is not None and first.fence == 1
    assert pool.force_release([row]) == 1
    wait_for(lambda: holder.lease is None, timeout=10, what="the thread dropping the lost candidate")
    holder.go_on.set()
    acquirer.join(30)
    final = Resource.objects.get(pk=row.pk)
    assert (final.quarantined_until, final.quarantine_reason) == (None, ""), final.quarantine_reason
    assert len(got) == 1 and got[0].resource.pk == row.pk and got[0].fence == 2 and holder.holding


def test_close_while_fix_checks_a_working_proxy_neither_quarantines_it_nor_acquires_again(
    make_pool: Any, holders: Any, proxies: dict[str, Any]
) -> None:
    """fix() asks is_valid() of the held proxy; close() from another thread lands meanwhile, so
    is_valid() finds no resource. That is no verdict: nothing is quarantined, and fix() stops
    (cancelled) instead of acquiring a fresh resource for a holder that was just closed."""
    servers = proxies["servers"]
    rows = [
        Resource.objects.create(kind="proxy", name=f"good{i}", data={"url": url_of(servers["good2"])}) for i in range(2)
    ]

    class PausedCheck(ProxyHolder):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.pause_next, self.checking, self.go_on = False, threading.Event(), threading.Event()

        def is_valid(self) -> bool:
            if self.pause_next:
                self.checking.set()
                assert self.go_on.wait(30), "the test never let fix() go on"
            return super().is_valid()

    holder = holders(PausedCheck, probe_url=url_of(servers["target"]) + "/probe", ttl=30, renew_interval=5)
    held = holder.acquire(timeout=10)
    holder.pause_next = True
    fixer, outcome = _call_in_thread(lambda: holder.fix(timeout=5))
    assert holder.checking.wait(15), "fix() never asked is_valid()"
    assert holder.close() is True
    holder.go_on.set()
    fixer.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], NoResourceAvailable), outcome
    assert "closed" in str(outcome[0])
    for row in rows:
        final = Resource.objects.get(pk=row.pk)
        assert (final.quarantined_until, final.quarantine_reason) == (None, ""), final.quarantine_reason
        assert state_of(row.pk) == "free"
    assert Resource.objects.get(pk=held.resource.pk).fence == held.fence  # nothing granted since
    assert sum(Resource.objects.get(pk=row.pk).fence for row in rows) == held.fence  # no fresh grant
    assert holder.lease is None


def test_probe_proxy_names_what_it_cannot_probe() -> None:
    reason = probe_proxy("socks5://u:p@127.0.0.1:1080", "http://example.com/", timeout=0.5)
    assert reason is not None and "socks5://127.0.0.1:1080" in reason and "u:p" not in reason


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({}, "probe_url"),
        ({"probe_url": ""}, "probe_url"),
        ({"probe_url": "ftp://example.com/"}, "probe_url"),
        ({"probe_url": "http://"}, "probe_url"),
        ({"probe_url": "http://example.com/", "probe_timeout": 0}, "probe_timeout"),
        ({"probe_url": "http://example.com/", "probe_timeout": "1"}, "probe_timeout"),
    ],
)
def test_proxy_holder_bad_arguments(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        ProxyHolder(**kwargs)
