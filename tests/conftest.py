"""Shared fixtures: a pool of resources, worker processes on the test database, holders
(ResourceHolder) terminated after the test, and logged-in admin clients."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, override_settings

from resource_lease import audit
from resource_lease.db.connections import close_connections, close_every_connection
from resource_lease.db.listen import hub
from resource_lease.health import forget_policies
from resource_lease.holder import ResourceHolder
from resource_lease.line import forget_lines
from resource_lease.line.wakeups import forget_subscriptions
from resource_lease.models import Resource
from tests import sharding
from tests.api_servers import servers  # noqa: F401 - the HTTP API's uvicorn servers
from tests.holder_helpers import Holder

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def vendor() -> str:
    return connection.vendor


@pytest.fixture
def make_pool(transactional_db: None) -> Callable[..., list[Resource]]:
    """``make_pool(kind, n, **fields)``: n committed resources named ``<kind>-<i>``."""

    def make(kind: str = "proxy", n: int = 3, **fields: Any) -> list[Resource]:
        rows = [
            Resource(kind=kind, name=f"{kind}-{i}", data={"url": f"http://10.0.0.{i}:8080"}, **fields) for i in range(n)
        ]
        Resource.objects.bulk_create(rows)
        return list(Resource.objects.filter(kind=kind).order_by("name"))

    return make


@pytest.fixture(autouse=True)
def _close_lease_connections() -> Iterator[None]:
    # The engine's private connections must not outlive a test (the test database is
    # flushed or dropped behind them).
    yield
    close_connections()
    forget_subscriptions()  # the line's LISTEN (PostgreSQL) must not outlive the test either
    forget_lines()  # nor this process's memory of the marks it wrote on the test's rows
    forget_policies()  # nor the pool policies it read
    hub().close()
    close_every_connection()  # those of the worker threads of async code (resource_lease.aio) too


def worker_env(**extra: str) -> dict[str, str]:
    """Environment for a child process that must use the current test database."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["RESOURCE_LEASE_TEST_CHILD"] = "1"  # a lean child: no admin (tests/settings.py)
    env["RESOURCE_LEASE_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_demo(command: str, *args: str) -> str:
    """Run ``manage.py <command> <args>`` (a demo of the main job) on the test database; its
    output, after checking it exited 0 (the demos check their own claims and fail otherwise)."""
    proc = subprocess.run(
        [sys.executable, "manage.py", command, *args],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def spawn(module: str, *args: str, env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen[str]:
    """Start ``python -m <module> <args>`` on the test database."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        env=env or worker_env(),
        cwd=REPO,
        text=True,
        **popen,
    )


@pytest.fixture
def spawn_worker() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Like ``spawn``, and every process still alive at the end of the test is killed."""
    procs: list[subprocess.Popen[str]] = []

    def start(module: str, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
        proc = spawn(module, *args, **kwargs)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@pytest.fixture
def holders() -> Iterator[Callable[..., Any]]:
    """``holders(cls, **kwargs)`` makes a holder that is terminated at the end of the test."""
    made: list[ResourceHolder] = []

    def make(cls: type[ResourceHolder] = Holder, **kwargs: Any) -> Any:
        holder = cls(**kwargs)
        made.append(holder)
        return holder

    yield make
    for holder in made:
        holder.terminate(timeout=30)
        assert not holder.is_alive()


@pytest.fixture
def staff(django_user_model: type[User]) -> Callable[..., Client]:
    """``staff(*perms, superuser=False)``: a logged-in client of a staff user with those perms
    (users are named ``user0``, ``user1``, ... in the order they are made)."""

    def login(*perms: str, superuser: bool = False) -> Client:
        name = f"user{User.objects.count()}"
        if superuser:
            user = django_user_model.objects.create_superuser(name, f"{name}@example.com", "pw")
        else:
            user = django_user_model.objects.create_user(name, f"{name}@example.com", "pw", is_staff=True)
            user.user_permissions.set(Permission.objects.filter(codename__in=perms))
        client = Client()
        client.force_login(user)
        return client

    return login


@pytest.fixture
def admin_client(staff: Callable[..., Client]) -> Client:
    """A logged-in client of a superuser (pytest-django's fixture of that name, made by ``staff``)."""
    return staff(superuser=True)


@pytest.fixture
def audit_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., audit.AuditWriter]]:
    """``audit_on(**settings)``: the trail on, with a fresh writer stopped after the test."""
    writers: list[audit.AuditWriter] = []
    overrides: list[override_settings] = []

    def enable(**extra: Any) -> audit.AuditWriter:
        override = override_settings(RESOURCE_LEASE={**settings.RESOURCE_LEASE, "AUDIT": True, **extra})
        override.enable()
        overrides.append(override)
        writer = audit.AuditWriter()
        monkeypatch.setattr(audit, "writer", writer)
        writers.append(writer)
        return writer

    yield enable
    for writer in writers:
        writer.shutdown()  # its last round is stored before the test database is flushed
    for override in reversed(overrides):
        override.disable()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A shard's or a phase's share of the tests (tests/sharding.py), when scripts/test asks."""
    shard, phase = sharding.from_environment()
    if shard is None and phase is None:
        return
    kept, dropped = sharding.select(list(items), shard, phase, sharding.BACKENDS[connection.vendor])
    items[:] = kept  # type: ignore[assignment]
    if dropped:
        config.hook.pytest_deselected(items=dropped)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The examples each entry point was tried with by the property tests (tests/properties.py)."""
    properties = sys.modules.get("tests.properties")
    lines = properties.tally_lines() if properties is not None else []
    if lines:
        terminalreporter.section(f"generated inputs (Hypothesis) on {connection.vendor}")
        for line in lines:
            terminalreporter.write_line(line)
