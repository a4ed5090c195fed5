"""Each request's JSON body, checked field by field with the app's own rules
(``resource_lease.validation``): a bad one is a 400 naming the field, before anything is
written."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from resource_lease.api.errors import ApiError, bad_request
from resource_lease.conf import lease_settings
from resource_lease.validation import (
    check_holder,
    check_kind,
    check_priority,
    check_seconds,
    check_target,
    check_text,
    check_where,
)

#: The largest body the API reads (bytes): anything larger is 413, unread.
MAX_BODY = 64 * 1024
#: The longest long poll: ``wait`` is at most this many seconds.
MAX_WAIT = 300.0
#: The longest ``holder`` a client may give (the server adds ``http:<token>:`` and a nonce).
MAX_HOLDER = 100
#: The longest ``idempotency_key``.
MAX_KEY = 200
#: Outcomes of ``report`` (the pool's health: API.md, "A pool that learns").
OUTCOMES = ("ok", "error", "blocked")


def parse(raw: bytes, allowed: tuple[str, ...]) -> dict[str, Any]:
    """The body as a JSON object with only ``allowed`` fields; an empty body is ``{}``."""
    if len(raw) > MAX_BODY:
        raise ApiError(413, f"the body is larger than {MAX_BODY} bytes", field="body")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise bad_request("body", f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise bad_request("body", f"the body must be a JSON object, got {type(body).__name__}")
    for name in body:
        if name not in allowed:
            raise bad_request(name, f"unknown field {name!r} (allowed: {', '.join(allowed)})")
    return body


def _checked(field: str, check: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return check(value, field, *args, **kwargs)
    except ValueError as exc:
        raise bad_request(field, str(exc)) from exc


@dataclass(frozen=True)
class AcquireBody:
    kind: str
    ttl: float
    wait: float
    where: dict[str, Any] | None
    priority: int
    holder: str | None
    idempotency_key: str | None
    target: str | None = None
    session: str | None = None

    FIELDS = ("kind", "ttl", "wait", "where", "priority", "target", "session", "holder", "idempotency_key")

    @classmethod
    def of(cls, raw: bytes) -> AcquireBody:
        body = parse(raw, cls.FIELDS)
        if "kind" not in body:
            raise bad_request("kind", "kind is required")
        kind = _checked("kind", check_kind, body["kind"])
        ttl = body.get("ttl")
        ttl = float(lease_settings.TTL) if ttl is None else _checked("ttl", check_seconds, ttl)
        wait = body.get("wait")
        wait = 0.0 if wait is None else _checked("wait", check_seconds, wait, allow_zero=True)
        if wait > MAX_WAIT:
            raise bad_request("wait", f"wait must be at most {MAX_WAIT:g} seconds, got {wait!r}")
        where = _checked("where", check_where, body.get("where"))
        priority = body.get("priority")
        priority = 0 if priority is None else _checked("priority", check_priority, priority)
        holder = _checked("holder", check_holder, body.get("holder"))
        if holder is not None and len(holder) > MAX_HOLDER:
            raise bad_request("holder", f"holder must be at most {MAX_HOLDER} characters, got {len(holder)}")
        key = body.get("idempotency_key")
        if key is not None:
            if not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY:
                raise bad_request("idempotency_key", f"idempotency_key must be a string of 1 to {MAX_KEY} characters")
            _checked("idempotency_key", check_text, key)
        target = _checked("target", check_target, body.get("target"))
        session = _checked("session", check_target, body.get("session"))
        return cls(kind, ttl, wait, where, priority, holder, key, target, session)


def renew_ttl(raw: bytes) -> float | None:
    """``renew``'s body: ``{"ttl"?}``."""
    body = parse(raw, ("ttl",))
    ttl = body.get("ttl")
    return None if ttl is None else float(_checked("ttl", check_seconds, ttl))


def release_body(raw: bytes) -> float | None:
    """``release``'s body: ``{"cooldown"?}`` (seconds before the resource is granted for the
    lease's target again; None: the policy's)."""
    body = parse(raw, ("cooldown",))
    cooldown = body.get("cooldown")
    return None if cooldown is None else float(_checked("cooldown", check_seconds, cooldown))


def report_body(raw: bytes) -> tuple[str, float | None]:
    """``report``'s body: ``{"outcome", "retry_after"?}``."""
    body = parse(raw, ("outcome", "retry_after"))
    outcome = body.get("outcome")
    if outcome not in OUTCOMES:
        raise bad_request("outcome", f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
    retry_after = body.get("retry_after")
    if retry_after is not None:
        retry_after = _checked("retry_after", check_seconds, retry_after)
    return outcome, retry_after
