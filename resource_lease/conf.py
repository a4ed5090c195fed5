"""Settings: one dict, ``settings.RESOURCE_LEASE``, read lazily with typed defaults.

Values are read from Django's settings on first use and cached until ``RESOURCE_LEASE``
changes (``override_settings`` sends ``setting_changed``), so tests can override them and
the acquire path pays a dictionary lookup per read. Unknown keys are reported by the system check ``resource_lease.E004``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver


class LeaseSettings:
    #: Seconds a lease lasts without renewal when ``acquire()`` is given no ttl.
    TTL: float = 30.0
    #: Database alias used when ``acquire()`` is given no ``using``.
    DATABASE: str = "default"
    #: Fraction of the ttl between two background renewals.
    RENEW_FRACTION: float = 1 / 3
    #: A holder stops trusting its lease this fraction of the ttl before the
    #: local deadline (capped by SAFETY_MARGIN_MAX seconds).
    SAFETY_MARGIN: float = 0.1
    SAFETY_MARGIN_MAX: float = 2.0
    #: First and largest pause (seconds) between attempts while waiting for a resource.
    BACKOFF_BASE: float = 0.02
    BACKOFF_MAX: float = 1.0
    #: Retries of a statement the database aborted for a transient reason
    #: (deadlock, lock wait timeout, serialization failure, SQLite busy).
    TRANSIENT_RETRIES: int = 8
    #: Seconds a lease statement may wait for a row lock (MySQL innodb_lock_wait_timeout,
    #: PostgreSQL lock_timeout) so a renewal cannot hang past its ttl.
    LOCK_WAIT_TIMEOUT: float = 5.0
    #: Default quarantine length (seconds) for a resource found invalid.
    QUARANTINE_SECONDS: float = 3600.0
    #: Keep an audit trail of lease events (``LeaseEvent``): grants, take-overs, releases,
    #: losses and operators' actions. Off by default: a busy pool writes two rows per lease.
    AUDIT: bool = False
    #: Seconds between two batch writes of the audit trail's background thread.
    AUDIT_FLUSH_INTERVAL: float = 1.0
    #: Events kept in memory at most while the database cannot take them; beyond, new
    #: events are dropped (and the drop is logged) rather than slowing the lease path.
    AUDIT_MAX_BUFFERED: int = 10_000
    #: Age (days) beyond which ``manage.py prune_lease_events`` deletes events by default.
    AUDIT_RETENTION_DAYS: float = 30.0

    def __getattribute__(self, name: str) -> Any:
        if not name.isupper():
            return object.__getattribute__(self, name)
        # Resolved once and cached on the instance until RESOURCE_LEASE changes.
        cache = object.__getattribute__(self, "__dict__")
        if name not in cache:
            user = getattr(settings, "RESOURCE_LEASE", None) or {}
            cache[name] = user[name] if name in user else getattr(type(self), name)
        return cache[name]

    def reload(self) -> None:
        """Forget the cached values (done automatically when RESOURCE_LEASE changes)."""
        self.__dict__.clear()

    @classmethod
    def known_keys(cls) -> set[str]:
        return {key for key in vars(cls) if key.isupper()}


lease_settings = LeaseSettings()


@receiver(setting_changed)
def _reload_on_change(setting: str, **kwargs: Any) -> None:
    if setting == "RESOURCE_LEASE":
        lease_settings.reload()
