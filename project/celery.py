"""The project's Celery app, ``app``.

The broker comes from CELERY_BROKER_URL (Redis, RabbitMQ); without it, kombu's filesystem
transport under var/ (no server needed). See the CELERY_* settings and docs/celery.md.

    celery -A project worker -l info
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project", include=["project.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
