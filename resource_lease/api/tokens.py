"""Bearer tokens: made (``create_token``: the text is returned once, stored hashed), revoked,
and checked on every request (``authenticate``: 401 without a valid one; ``allow_kind``: 403
for a kind outside the token's). Failed authentications are counted in
``resource_lease_api_auth_failures_total{reason}`` when prometheus_client is installed."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.db import close_old_connections, transaction
from django.db.models import Q
from django.http import HttpRequest
from django.utils import timezone

from resource_lease.api.errors import ApiError
from resource_lease.models.api import ApiToken, parse_kinds, token_digest
from resource_lease.offload import in_thread

logger = logging.getLogger("resource_lease")

try:
    import prometheus_client
except ImportError:  # pragma: no cover - the [metrics] extra is optional
    prometheus_client = None  # type: ignore[assignment]

_failures: Any = None
if prometheus_client is not None:
    _failures = prometheus_client.Counter(
        "resource_lease_api_auth_failures",
        "Requests of the HTTP API refused 401, by reason (missing, malformed, unknown, revoked).",
        ["reason"],
    )

#: ``last_used_at`` is written at most this often per token (not a write per request).
LAST_USED_EVERY = dt.timedelta(seconds=60)


def _refused(reason: str, error: str) -> ApiError:
    if _failures is not None:
        _failures.labels(reason).inc()
    logger.info("HTTP API: authentication refused (%s)", reason)
    return ApiError(401, error, headers={"WWW-Authenticate": 'Bearer realm="resource_lease"'})


def create_token(name: str, kinds: str | list[str] = "") -> tuple[ApiToken, str]:
    """A new token named ``name`` limited to ``kinds`` (empty: every kind); the token and its
    text, which is not stored and cannot be shown again. ``ValidationError`` for a bad name
    or one already taken (revoked tokens keep their names)."""
    listed = parse_kinds(kinds if isinstance(kinds, str) else ",".join(kinds))
    token = ApiToken(name=name, kinds=",".join(listed))
    text = token.set_new_secret()
    token.full_clean()
    token.save()
    return token, text


def revoke_token(name: str) -> bool:
    """Revoke the token named ``name``; False if there is none or it was already revoked."""
    return ApiToken.objects.filter(name=name, revoked_at__isnull=True).update(revoked_at=timezone.now()) == 1


def orm(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run an ORM job of the API in a worker thread (never the event loop, and not Django's
    one thread-sensitive thread, so a thousand long polls hold no thread each), closing its
    connection after it as a request's end would (``CONN_MAX_AGE`` honoured)."""

    def job() -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return in_thread(job)


def _find(text: str) -> ApiToken:
    token = ApiToken.objects.filter(digest=token_digest(text)).first()
    if token is None:
        raise _refused("unknown", "unknown token")
    if token.revoked_at is not None:
        raise _refused("revoked", "this token was revoked")
    now = timezone.now()
    if token.last_used_at is None or token.last_used_at < now - LAST_USED_EVERY:
        with transaction.atomic():
            ApiToken.objects.filter(pk=token.pk).filter(
                Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_EVERY)
            ).update(last_used_at=now)
    return token


async def authenticate(request: HttpRequest) -> ApiToken:
    """The request's token (``Authorization: Bearer <token>``), or ``ApiError`` 401."""
    header = request.headers.get("Authorization")
    if not header:
        raise _refused("missing", "an Authorization: Bearer <token> header is required")
    scheme, _, text = header.partition(" ")
    text = text.strip()
    if scheme.lower() != "bearer" or not text or len(text) > 200:
        raise _refused("malformed", "the Authorization header must be 'Bearer <token>'")
    token: ApiToken = await orm(_find, text)
    return token


def allow_kind(token: ApiToken, kind: str) -> None:
    """403 unless ``token`` may lease ``kind``."""
    if not token.allows(kind):
        raise ApiError(403, f"token {token.name!r} may not lease kind {kind!r}", field="kind")
