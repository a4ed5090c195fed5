from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # The admin theme's language chooser posts to Django's set_language view.
    path("i18n/", include("django.conf.urls.i18n")),
]
