"""What the admin and the commands show of a resource: its state by the database's clock,
times left in words, the payload's URL with the password masked (and the payload as the
admin's change form shows it and takes it back)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import QuerySet

from resource_lease.db.clock import DbNow
from resource_lease.models import Resource
from resource_lease.pool import with_state
from resource_lease.proxy_urls import mask_url, unmask_url


def with_display_state(queryset: QuerySet[Resource]) -> QuerySet[Resource]:
    """``pool.with_state`` plus ``db_now``, the database's time, for quarantine countdowns."""
    return with_state(queryset).annotate(db_now=DbNow())


def quarantine_left(resource: Any) -> dt.timedelta | None:
    """Time until the quarantine of an annotated resource ends, by the database's clock."""
    until, now = resource.quarantined_until, getattr(resource, "db_now", None)
    if until is None or now is None or until <= now:
        return None
    return until - now


def lock_delay_until(resource: Any) -> dt.datetime | None:
    """When the lock delay of an annotated resource ends, while it runs: its grant expired
    unreleased less than its ``lock_delay`` ago (by the database's clock), so nobody is granted
    it yet; None otherwise."""
    now, delay = getattr(resource, "db_now", None), getattr(resource, "lock_delay", 0.0) or 0.0
    if now is None or not delay or not resource.grant_token or resource.busy_before > now:
        return None
    until: dt.datetime = resource.busy_before + dt.timedelta(seconds=delay)
    return until if until > now else None


def current_holder(resource: Any) -> str:
    """The holder of the current grant, live or expired ('' once released: the column keeps the
    last holder, which is not worth showing as if it held the resource)."""
    return resource.holder if resource.grant_token else ""


def payload_url(resource: Resource) -> str:
    """The payload's ``url`` with any password masked ('' when there is none)."""
    data = resource.data if isinstance(resource.data, dict) else {}
    return mask_url(data.get("url"))


def mask_payload(data: Any) -> Any:
    """``data`` as the admin shows it: a copy with the password of ``data["url"]`` masked
    (``data`` itself when there is none to mask)."""
    if isinstance(data, dict) and isinstance(data.get("url"), str):
        masked = mask_url(data["url"])
        if masked != data["url"]:
            return {**data, "url": masked}
    return data


def unmask_payload(submitted: Any, stored: Any) -> Any:
    """The payload an operator sent back from a masked form, with the stored password of
    ``data["url"]`` put back where the mask was left (``proxy_urls.unmask_url``; its
    ``ValueError`` when the mask would be carried to another user, host or port). A payload
    without ``url`` has none: removing the key removes the password with it."""
    if not isinstance(submitted, dict) or "url" not in submitted:
        return submitted
    stored_url = stored.get("url") if isinstance(stored, dict) else None
    url = unmask_url(submitted["url"], stored_url)
    return submitted if url is submitted["url"] else {**submitted, "url": url}


def format_duration(value: dt.timedelta | float | None) -> str:
    """``"45s"``, ``"4m 03s"``, ``"2h 05m"``, ``"3d 04h"``; ``"<1s"`` under a second; '' for None."""
    if value is None:
        return ""
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    if seconds < 1:
        return "<1s"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def format_wait(seconds: float | None, *, bound: bool = False) -> str:
    """A wait: ``"12 ms"``, ``"0.25 s"``, ``"4.2 s"``, then as ``format_duration``; with
    ``bound``, a histogram bucket's bound (``"≤ 0.25 s"``; the last one is ``"> 300 s"``)."""
    if seconds is None:
        return "-"
    if seconds == float("inf"):
        return "> 300 s"
    prefix = "≤ " if bound else ""
    if seconds < 0.1:
        return f"{prefix}{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{prefix}{seconds:.3g} s"
    return prefix + format_duration(seconds)
