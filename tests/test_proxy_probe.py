"""``probe_proxy``'s https path: a CONNECT tunnel through real proxies on 127.0.0.1, then TLS
to a real local target whose certificate comes from a CA generated here with ``openssl``.

The proxies are the kinds met in the wild: one that relays, one that wants credentials (407),
ones that refuse CONNECT (405, 403, and 501 from a proxy with no CONNECT at all), close the
connection before or right after answering, hang before or after answering, and one that
intercepts TLS with a certificate of its own. No mocks: every probe is a real connection.
"""

from __future__ import annotations

import base64
import datetime as dt
import select
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from resource_lease import pool
from resource_lease.contrib.proxy import ProxyHolder, probe_proxy
from resource_lease.exceptions import NoResourceAvailable
from resource_lease.models import Resource
from tests.holder_helpers import OLD, QuietHandler, serve, state_of, url_of, wait_for

USER, PASSWORD = "probe-user", "s3cr3t-Pa55"
CREDENTIALS = f"{USER}:{PASSWORD}"
BASIC = "Basic " + base64.b64encode(CREDENTIALS.encode()).decode()
TIMEOUT = 0.5  # the probe's timeout for the proxies that hang


# -- certificates ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    ca: Path  # a self-signed CA, trusted only by the contexts built from it here
    localhost: tuple[Path, Path]  # (cert, key) for localhost and 127.0.0.1, signed by the CA
    elsewhere: tuple[Path, Path]  # signed by the CA, for another host name
    stranger: tuple[Path, Path]  # self-signed, for localhost and 127.0.0.1, trusted by nobody

    def trusting(self) -> ssl.SSLContext:
        """A client context that trusts the test CA (and only it)."""
        return ssl.create_default_context(cafile=str(self.ca))


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
LEAF_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = {san}
"""


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make the test certificates")
    d = tmp_path_factory.mktemp("tls")
    _openssl(
        "req", "-x509", *EC_KEY, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=rl test CA", cwd=d
    )

    def leaf(name: str, san: str) -> tuple[Path, Path]:
        (d / f"{name}.ext").write_text(LEAF_EXTENSIONS.format(san=san))
        _openssl("req", "-new", *EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d,
        )  # fmt: skip
        return d / f"{name}.pem", d / f"{name}.key"

    localhost = leaf("localhost", "DNS:localhost, IP:127.0.0.1")
    elsewhere = leaf("elsewhere", "DNS:elsewhere.invalid")
    _openssl(
        "req", "-x509", *EC_KEY, "-keyout", "stranger.key", "-out", "stranger.pem", "-days", "2",
        "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", cwd=d,
    )  # fmt: skip
    return Certificates(d / "ca.pem", localhost, elsewhere, (d / "stranger.pem", d / "stranger.key"))


def server_context(cert: tuple[Path, Path]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*map(str, cert))
    return context


# -- the target: an https server -------------------------------------------------------------------


class TLSServer(ThreadingHTTPServer):
    """An HTTPS server; the handshake runs on the connection's own thread, not in accept()."""

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler], context: ssl.SSLContext) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.context = context
        self.handshake_errors: list[str] = []

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that refuses our certificate is what some tests are about


def serve_tls(handler: type[BaseHTTPRequestHandler], context: ssl.SSLContext) -> TLSServer:
    server = TLSServer(handler, context)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class Seen:
    """What the servers were sent: the target's GETs and the proxies' CONNECTs (their headers)."""

    gets: list[dict[str, str]] = field(default_factory=list)
    connects: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    proxy_gets: list[str] = field(default_factory=list)


def target_handler(seen: Seen, body: bytes = b"ok from the target") -> type[BaseHTTPRequestHandler]:
    class Target(QuietHandler):
        def setup(self) -> None:
            self.request.settimeout(10)
            try:
                self.request.do_handshake()
            except (OSError, ssl.SSLError) as exc:
                assert isinstance(self.server, TLSServer)
                self.server.handshake_errors.append(repr(exc))
                raise
            super().setup()

        def do_GET(self) -> None:
            seen.gets.append({k.lower(): v for k, v in self.headers.items()} | {":path": self.path})
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Target


