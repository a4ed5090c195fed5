"""Settings of the demo project that uses resource_lease.

The database comes from DATABASE_URL (mysql://, postgres://, sqlite://); the default is an
embedded SQLite file under var/, set up so several processes can lease at once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from resource_lease.db.settings import database_from_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("RESOURCE_LEASE_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "resource-lease-demo-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")

INSTALLED_APPS = [
    "admin_interface",
    "colorfield",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "resource_lease",
    "project.demo",
    "project.bench",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",  # admin_interface's language chooser
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'resource_lease.sqlite3'}"
DATABASES = {"default": database_from_url(DATABASE_URL, test_dir=VAR_DIR)}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
USE_I18N = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# django-admin-interface shows its pages in frames of its own.
X_FRAME_OPTIONS = "SAMEORIGIN"
SILENCED_SYSTEM_CHECKS = ["security.W019"]

RESOURCE_LEASE = {
    "TTL": float(os.environ.get("RESOURCE_LEASE_TTL", "30")),
    # The audit trail of grants, take-overs, releases and operator actions (admin: Lease events).
    "AUDIT": os.environ.get("RESOURCE_LEASE_AUDIT", "1") == "1",
    # PostgreSQL: the engine's connections prepare their statements (0: off, to compare).
    "PREPARED_STATEMENTS": os.environ.get("RESOURCE_LEASE_PREPARED_STATEMENTS", "1") == "1",
}
# The line of waiters' pacing (docs/waiting.md#settings) and the fallback of other waits, for
# benchmarks that try others and the liveness matrix (tests/test_liveness.py):
# RESOURCE_LEASE_LINE_POLL=0.02 lease_bench --scenario waiting ...
for _key in ("LINE_POLL", "LINE_POLL_MAX", "BACKOFF_BASE", "BACKOFF_MAX"):
    if os.environ.get(f"RESOURCE_LEASE_{_key}"):
        RESOURCE_LEASE[_key] = float(os.environ[f"RESOURCE_LEASE_{_key}"])

# Celery (project/celery.py, docs/celery.md): the broker from CELERY_BROKER_URL (Redis,
# RabbitMQ); by default kombu's filesystem transport under var/, which needs no server, so the
# demo runs on embedded defaults. Results likewise: CELERY_RESULT_BACKEND, else files.
# (The host in filesystem://localhost// means nothing; without one kombu logs a warning.)
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or "filesystem://localhost//"
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or f"file://{VAR_DIR / 'celery-results'}"
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL.startswith("filesystem:"):
    _broker_dir = VAR_DIR / "celery-broker"
    for _folder in ("queue", "control"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # One folder both ways: producers and workers on this machine share the queue.
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "control_folder": str(_broker_dir / "control"),
        "polling_interval": 0.1,
    }
# Extra transport options as JSON, e.g. '{"visibility_timeout": 3600}' for Redis (keep it
# above the longest task plus its retry countdown, or an unacked task is delivered twice).
CELERY_BROKER_TRANSPORT_OPTIONS.update(json.loads(os.environ.get("CELERY_BROKER_TRANSPORT_OPTIONS") or "{}"))
if CELERY_RESULT_BACKEND.startswith("file://"):
    Path(CELERY_RESULT_BACKEND.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A task that holds a lease is acknowledged only once it has finished, so a worker that dies
# mid-task has it delivered again (its lease frees after the ttl); and a worker takes one
# message at a time, so tasks wait in the broker rather than behind a busy slot.
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    # One handler, on the root: Celery's worker replaces the root's handlers with its own,
    # so nothing is printed twice there.
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {"resource_lease": {"level": os.environ.get("RESOURCE_LEASE_LOG", "INFO")}},
}
