from django.contrib import admin
from django.urls import include, path

from resource_lease.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    # Lease over HTTP (docs/http.md).
    path("lease/api/", include("resource_lease.api.urls")),
    # Prometheus scrapes the app's metrics here (in production, where only Prometheus can reach).
    path("metrics", metrics_view),
    # The admin theme's language chooser posts to Django's set_language view.
    path("i18n/", include("django.conf.urls.i18n")),
]
