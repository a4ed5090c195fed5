"""ASGI entry point of the demo project: ``uvicorn project.asgi:application`` serves the
admin and the HTTP API (docs/http.md)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

application = get_asgi_application()
