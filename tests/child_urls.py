"""The URLs of the processes a test starts (tests/settings.py, ``RESOURCE_LEASE_TEST_CHILD``):
only the HTTP API (the uvicorn servers of tests/test_api_servers.py). The project's URLs need
the admin, which they do not load (the system checks that ``manage.py`` and Celery's worker
run would look it up)."""

from __future__ import annotations

from django.urls import URLResolver, include, path

urlpatterns: list[URLResolver] = [path("lease/api/", include("resource_lease.api.urls"))]
