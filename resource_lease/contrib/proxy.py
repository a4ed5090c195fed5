"""``ProxyHolder``: hold one working HTTP proxy, checked by a real request through it.

::

    from resource_lease.contrib.proxy import ProxyHolder

    class Crawler(ProxyHolder):
        probe_url = "https://example.com/"   # what the proxy must be able to fetch
        probe_timeout = 5
        # probe_ssl_context = ssl.create_default_context(cafile="private-ca.pem")

    with Crawler() as holder:
        proxies = {"http": holder.proxy_url, "https": holder.proxy_url}

A resource's ``data["url"]`` is the proxy: ``http://[user:pass@]host:port`` or ``host:port``.
The probe speaks to the proxy with ``http.client`` (an absolute-URI GET for an http target,
a CONNECT tunnel for https), so ``no_proxy`` and other environment settings cannot make it
bypass the proxy it is meant to test. Through the tunnel the target's certificate and host name
are always verified (``probe_ssl_context``), so a proxy that intercepts TLS fails the probe.
"""

from __future__ import annotations

import base64
import http.client
import ssl
from typing import Any
from urllib.parse import unquote, urlsplit

from resource_lease.holder import ResourceHolder
from resource_lease.proxy_urls import mask_url
from resource_lease.validation import check_seconds

USER_AGENT = "resource-lease-proxy-probe/1"
#: Bytes of the answer read to make sure the proxy relays a body, not just a status line.
READ_LIMIT = 64 * 1024
#: The reason for a proxy URL that cannot be read; it quotes nothing of the URL, which may
#: hold a password.
MALFORMED = (
    "malformed proxy URL: expected [http://][user:password@]host:port with no path, query or fragment"
    ' (percent-encode "/", "?" and "#" in a password)'
)


def _check_probe_url(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            f"probe_url must be an http:// or https:// URL (set ProxyHolder.probe_url or pass probe_url=), got {value!r}"
        )
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"probe_url must be an http:// or https:// URL with a host, got {value!r}")
    return value


def _check_ssl_context(value: Any, name: str = "probe_ssl_context") -> ssl.SSLContext:
    if not isinstance(value, ssl.SSLContext):
        raise ValueError(
            f"{name} must be an ssl.SSLContext, e.g. ssl.create_default_context(cafile=...), or None, got {value!r}"
        )
    if value.protocol == ssl.PROTOCOL_TLS_SERVER:
        raise ValueError(f"{name} must be a client context (ssl.create_default_context()), not a server one")
    if value.verify_mode == ssl.CERT_NONE or not value.check_hostname:
        raise ValueError(
            f"{name} must verify the target's certificate and host name (verify_mode CERT_REQUIRED,"
            " check_hostname True): an unverified probe passes a proxy that intercepts TLS. To trust a"
            " private CA or a self-signed target, load it with load_verify_locations() instead"
        )
    return value


