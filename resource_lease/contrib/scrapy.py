"""A Scrapy downloader middleware that sends each request through a proxy leased from the pool
(docs/scrapy.md).

.. code-block:: python

    # settings.py of the Scrapy project (DJANGO_SETTINGS_MODULE set in its environment)
    DOWNLOADER_MIDDLEWARES = {"resource_lease.contrib.scrapy.LeasedProxyMiddleware": 740}
    RESOURCE_LEASE_KIND = "proxy"

For each request: a proxy of the kind is leased with the request's host as its target
(``acquire(kind, target=host, auto_renew=True)``: a proxy cooling down for that site is not
granted, and the lease is renewed in the background however long the download takes; with
``request.meta["resource_lease_session"]``, the session's proxy); its
``data["url"]`` becomes ``request.meta["proxy"]``; the response is reported
(``lease.report``: a blocked status or a ban marker in the body is ``"blocked"`` with the
``Retry-After`` the site asked for, a network error ``"error"``, anything else ``"ok"``) and
the lease is released. Every database call runs on a thread pool of the middleware's own,
never on the reactor's thread, so the crawl goes on while a request waits in line for a proxy.
"""

from __future__ import annotations

import email.utils
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from scrapy import signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Request, Response, TextResponse
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from resource_lease.exceptions import LeaseError, LeaseLost, NoResourceAvailable
from resource_lease.validation import check_alias, check_kind, check_seconds, check_where

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

    from resource_lease.lease import Lease

logger = logging.getLogger("resource_lease.scrapy")

T = TypeVar("T")

#: The request.meta key of the request's lease (the middleware's own; set while it is held).
LEASE_KEY = "resource_lease"
#: request.meta: the name of the resource the request went through (kept in the response's meta).
NAME_KEY = "resource_lease_name"
#: request.meta: the target to lease for, instead of the request's host.
TARGET_KEY = "resource_lease_target"
#: request.meta: the sticky session to lease for (``acquire(session=...)``): the same proxy
#: for every request of that session while the binding lives (docs/learning.md#sessions).
SESSION_KEY = "resource_lease_session"
#: request.meta: False makes the middleware leave the request alone (no lease, no proxy).
ENABLED_KEY = "resource_lease_enabled"
#: request.meta: the proxy URL this middleware set, so a retry or redirect gets a lease anew.
_PROXY_SET = "_resource_lease_proxy"
#: request.meta: how many times the request was put back for want of a proxy.
_REQUEUED = "_resource_lease_requeued"
#: Bytes of a body searched for ban markers.
MARKER_SCAN = 64 * 1024

#: The Scrapy settings and their defaults (docs/scrapy.md#settings).
DEFAULTS: dict[str, Any] = {
    "RESOURCE_LEASE_ENABLED": True,
    "RESOURCE_LEASE_KIND": None,
    "RESOURCE_LEASE_USING": None,
    "RESOURCE_LEASE_WHERE": None,
    "RESOURCE_LEASE_TTL": 60.0,
    "RESOURCE_LEASE_TIMEOUT": 60.0,
    "RESOURCE_LEASE_NO_PROXY_RETRIES": 2,
    "RESOURCE_LEASE_REPORT": True,
    "RESOURCE_LEASE_BLOCKED_CODES": [403, 429],
    "RESOURCE_LEASE_ERROR_CODES": [407],
    "RESOURCE_LEASE_BAN_MARKERS": [],
    "RESOURCE_LEASE_BLOCKED_RETRY_AFTER": 300.0,
    "RESOURCE_LEASE_THREADS": None,
}


def _codes(settings: BaseSettings, name: str) -> frozenset[int]:
    value = settings.get(name, DEFAULTS[name])
    if isinstance(value, str):
        value = [part for part in value.split(",") if part.strip()]
    try:
        codes = frozenset(int(code) for code in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a list of HTTP status codes, got {value!r}") from None
    if any(not 100 <= code <= 599 for code in codes):
        raise ValueError(f"{name} must hold HTTP status codes (100 to 599), got {sorted(codes)}")
    return codes


def _markers(settings: BaseSettings) -> re.Pattern[str] | None:
    value = settings.get("RESOURCE_LEASE_BAN_MARKERS", DEFAULTS["RESOURCE_LEASE_BAN_MARKERS"])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Iterable) or not all(isinstance(m, str) and m for m in value):
        raise ValueError(f"RESOURCE_LEASE_BAN_MARKERS must be a list of non-empty strings, got {value!r}")
    markers = list(value)
    if not markers:
        return None
    return re.compile("|".join(re.escape(m) for m in markers), re.IGNORECASE)