# -- the proxies -----------------------------------------------------------------------------------


def _pipe(a: socket.socket, b: socket.socket, timeout: float = 10) -> None:
    """Relay bytes both ways until either side closes or nothing moves for ``timeout``."""
    sockets = [a, b]
    while True:
        readable, _, _ = select.select(sockets, [], [], timeout)
        if not readable:
            return
        for sock in readable:
            data = sock.recv(65536)
            if not data:
                return
            (b if sock is a else a).sendall(data)


def connect_proxy(
    seen: Seen, behaviour: str, release: threading.Event, *, credentials: str | None = None, intercept: Any = None
) -> type[BaseHTTPRequestHandler]:
    """A proxy handler for CONNECT. ``behaviour``: relay, refuse-405, refuse-403, close (read the
    CONNECT, answer nothing), close-after-200, hang (never answer), hang-after-200, intercept
    (answer 200, then speak TLS itself with the ``intercept`` server context)."""

    class Proxy(QuietHandler):
        def do_GET(self) -> None:  # the https probe must never send the proxy a plain GET
            seen.proxy_gets.append(self.path)
            self.send_error(400, "expected CONNECT")

        def do_CONNECT(self) -> None:
            seen.connects.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
            if credentials is not None:
                expected = "Basic " + base64.b64encode(credentials.encode()).decode()
                if self.headers.get("Proxy-Authorization") != expected:
                    self.send_response(407, "Proxy Authentication Required")
                    self.send_header("Proxy-Authenticate", 'Basic realm="test"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            if behaviour.startswith("refuse-"):
                code = int(behaviour.removeprefix("refuse-"))
                self.send_response(code, {405: "Method Not Allowed", 403: "Forbidden"}[code])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if behaviour == "close":
                self.close_connection = True
                return
            if behaviour == "hang":
                release.wait(30)
                return
            self.send_response(200, "Connection established")
            self.end_headers()
            if behaviour == "close-after-200":
                return
            if behaviour == "hang-after-200":
                release.wait(30)
                return
            if behaviour == "intercept":
                self._intercept()
                return
            assert behaviour == "relay", behaviour
            host, _, port = self.path.rpartition(":")
            with socket.create_connection((host, int(port)), timeout=5) as upstream:
                _pipe(self.connection, upstream)

        def _intercept(self) -> None:
            try:
                with intercept.wrap_socket(self.connection, server_side=True) as tls:
                    tls.settimeout(5)
                    tls.recv(65536)  # the GET, if the client ever sends it
                    tls.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 11\r\n\r\nintercepted")
            except OSError:
                pass  # the client refused our certificate, as it should

    return Proxy


@pytest.fixture(scope="module")
def servers(certificates: Certificates) -> Iterator[dict[str, Any]]:
    """Targets (good, untrusted, wrong host) and proxies, all on 127.0.0.1, for the module (a
    server's shutdown waits up to half a second); what they saw."""
    seen = Seen()
    release = threading.Event()
    targets = {
        "good": serve_tls(target_handler(seen), server_context(certificates.localhost)),
        "stranger": serve_tls(target_handler(seen), server_context(certificates.stranger)),
        "elsewhere": serve_tls(target_handler(seen), server_context(certificates.elsewhere)),
    }
    proxy = {
        "relay": serve(connect_proxy(seen, "relay", release)),
        "auth": serve(connect_proxy(seen, "relay", release, credentials=CREDENTIALS)),
        "refuse-405": serve(connect_proxy(seen, "refuse-405", release)),
        "refuse-403": serve(connect_proxy(seen, "refuse-403", release)),
        "no-connect": serve(QuietHandler),  # no do_CONNECT: the standard 501
        "close": serve(connect_proxy(seen, "close", release)),
        "close-after-200": serve(connect_proxy(seen, "close-after-200", release)),
        "hang": serve(connect_proxy(seen, "hang", release)),
        "hang-after-200": serve(connect_proxy(seen, "hang-after-200", release)),
        "intercept": serve(connect_proxy(seen, "intercept", release, intercept=server_context(certificates.stranger))),
    }
    yield {"targets": targets, "proxy": proxy, "seen": seen, "certificates": certificates}
    release.set()
    for server in [*targets.values(), *proxy.values()]:
        server.shutdown()
        server.server_close()


@pytest.fixture
def tls(servers: dict[str, Any]) -> dict[str, Any]:
    """``servers`` with a clean record of what they saw."""
    seen: Seen = servers["seen"]
    seen.gets.clear()
    seen.connects.clear()
    seen.proxy_gets.clear()
    for server in servers["targets"].values():
        server.handshake_errors.clear()
    return servers


def https_url(server: ThreadingHTTPServer, host: str = "localhost") -> str:
    return f"https://{host}:{server.server_address[1]}/probe?x=1"


def proxy_url(server: ThreadingHTTPServer, credentials: str = "") -> str:
    return url_of(server, f"{credentials}@" if credentials else "")


def assert_no_secret(reason: str | None) -> None:
    assert reason is not None
    assert PASSWORD not in reason and BASIC.split()[1] not in reason, reason


# -- probe_proxy over https --------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_a_connect_tunnel_reaches_a_verified_target(tls: dict[str, Any], host: str) -> None:
    seen: Seen = tls["seen"]
    target = https_url(tls["targets"]["good"], host)
    context = tls["certificates"].trusting()
    assert probe_proxy(proxy_url(tls["proxy"]["relay"]), target, timeout=5, ssl_context=context) is None
    port = tls["targets"]["good"].server_address[1]
    assert [path for path, _ in seen.connects] == [f"{host}:{port}"]
    assert seen.proxy_gets == []  # a tunnel, not an absolute-URI GET through the proxy
    (get,) = seen.gets  # the request went through the tunnel, TLS end to end
    assert get[":path"] == "/probe?x=1" and get["user-agent"].startswith("resource-lease-proxy-probe/")
    assert "proxy-authorization" not in get


def test_a_proxy_url_without_a_port_is_reached_on_port_80_for_an_https_target(tls: dict[str, Any]) -> None:
    """``http://host`` names an http proxy on port 80, whatever the target's scheme."""
    import random

    host = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.{random.randrange(2, 255)}"
    try:
        server = ThreadingHTTPServer((host, 80), connect_proxy(tls["seen"], "relay", threading.Event()))
    except OSError as exc:  # not root, or the port is taken on that address
        pytest.skip(f"cannot listen on {host}:80: {exc}")
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        target = https_url(tls["targets"]["good"])
        reason = probe_proxy(f"http://{host}", target, timeout=5, ssl_context=tls["certificates"].trusting())
        assert reason is None, reason
        assert len(tls["seen"].connects) == 1
    finally:
        server.shutdown()
        server.server_close()


def test_proxy_authorization_goes_on_the_connect_and_never_to_the_target(tls: dict[str, Any]) -> None:
    seen: Seen = tls["seen"]
    target = https_url(tls["targets"]["good"])
    context = tls["certificates"].trusting()
    auth = tls["proxy"]["auth"]

    assert probe_proxy(proxy_url(auth, CREDENTIALS), target, timeout=5, ssl_context=context) is None
    (_, headers), (get,) = seen.connects[-1], seen.gets
    assert headers["proxy-authorization"] == BASIC
    assert "proxy-authorization" not in get and "authorization" not in get
    assert not any(BASIC.split()[1] in value for value in get.values())

    # Percent-encoded credentials are decoded before they are sent.
    encoded = proxy_url(auth, f"{USER}:{PASSWORD.replace('-', '%2D')}")
    assert probe_proxy(encoded, target, timeout=5, ssl_context=context) is None
    assert seen.connects[-1][1]["proxy-authorization"] == BASIC

    for credentials, sent in [("", None), (f"{USER}:wrong", "wrong")]:
        reason = probe_proxy(proxy_url(auth, credentials), target, timeout=5, ssl_context=context)
        assert reason is not None and "407 Proxy Authentication Required" in reason, reason
        assert_no_secret(reason)
        assert "wrong" not in reason
        header = seen.connects[-1][1].get("proxy-authorization")
        assert header == (None if sent is None else "Basic " + base64.b64encode(f"{USER}:wrong".encode()).decode())
    assert len(seen.gets) == 2  # the refused ones never reached the target


BROKEN_PROXIES = [
    ("refuse-405", "405 Method Not Allowed"),
    ("refuse-403", "403 Forbidden"),
    ("no-connect", "501"),
    ("close", "Remote end closed connection without response"),
    ("close-after-200", "EOF"),
]


@pytest.mark.parametrize(("name", "expected"), BROKEN_PROXIES, ids=[name for name, _ in BROKEN_PROXIES])
def test_a_proxy_that_cannot_tunnel_is_reported_with_its_reason(tls: dict[str, Any], name: str, expected: str) -> None:
    server = tls["proxy"][name]
    target = https_url(tls["targets"]["good"])
    reason = probe_proxy(proxy_url(server, CREDENTIALS), target, timeout=5, ssl_context=tls["certificates"].trusting())
    assert reason is not None and expected in reason, reason
    host, port = server.server_address[:2]
    assert f"through proxy {host}:{port} failed" in reason and target in reason
    assert_no_secret(reason)
    assert tls["seen"].gets == []


@pytest.mark.parametrize("name", ["hang", "hang-after-200"])
def test_a_hanging_proxy_is_given_up_on_within_the_timeout(tls: dict[str, Any], name: str) -> None:
    started = time.monotonic()
    reason = probe_proxy(
        proxy_url(tls["proxy"][name], CREDENTIALS),
        https_url(tls["targets"]["good"]),
        timeout=TIMEOUT,
        ssl_context=tls["certificates"].trusting(),
    )
    took = time.monotonic() - started
    assert reason is not None and "timed out" in reason, reason
    assert TIMEOUT * 0.9 <= took < TIMEOUT + 1.0, took  # one read waits the timeout, no more
    assert_no_secret(reason)
    assert len(tls["seen"].connects) == 1


UNVERIFIED = [
    ("stranger", "self-signed certificate"),
    ("elsewhere", "Hostname mismatch"),
]


@pytest.mark.parametrize(("name", "expected"), UNVERIFIED, ids=[name for name, _ in UNVERIFIED])
def test_a_target_certificate_that_does_not_verify_fails_the_probe(
    tls: dict[str, Any], name: str, expected: str
) -> None:
    reason = probe_proxy(
        proxy_url(tls["proxy"]["auth"], CREDENTIALS),
        https_url(tls["targets"][name]),
        timeout=5,
        ssl_context=tls["certificates"].trusting(),
    )
    assert reason is not None and "the certificate of localhost did not verify" in reason, reason
    assert expected in reason, reason
    assert_no_secret(reason)
    assert tls["seen"].gets == []  # not a byte of the request went over the unverified connection
    wait_for(lambda: tls["targets"][name].handshake_errors, what="the target to see the handshake abandoned")


def test_a_proxy_that_intercepts_tls_fails_the_probe(tls: dict[str, Any]) -> None:
    reason = probe_proxy(
        proxy_url(tls["proxy"]["intercept"]),
        https_url(tls["targets"]["good"]),
        timeout=5,
        ssl_context=tls["certificates"].trusting(),
    )
    assert reason is not None and "did not verify (self-signed certificate)" in reason, reason
    assert "intercept TLS" in reason and tls["seen"].gets == []


def test_the_default_context_verifies_with_the_systems_cas_whatever_the_process_default(
    tls: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Some code disables verification for the whole process this way; the probe must not follow.
    monkeypatch.setattr(ssl, "_create_default_https_context", ssl._create_unverified_context)
    for name in ["good", "stranger"]:  # the test CA is not among the system's
        reason = probe_proxy(proxy_url(tls["proxy"]["relay"]), https_url(tls["targets"][name]), timeout=5)
        assert reason is not None and "did not verify" in reason, reason
    assert tls["seen"].gets == []


BAD_CONTEXTS: list[tuple[Callable[[], Any], str]] = [
    (lambda: "/etc/ssl/certs/ca.pem", "must be an ssl.SSLContext"),
    (lambda: False, "must be an ssl.SSLContext"),
    (lambda: ssl._create_unverified_context(), "must verify"),
    (lambda: _no_hostname_check(), "must verify"),
    (lambda: ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), "must be a client context"),
]


def _no_hostname_check() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    return context


@pytest.mark.parametrize(("make", "message"), BAD_CONTEXTS)
def test_a_context_that_would_not_verify_is_refused(make: Callable[[], Any], message: str) -> None:
    bad = make()
    with pytest.raises(ValueError, match=f"probe_ssl_context {message}"):
        ProxyHolder(probe_url="https://example.com/", probe_ssl_context=bad)
    with pytest.raises(ValueError, match=f"probe_ssl_context {message}"):
        type("Configured", (ProxyHolder,), {"probe_ssl_context": bad})(probe_url="https://example.com/")
    with pytest.raises(ValueError, match=f"ssl_context {message}"):
        probe_proxy("127.0.0.1:9", "https://example.com/", timeout=1, ssl_context=bad)


def test_the_context_comes_from_the_class_the_constructor_or_the_systems_cas(certificates: Certificates) -> None:
    mine = certificates.trusting()
    assert ProxyHolder(probe_url="https://example.com/", probe_ssl_context=mine).probe_ssl_context is mine
    assert (
        type("Configured", (ProxyHolder,), {"probe_ssl_context": mine})(
            probe_url="https://example.com/"
        ).probe_ssl_context
        is mine
    )
    default = ProxyHolder(probe_url="https://example.com/").probe_ssl_context
    assert default.verify_mode == ssl.CERT_REQUIRED and default.check_hostname


MALFORMED = [
    "http://user:Zq9/Xk7@127.0.0.1:8080",  # urllib reads the port as "Zq9", and says so
    "http://user:1234/Xk7@127.0.0.1:8080",  # ... or host "user", port 1234
    "http://user:Zq9#Xk7@127.0.0.1:8080",
    "user:Zq9?Xk7@127.0.0.1:8080",
    "127.0.0.1:99999",
    "http://[::1:8080",
]


@pytest.mark.parametrize("url", MALFORMED)
@pytest.mark.parametrize("target", ["http://127.0.0.1:9/", "https://127.0.0.1:9/"])
def test_a_malformed_proxy_url_is_a_reason_that_quotes_none_of_it(url: str, target: str) -> None:
    # An unencoded "/", "?" or "#" in a password cuts the URL short where urllib reads it.
    reason = probe_proxy(url, target, timeout=0.5)
    assert reason is not None and reason.startswith("malformed proxy URL"), reason
    assert not any(piece in reason for piece in ["Zq9", "Xk7", "1234", "99999", "::1"]), reason


# -- ProxyHolder over https, on the database ---------------------------------------------------------


def test_proxy_holder_probing_https_holds_working_proxies_and_quarantines_the_rest(
    make_pool: Any, holders: Any, tls: dict[str, Any]
) -> None:
    proxy, seen = tls["proxy"], tls["seen"]
    good = {proxy_url(proxy["auth"], CREDENTIALS), proxy_url(proxy["relay"]).removeprefix("http://")}
    broken = {
        "refuse-405": (proxy_url(proxy["refuse-405"]), "405 Method Not Allowed"),
        "no-connect": (proxy_url(proxy["no-connect"]), "501"),
        "no-credentials": (proxy_url(proxy["auth"]), "407 Proxy Authentication Required"),
        "wrong-password": (proxy_url(proxy["auth"], f"{USER}:wrong-{PASSWORD}"), "407"),
        "close": (proxy_url(proxy["close"], CREDENTIALS), "closed connection"),
        "close-after-200": (proxy_url(proxy["close-after-200"], CREDENTIALS), "EOF"),
        "hang": (proxy_url(proxy["hang"], CREDENTIALS), "timed out"),
        "hang-after-200": (proxy_url(proxy["hang-after-200"], CREDENTIALS), "timed out"),
        "intercept": (proxy_url(proxy["intercept"], CREDENTIALS), "did not verify (self-signed certificate)"),
        "malformed": (proxy_url(proxy["relay"], f"{USER}:{PASSWORD.replace('-', '/')}"), "malformed proxy URL"),
    }
    # Broken ones sort first (least recently used), so every one of them is probed.
    for i, (name, (url, _)) in enumerate(broken.items()):
        Resource.objects.create(kind="proxy", name=name, data={"url": url}, busy_before=OLD + dt.timedelta(days=i))
    for i, url in enumerate(sorted(good)):
        Resource.objects.create(kind="proxy", name=f"good-{i}", data={"url": url})

    class Crawler(ProxyHolder):
        probe_url = https_url(tls["targets"]["good"])
        probe_timeout = TIMEOUT
        probe_ssl_context = tls["certificates"].trusting()

    first, second = (holders(Crawler, ttl=10, quarantine_seconds=60) for _ in range(2))
    first.acquire(timeout=30)
    second.acquire(timeout=30)
    assert {first.proxy_url, second.proxy_url} == good
    assert first.holding and second.holding
    assert len(seen.gets) == 2 and seen.proxy_gets == []  # one verified GET through each good one
    with pytest.raises(NoResourceAvailable):
        holders(Crawler).acquire(timeout=0.3)

    for name, (_, reason) in broken.items():
        row = Resource.objects.get(kind="proxy", name=name)
        assert state_of(row.pk) == "quarantined", name
        assert reason in row.quarantine_reason, (name, row.quarantine_reason)
        assert_no_secret(row.quarantine_reason)
        assert "wrong-" not in row.quarantine_reason and "s3cr3t" not in row.quarantine_reason
    assert pool.counts()["proxy"]["held"] == 2 and pool.counts()["proxy"]["quarantined"] == len(broken)


def test_proxy_holder_with_the_default_context_never_accepts_an_untrusted_target(
    make_pool: Any, holders: Any, tls: dict[str, Any]
) -> None:
    row = Resource.objects.create(kind="proxy", name="relay", data={"url": proxy_url(tls["proxy"]["relay"])})
    holder = holders(ProxyHolder, probe_url=https_url(tls["targets"]["stranger"]), quarantine_seconds=60)
    with pytest.raises(NoResourceAvailable):
        holder.acquire(timeout=0.5)
    row.refresh_from_db()
    assert state_of(row.pk) == "quarantined" and "did not verify" in row.quarantine_reason
    assert tls["seen"].gets == []


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_password_in_the_probe_url_never_reaches_the_reason(tls: dict[str, Any], scheme: str) -> None:
    """The reason is stored on the quarantined row and shown in the admin: a probe URL with
    credentials is quoted with its password masked."""
    target = f"{scheme}://probe-user:probe-secret@127.0.0.1:9/health"
    reason = probe_proxy(proxy_url(tls["proxy"]["refuse-403"]), target, timeout=2)
    assert reason is not None and "probe-secret" not in reason, reason
    assert "probe-user:***@127.0.0.1:9" in reason, reason
