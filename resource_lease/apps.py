from __future__ import annotations

from django.apps import AppConfig


class ResourceLeaseConfig(AppConfig):
    name = "resource_lease"
    verbose_name = "Resource leases"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from resource_lease import (
            checks,  # noqa: F401  (registers the system checks)
            metrics,
        )
        from resource_lease.audit import connect_receivers

        connect_receivers()
        metrics.install()  # nothing without prometheus_client