def probe_proxy(
    proxy_url: str, target_url: str, *, timeout: float, ssl_context: ssl.SSLContext | None = None
) -> str | None:
    """GET ``target_url`` through the HTTP proxy ``proxy_url``; None if it answered 2xx/3xx
    with a body, else why not (the reason recorded on a quarantined proxy).

    ``timeout`` bounds connecting and each read. For an https target the proxy is asked for a
    CONNECT tunnel (``Proxy-Authorization`` goes on the CONNECT only, never to the target)
    and the target's certificate is verified with ``ssl_context`` (default:
    ``ssl.create_default_context()``, the system's CAs; one that does not verify is refused
    with ``ValueError``). The reason names the proxy by host and port only, never its
    credentials, and the target with any password masked.
    """
    if ssl_context is not None:
        _check_ssl_context(ssl_context, "ssl_context")
    try:
        proxy = urlsplit(proxy_url if "://" in proxy_url else f"http://{proxy_url}")
        where = f"{proxy.hostname}:{proxy.port}" if proxy.port else str(proxy.hostname)
    except ValueError:  # a bad port or IPv6 literal; its message may quote part of a password
        return MALFORMED
    if proxy.path not in ("", "/") or proxy.query or proxy.fragment:
        return MALFORMED  # an unencoded "/", "?" or "#" in a password: host and port are not what they seem
    if proxy.scheme != "http" or not proxy.hostname:
        return f"unsupported proxy {proxy.scheme}://{where}: the probe speaks to http:// proxies only"
    target = urlsplit(target_url)
    shown = mask_url(target_url)  # reasons are stored and shown: never a password of the probe URL
    auth: dict[str, str] = {}
    if proxy.username is not None:
        pair = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
        auth["Proxy-Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
    conn: http.client.HTTPConnection
    try:
        if target.scheme == "https":
            # An explicit context: a process-wide ssl._create_default_https_context swapped
            # for an unverified one must not make the probe accept any certificate.
            context = ssl.create_default_context() if ssl_context is None else ssl_context
            # The proxy itself speaks plain http: port 80 when the URL names none (HTTPSConnection
            # would assume 443 for it).
            conn = http.client.HTTPSConnection(proxy.hostname, proxy.port or 80, timeout=timeout, context=context)
            conn.set_tunnel(str(target.hostname), target.port, headers=auth)
            path = (target.path or "/") + (f"?{target.query}" if target.query else "")
            conn.request("GET", path, headers={"User-Agent": USER_AGENT})
        else:
            conn = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=timeout)
            conn.request("GET", target_url, headers={"User-Agent": USER_AGENT, **auth})
    except ssl.SSLCertVerificationError as exc:
        return (
            f"GET {shown} through proxy {where} failed: the certificate of {target.hostname} did not"
            f" verify ({exc.verify_message or exc}); the proxy may intercept TLS"
        )
    except (OSError, http.client.HTTPException) as exc:
        return f"GET {shown} through proxy {where} failed: {exc or type(exc).__name__}"
    try:
        response = conn.getresponse()
        response.read(READ_LIMIT)
        if not 200 <= response.status < 400:
            return f"GET {shown} through proxy {where} answered HTTP {response.status} {response.reason}".rstrip()
        return None
    except (OSError, http.client.HTTPException) as exc:
        return f"GET {shown} through proxy {where} failed: {exc or type(exc).__name__}"
    finally:
        conn.close()


class ProxyHolder(ResourceHolder):
    """Hold one HTTP proxy that can fetch ``probe_url`` within ``probe_timeout`` seconds.

    A proxy that cannot (refused, timed out, an error status, no ``data["url"]``) is
    quarantined with the probe's answer as the reason, and the next one is tried.
    """

    kind = "proxy"
    #: The URL a good proxy must be able to fetch (required; choose one you may hit often).
    probe_url: str = ""
    #: Seconds the probe may wait to connect and for each read.
    probe_timeout: float = 5.0
    #: How an https probe verifies the target's certificate: an ``ssl.SSLContext`` that verifies
    #: (certificate and host name); None: ``ssl.create_default_context()``, the system's CAs.
    #: For a target with a private CA or a self-signed certificate, load it into a context:
    #: ``ssl.create_default_context(cafile="ca.pem")``.
    probe_ssl_context: ssl.SSLContext | None = None

    def __init__(
        self,
        *,
        probe_url: str | None = None,
        probe_timeout: float | None = None,
        probe_ssl_context: ssl.SSLContext | None = None,
        **kwargs: Any,
    ) -> None:
        cls = type(self)
        url = _check_probe_url(cls.probe_url if probe_url is None else probe_url)
        timeout = check_seconds(cls.probe_timeout if probe_timeout is None else probe_timeout, "probe_timeout")
        context = cls.probe_ssl_context if probe_ssl_context is None else probe_ssl_context
        context = ssl.create_default_context() if context is None else _check_ssl_context(context)
        super().__init__(**kwargs)
        self.probe_url = url
        self.probe_timeout = timeout
        self.probe_ssl_context: ssl.SSLContext = context

    @property
    def proxy_url(self) -> str | None:
        """The current resource's proxy URL (its ``data["url"]``)."""
        resource = self.resource
        if resource is None or not isinstance(resource.data, dict):
            return None
        url = resource.data.get("url")
        return url if isinstance(url, str) and url else None

    def is_valid(self) -> bool:
        url = self.proxy_url
        if url is None:
            self.invalid_reason = 'the resource has no proxy URL in data["url"]'
            return False
        problem = probe_proxy(url, self.probe_url, timeout=self.probe_timeout, ssl_context=self.probe_ssl_context)
        if problem is not None:
            self.invalid_reason = problem
            return False
        return True


__all__ = ["ProxyHolder", "probe_proxy"]
