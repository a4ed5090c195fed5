"""The URLs of the processes a test starts (tests/settings.py, ``RESOURCE_LEASE_TEST_CHILD``):
none. They serve no page, and the project's URLs need the admin, which they do not load (the
system checks that ``manage.py`` and Celery's worker run would look it up)."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
