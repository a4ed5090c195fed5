"""``path("lease/api/", include("resource_lease.api.urls"))`` (docs/http.md)."""

from __future__ import annotations

from django.urls import path

from resource_lease.api import views

app_name = "resource_lease_api"

urlpatterns = [
    path("leases", views.leases, name="leases"),
    path("leases/<str:lease_id>", views.lease_detail, name="lease"),
    path("leases/<str:lease_id>/renew", views.renew, name="renew"),
    path("leases/<str:lease_id>/release", views.release, name="release"),
    path("leases/<str:lease_id>/report", views.report, name="report"),
    path("pools", views.pools, name="pools"),
    path("openapi.json", views.openapi, name="openapi"),
]
