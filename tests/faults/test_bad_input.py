"""Scenario 9: bad input to every entry point (acquire, Lease.renew, the pool functions,
ResourceHolder, the management commands, the Celery options): a ValueError (CommandError
for commands) that names the argument, and nothing written (the table compared before and
after). The plain cases (ttl 0, NaN, a str) are in tests/test_lease.py; these are the ones
that used to reach the database: absurd lengths of time, text no database stores as given,
and arguments of the wrong type deep inside the pool functions.

Entry points that are not in this checkout yet (ResourceHolder, the commands) are reported
as skipped cases in the figures line.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command, get_commands

from resource_lease import Config, Dispenser, Group, acquire, notify, pool
from resource_lease.models import Resource
from resource_lease.validation import MAX_SECONDS
from tests.faults.harness import table_snapshot

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

Case = tuple[str, str, Callable[[list[Resource]], Any]]

NUL = "a\x00b"
SURROGATE = "a\ud800b"

CASES: list[Case] = [
    # acquire
    ("acquire ttl=1e12", "ttl", lambda rows: acquire("bad", ttl=1e12)),
    ("acquire ttl=2**70", "ttl", lambda rows: acquire("bad", ttl=2**70)),
    ("acquire ttl just over the cap", "ttl", lambda rows: acquire("bad", ttl=MAX_SECONDS * 1.0001)),
    ("acquire timeout=1e12", "timeout", lambda rows: acquire("bad", ttl=5, timeout=1e12)),
    ("acquire kind with NUL", "kind", lambda rows: acquire(NUL, ttl=5)),
    ("acquire kind with a lone surrogate", "kind", lambda rows: acquire(SURROGATE, ttl=5)),
    ("acquire holder with NUL", "holder", lambda rows: acquire("bad", ttl=5, holder=NUL)),
    ("acquire holder with a lone surrogate", "holder", lambda rows: acquire("bad", ttl=5, holder=SURROGATE)),
    ("acquire using=5", "using", lambda rows: acquire("bad", ttl=5, using=5)),  # type: ignore[arg-type]
    # Lease.renew (the grant itself is made before the snapshot, see _held)
    ("renew ttl=1e12", "ttl", lambda rows: _held(rows).renew(ttl=1e12)),
    ("renew ttl=2**70", "ttl", lambda rows: _held(rows).renew(ttl=2**70)),
    ("renew ttl=-0.0", "ttl", lambda rows: _held(rows).renew(ttl=-0.0)),
    # the pool functions
    ("quarantine resources=str", "resources", lambda rows: pool.quarantine("bad-0", reason="x", seconds=5)),  # type: ignore[arg-type]
    ("quarantine resources=None", "resources", lambda rows: pool.quarantine(None, reason="x", seconds=5)),  # type: ignore[arg-type]
    ("quarantine resources=[None]", "resources", lambda rows: pool.quarantine([None], reason="x", seconds=5)),  # type: ignore[list-item]
    ("quarantine resources=[True]", "resources", lambda rows: pool.quarantine([True], reason="x", seconds=5)),
    ("quarantine resources=[1.5]", "resources", lambda rows: pool.quarantine([1.5], reason="x", seconds=5)),  # type: ignore[list-item]
    (
        "quarantine resources=users",
        "resources",
        lambda rows: pool.quarantine(User.objects.all(), reason="x", seconds=5),  # type: ignore[arg-type]
    ),
    ("quarantine seconds=1e12", "seconds", lambda rows: pool.quarantine(rows, reason="x", seconds=1e12)),
    ("quarantine seconds=1e15", "seconds", lambda rows: pool.quarantine(rows, reason="x", seconds=1e15)),
    ("quarantine reason with NUL", "reason", lambda rows: pool.quarantine(rows, reason=NUL, seconds=5)),
    ("quarantine using='nope'", "using", lambda rows: pool.quarantine(rows, reason="x", seconds=5, using="nope")),
    ("quarantine using=5", "using", lambda rows: pool.quarantine(rows, reason="x", seconds=5, using=5)),  # type: ignore[arg-type]
    ("restore resources=str", "resources", lambda rows: pool.restore("abc")),  # type: ignore[arg-type]
    ("restore using='nope'", "using", lambda rows: pool.restore(rows, using="nope")),
    ("force_release resources=[object()]", "resources", lambda rows: pool.force_release([object()])),  # type: ignore[list-item]
    ("force_release using=5", "using", lambda rows: pool.force_release(rows, using=5)),  # type: ignore[arg-type]
    ("counts queryset=str", "queryset", lambda rows: pool.counts("abc")),  # type: ignore[arg-type]
    ("counts queryset=list", "queryset", lambda rows: pool.counts(rows)),  # type: ignore[arg-type]
    ("with_state queryset=None", "queryset", lambda rows: pool.with_state(None)),  # type: ignore[arg-type]
    ("database_now using='nope'", "using", lambda rows: pool.database_now("nope")),
    # the one JSON rule (issue 37): too deep for MariaDB, keys JSON would turn into text, -0.0
    ("notify payload 31 deep", "payload", lambda rows: notify("bad", payload=_deep(31))),
    ("notify payload 3000 deep", "payload", lambda rows: notify("bad", payload=_deep(3000))),
    ("Dispenser.put a None key inside", "items['k']", lambda rows: Dispenser("bad").put({"k": {"a": {None: 1}}})),
    ("Group data with -0.0", "data", lambda rows: Group("bad", member="m", data={"x": -0.0})),
    ("Config.set an int key", "config key 'd'", lambda rows: Config("bad", defaults={"d": {}}).set("d", {1: 2})),
    ("acquire where key '-a'", "where", lambda rows: acquire("bad", ttl=5, where={"-a": 1})),
]


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _held(rows: list[Resource]) -> Any:
    return _held.lease  # type: ignore[attr-defined]


def _optional_cases() -> tuple[list[Case], list[str]]:
    """Cases for entry points that may not be in this checkout yet, and the names missing."""
    cases: list[Case] = []
    missing: list[str] = []
    try:
        holder_module = importlib.import_module("resource_lease.holder")
    except ImportError:
        missing.append("ResourceHolder")
    else:

        class Holder(holder_module.ResourceHolder):  # type: ignore[name-defined,misc]
            kind = "bad"

            def is_valid(self) -> bool:
                return True

        cases += [
            ("ResourceHolder ttl=1e12", "ttl", lambda rows: Holder(ttl=1e12)),
            ("ResourceHolder kind with NUL", "kind", lambda rows: Holder(kind=NUL)),
            ("ResourceHolder holder with a lone surrogate", "holder", lambda rows: Holder(holder=SURROGATE)),
        ]
    try:
        from resource_lease.contrib.celery import LeaseTask
    except ImportError:
        missing.append("LeaseTask")
    else:

        def task(**options: Any) -> Any:
            return type("BadTask", (LeaseTask,), {"lease_kind": "bad", **options})

        cases += [
            ("LeaseTask lease_ttl=1e12", "lease_ttl", lambda rows: task(lease_ttl=1e12)),
            ("LeaseTask lease_timeout=1e12", "lease_timeout", lambda rows: task(lease_timeout=1e12)),
            ("LeaseTask lease_kind with NUL", "lease_kind", lambda rows: task(lease_kind=NUL)),
        ]
    commands = get_commands()
    if "inspect_pool" in commands:
        cases += [
            ("inspect_pool --kind with NUL", "kind", lambda rows: call_command("inspect_pool", "--kind", NUL)),
            ("inspect_pool --database nope", "database", lambda rows: call_command("inspect_pool", "--database", "x")),
        ]
    else:
        missing.append("inspect_pool")
    if "seed_proxies" in commands:
        cases += [
            ("seed_proxies a bad line", "line 2", lambda rows: call_command("seed_proxies", _proxy_file())),
            (
                "seed_proxies --kind NUL",
                "kind",
                lambda rows: call_command("seed_proxies", _proxy_file(), "--kind", NUL),
            ),
        ]
    else:
        missing.append("seed_proxies")
    if "prune_lease_events" in commands:
        for days in ("1e12", "1e8", "3e6", "-1", "nan"):
            cases.append(
                (
                    f"prune_lease_events --days {days}",
                    "days",
                    lambda rows, d=days: call_command("prune_lease_events", "--days", d),
                )
            )
    else:
        missing.append("prune_lease_events")
    return cases, missing


def _proxy_file() -> str:
    path = Path(_proxy_file.directory) / "proxies.txt"  # type: ignore[attr-defined]
    path.write_text("http://10.1.1.1:8080\nnot a proxy at all\n")
    return str(path)


def test_bad_input_is_refused_by_name_and_nothing_is_written(
    make_pool: Callable[..., list[Resource]], tmp_path: Path, figures: Callable[..., Any]
) -> None:
    rows = make_pool("bad", 2)
    _held.lease = acquire("bad", ttl=30)  # type: ignore[attr-defined]
    _proxy_file.directory = tmp_path  # type: ignore[attr-defined]
    optional, missing = _optional_cases()
    problems: list[str] = []
    for label, name, call in CASES + optional:
        before = table_snapshot()
        try:
            call(rows)
        except (ValueError, CommandError) as exc:
            if name not in str(exc):
                problems.append(f"{label}: the error does not name {name!r}: {exc}")
        except Exception as exc:  # noqa: BLE001  (any other error is the finding)
            problems.append(f"{label}: {type(exc).__name__} instead of a ValueError: {exc}")
        else:
            problems.append(f"{label}: accepted")
        if table_snapshot() != before:
            problems.append(f"{label}: the table changed")
    _held.lease.release()  # type: ignore[attr-defined]
    figures(
        "9-bad-input",
        cases=len(CASES) + len(optional),
        violations=len(problems),
        skipped=",".join(missing) or "none",
    )
    assert not problems, problems