def _seconds(settings: BaseSettings, name: str, *, allow_zero: bool = False) -> float:
    # Scrapy's settings read None as "not set": the default then.
    value = settings.get(name, DEFAULTS[name])
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    return check_seconds(value, name, allow_zero=allow_zero)


def retry_after_seconds(value: bytes | str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header's seconds (a number, or an HTTP date), None when absent or
    unreadable, at least 1 (a cooldown is > 0)."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(1.0, seconds)


def proxy_url(data: Any) -> str | None:
    """The proxy URL Scrapy gets from a resource's ``data["url"]`` (``host:port`` read as
    ``http://``, as ``seed_proxies`` does), or None when there is none or its scheme is not
    ``http``/``https``."""
    url = data.get("url") if isinstance(data, dict) else None
    if not isinstance(url, str) or not url.strip():
        return None
    url = url.strip()
    if "://" not in url:
        url = f"http://{url}"
    return url if url.split("://", 1)[0].lower() in ("http", "https") else None


class Verdicts:
    """How a response is judged (the RESOURCE_LEASE_BLOCKED_CODES, _ERROR_CODES, _BAN_MARKERS
    and _BLOCKED_RETRY_AFTER settings)."""

    def __init__(
        self,
        *,
        blocked_codes: frozenset[int],
        error_codes: frozenset[int],
        markers: re.Pattern[str] | None,
        blocked_retry_after: float | None,
    ) -> None:
        both = blocked_codes & error_codes
        if both:
            raise ValueError(f"RESOURCE_LEASE_BLOCKED_CODES and RESOURCE_LEASE_ERROR_CODES share {sorted(both)}")
        self.blocked_codes = blocked_codes
        self.error_codes = error_codes
        self.markers = markers
        self.blocked_retry_after = blocked_retry_after

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Verdicts:
        return cls(
            blocked_codes=_codes(settings, "RESOURCE_LEASE_BLOCKED_CODES"),
            error_codes=_codes(settings, "RESOURCE_LEASE_ERROR_CODES"),
            markers=_markers(settings),
            # 0: a blocked report without retry_after (counted in the health score, no cooldown).
            blocked_retry_after=_seconds(settings, "RESOURCE_LEASE_BLOCKED_RETRY_AFTER", allow_zero=True) or None,
        )

    def outcome(self, response: Response) -> tuple[str, float | None]:
        """``("blocked", retry_after)`` for a blocked status or a ban marker in the body
        (``retry_after`` from the ``Retry-After`` header, else RESOURCE_LEASE_BLOCKED_RETRY_AFTER);
        ``("error", None)`` for an error status; else ``("ok", None)``: the proxy brought an answer."""
        if response.status in self.blocked_codes or self._marked(response):
            header = retry_after_seconds(response.headers.get(b"Retry-After"))
            return "blocked", header if header is not None else self.blocked_retry_after
        if response.status in self.error_codes:
            return "error", None
        return "ok", None

    def _marked(self, response: Response) -> bool:
        if self.markers is None or not isinstance(response, TextResponse):
            return False
        text = response.body[:MARKER_SCAN].decode(response.encoding or "utf-8", "replace")
        return self.markers.search(text) is not None


class LeasedProxyMiddleware:
    """Lease a proxy per request, report how it did, release it (module docstring, docs/scrapy.md).

    Override ``outcome(request, response)`` to judge responses your own way: it returns
    ``("ok" | "error" | "blocked", retry_after or None)``, or None to report nothing.
    """

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        if not settings.getbool("RESOURCE_LEASE_ENABLED", True):
            raise NotConfigured("RESOURCE_LEASE_ENABLED is off")
        kind = settings.get("RESOURCE_LEASE_KIND")
        if kind is None:
            raise ValueError(
                "RESOURCE_LEASE_KIND is not set: name the pool of proxies to lease from"
                ' (RESOURCE_LEASE_KIND = "proxy"), or set RESOURCE_LEASE_ENABLED = False'
            )
        self.kind = check_kind(kind, "RESOURCE_LEASE_KIND")
        using = settings.get("RESOURCE_LEASE_USING")
        self.using = None if using is None else check_alias(using, "RESOURCE_LEASE_USING")
        where = settings.get("RESOURCE_LEASE_WHERE")
        self.where = None if where is None else check_where(dict(where), "RESOURCE_LEASE_WHERE")
        self.ttl = _seconds(settings, "RESOURCE_LEASE_TTL")
        # Seconds a request waits in line for a proxy (holding one of CONCURRENT_REQUESTS
        # meanwhile); 0: one attempt.
        self.timeout = _seconds(settings, "RESOURCE_LEASE_TIMEOUT", allow_zero=True)
        retries = settings.get("RESOURCE_LEASE_NO_PROXY_RETRIES", DEFAULTS["RESOURCE_LEASE_NO_PROXY_RETRIES"])
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"RESOURCE_LEASE_NO_PROXY_RETRIES must be an integer >= 0, got {retries!r}")
        self.no_proxy_retries = retries
        self.reporting = settings.getbool("RESOURCE_LEASE_REPORT", True)
        self.verdicts = Verdicts.from_settings(settings)
        threads = settings.get("RESOURCE_LEASE_THREADS")
        if threads is None:
            threads = settings.getint("CONCURRENT_REQUESTS", 16)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"RESOURCE_LEASE_THREADS must be an integer >= 1, got {threads!r}")

        _django_ready()
        self.stats: StatsCollector | None = crawler.stats
        # Two pools: a request waiting in line for a proxy holds an acquiring thread for up to
        # RESOURCE_LEASE_TIMEOUT; the reports and releases that free proxies must never queue
        # behind it (nor behind DNS lookups on the reactor's own pool).
        self._acquiring = ThreadPool(minthreads=0, maxthreads=threads, name="resource_lease-acquire")
        self._finishing = ThreadPool(minthreads=0, maxthreads=4, name="resource_lease-report")
        self._held: dict[int, Lease] = {}
        self._held_lock = threading.Lock()
        self._pending: set[Deferred[Any]] = set()
        from twisted.internet import reactor  # the one Scrapy installed (never on import of this module)

        self._reactor: Any = cast(Any, reactor)  # zope interfaces confuse mypy
        for pool in (self._acquiring, self._finishing):
            pool.start()
        # Stopped when the spider closes; this for a reactor stopped before that.
        self._reactor.addSystemEventTrigger("during", "shutdown", self._stop_pools)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> LeasedProxyMiddleware:
        return cls(crawler)

    # -- off the reactor ----------------------------------------------------------------------

    def _in(self, pool: ThreadPool, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Deferred[T]:
        return deferToThreadPool(self._reactor, pool, fn, *args, **kwargs)

    def _acquire(self, target: str, session: str | None) -> Lease:
        from resource_lease.lease import acquire
        from resource_lease.models import TARGET_MAX

        lease = acquire(
            self.kind,
            target=target[:TARGET_MAX],  # a host name may be longer (253)
            session=session,
            ttl=self.ttl,
            timeout=self.timeout,
            using=self.using,
            where=self.where,
            auto_renew=True,
        )
        with self._held_lock:
            self._held[id(lease)] = lease
        return lease

    def _finish(self, lease: Lease, outcome: str | None, retry_after: float | None) -> None:
        """Report (when reporting) and release: in that order, so the proxy is not granted to
        anyone for this target before its cooldown is written."""
        try:
            if outcome is not None and self.reporting:
                try:
                    lease.report(outcome, retry_after=retry_after)
                    self._inc(f"resource_lease/report/{outcome}")
                except LeaseLost as exc:
                    # Expired or taken over meanwhile: the report is refused (it would punish
                    # the next holder's proxy), and there is nothing to release.
                    logger.warning("report %r of %r refused: %s", outcome, lease, exc)
                    self._inc("resource_lease/report/refused")
            lease.release()
        except LeaseError:
            logger.exception("reporting or releasing %r failed; the lease expires by itself", lease)
            self._inc("resource_lease/release_failed")
        finally:
            with self._held_lock:
                self._held.pop(id(lease), None)

    def _finish_later(self, lease: Lease, outcome: str | None, retry_after: float | None) -> None:
        # The response goes on at once; spider_closed waits for what is still pending.
        d = self._in(self._finishing, self._finish, lease, outcome, retry_after)
        self._pending.add(d)
        d.addBoth(self._done, d)

    def _done(self, result: Any, d: Deferred[Any]) -> None:
        self._pending.discard(d)

    # -- Scrapy's hooks -----------------------------------------------------------------------

    async def process_request(self, request: Request, spider: Any = None) -> Request | None:
        if request.meta.get(ENABLED_KEY) is False:
            return None
        proxy = request.meta.get("proxy")
        if proxy is not None and _PROXY_SET not in request.meta:
            return None  # a proxy chosen by the spider or another middleware: not ours to replace
        stale = request.meta.pop(LEASE_KEY, None)
        if stale is not None:
            # A copy of a request whose lease was given back (a retry, a redirect): lease anew.
            request.meta.pop(_PROXY_SET, None)
            request.meta.pop("proxy", None)
        target = request.meta.get(TARGET_KEY) or urlparse_cached(request).hostname or ""
        session = request.meta.get(SESSION_KEY)
        try:
            lease = await maybe_deferred_to_future(self._in(self._acquiring, self._acquire, target, session))
        except NoResourceAvailable as exc:
            self._inc("resource_lease/no_proxy")
            return self._requeue(request, exc)
        url = proxy_url(lease.resource.data)
        if url is None:
            self._finish_later(lease, None, None)  # not the proxy's fault: released, not reported
            message = (
                f"resource {lease.resource.name!r} of kind {self.kind!r} is no proxy Scrapy can use: its"
                ' data["url"] must be http:// or https:// (Scrapy speaks no SOCKS; keep those in another kind)'
            )
            logger.error("%s", message)
            raise IgnoreRequest(message)
        request.meta[LEASE_KEY] = lease
        request.meta[NAME_KEY] = lease.resource.name
        request.meta["proxy"] = request.meta[_PROXY_SET] = url
        self._inc("resource_lease/leased")
        if lease.rebound:
            self._inc("resource_lease/rebound")
        return None

    async def process_response(self, request: Request, response: Response, spider: Any = None) -> Response:
        lease = request.meta.pop(LEASE_KEY, None)
        if lease is not None:
            verdict = self.outcome(request, response)
            outcome, retry_after = verdict if verdict is not None else (None, None)
            self._finish_later(lease, outcome, retry_after)
        return response

    async def process_exception(self, request: Request, exception: Exception, spider: Any = None) -> None:
        lease = request.meta.pop(LEASE_KEY, None)
        if lease is not None:
            # A request given up on (IgnoreRequest) says nothing about the proxy.
            self._finish_later(lease, None if isinstance(exception, IgnoreRequest) else "error", None)
        return None

    async def spider_closed(self, spider: Any = None) -> None:
        """Wait for the reports and releases under way, then give back what is still held
        (a request dropped while its download was under way)."""
        if self._pending:
            await maybe_deferred_to_future(DeferredList(list(self._pending)))
        with self._held_lock:
            left = list(self._held.values())
        for lease in left:
            self._finish_later(lease, None, None)
        if self._pending:
            await maybe_deferred_to_future(DeferredList(list(self._pending)))
        self._stop_pools()

    def _stop_pools(self) -> None:
        for pool in (self._acquiring, self._finishing):
            if not pool.joined:
                pool.stop()  # its threads are idle by now: joining them is quick

    # -- judging a response -------------------------------------------------------------------

    def outcome(self, request: Request, response: Response) -> tuple[str, float | None] | None:
        """What to report of ``response``: ``(outcome, retry_after)``, or None for nothing
        (``Verdicts.outcome``: the settings' blocked and error codes and ban markers)."""
        return self.verdicts.outcome(response)

    # -- pieces -------------------------------------------------------------------------------

    def _requeue(self, request: Request, exc: NoResourceAvailable) -> Request:
        tries = int(request.meta.get(_REQUEUED, 0))
        if not exc.exists:  # the kind has no proxies at all: waiting again would not help
            logger.error("giving up %s: %s", request, exc)
            raise IgnoreRequest(str(exc)) from exc
        if tries >= self.no_proxy_retries:
            logger.error("giving up %s: %s (put back %d times)", request, exc, tries)
            raise IgnoreRequest(f"no proxy of kind {self.kind!r}: {exc}") from exc
        logger.info("no proxy for %s yet (%s): putting it back in the queue", request, exc)
        retry = request.replace(dont_filter=True)
        retry.meta[_REQUEUED] = tries + 1
        return retry

    def _inc(self, key: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(key)


def _django_ready() -> None:
    """Set Django up in a Scrapy process (its settings from DJANGO_SETTINGS_MODULE)."""
    import django
    from django.apps import apps
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    if apps.ready:
        return
    try:
        settings.INSTALLED_APPS  # noqa: B018 - reading it configures the settings or says why not
    except ImproperlyConfigured as exc:
        raise ImproperlyConfigured(
            "resource_lease's Scrapy middleware needs Django's settings: set DJANGO_SETTINGS_MODULE in the"
            f" crawler's environment ({exc})"
        ) from exc
    django.setup()


__all__ = ["LeasedProxyMiddleware", "Verdicts", "proxy_url", "retry_after_seconds"]
