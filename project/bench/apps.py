from __future__ import annotations

from django.apps import AppConfig


class BenchConfig(AppConfig):
    """The benchmark command ``lease_bench``; it has no models of its own."""

    name = "project.bench"
    label = "bench"
    default_auto_field = "django.db.models.BigAutoField"
