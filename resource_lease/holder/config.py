"""A ``ResourceHolder``'s configuration: the class attributes and constructor arguments,
each checked (``ValueError`` naming the argument) and resolved against the settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resource_lease.conf import lease_settings
from resource_lease.lease import safety_margin
from resource_lease.validation import (
    check_kind,
    check_priority,
    check_seconds,
    check_where,
    resolve_ttl,
    resolve_using,
)


@dataclass(frozen=True)
class HolderConfig:
    """What a holder leases and how: every value checked, every default resolved."""

    kind: str
    ttl: float
    renew_interval: float
    quarantine_seconds: float
    using: str
    where: dict[str, Any] | None = None
    priority: int = 0

    @classmethod
    def resolve(
        cls,
        holder_class: type[Any],
        *,
        kind: str | None,
        ttl: float | None,
        renew_interval: float | None,
        quarantine_seconds: float | None,
        using: str | None,
        where: dict[str, Any] | None = None,
        priority: int | None = None,
    ) -> HolderConfig:
        """The arguments given, else ``holder_class``'s attributes, else the settings.

        ``renew_interval`` must leave time to renew before the local deadline (ttl less the
        safety margin); it defaults to ttl x ``RENEW_FRACTION``.
        """
        kind = holder_class.kind if kind is None else kind
        if kind == "" and holder_class.kind == "":
            raise ValueError(
                f"kind must be set: give {holder_class.__name__} a class attribute kind = '...' or pass kind="
            )
        checked_kind = check_kind(kind)
        ttl = holder_class.ttl if ttl is None else ttl
        checked_ttl = resolve_ttl(ttl)
        interval = holder_class.renew_interval if renew_interval is None else renew_interval
        if interval is None:
            interval = checked_ttl * float(lease_settings.RENEW_FRACTION)
        checked_interval = check_seconds(interval, "renew_interval")
        if checked_interval >= checked_ttl:
            raise ValueError(f"renew_interval must be shorter than ttl ({checked_ttl:g}s), got {interval!r}")
        trusted_for = checked_ttl - safety_margin(checked_ttl)
        if checked_interval >= trusted_for:
            raise ValueError(
                f"renew_interval must be shorter than the time a lease is trusted without renewal"
                f" (ttl {checked_ttl:g}s less the safety margin = {trusted_for:g}s), got {interval!r}"
            )
        quarantine = holder_class.quarantine_seconds if quarantine_seconds is None else quarantine_seconds
        checked_quarantine = check_seconds(
            lease_settings.QUARANTINE_SECONDS if quarantine is None else quarantine, "quarantine_seconds"
        )
        checked_using = resolve_using(using)
        checked_where = check_where(getattr(holder_class, "where", None) if where is None else where)
        checked_priority = check_priority(getattr(holder_class, "priority", 0) if priority is None else priority)
        return cls(
            checked_kind,
            checked_ttl,
            checked_interval,
            checked_quarantine,
            checked_using,
            checked_where,
            checked_priority,
        )


def check_thread_name(name: Any) -> str | None:
    """A holder's thread name: None (a generated one) or a non-empty string."""
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ValueError(f"name must be a non-empty string or None, got {name!r}")
    return name
