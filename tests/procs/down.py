"""Every command and public entry point against the alias ``down``, whose server never
answers (tests/settings.py adds it under RESOURCE_LEASE_TEST_DOWN_ALIAS): prints one JSON
line per call with what it raised (or, for a command, its exit status and output)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from django.core.management import ManagementUtility  # noqa: E402

from resource_lease import (  # noqa: E402
    Config,
    Dispenser,
    DoubleBarrier,
    Election,
    Group,
    ResourceHolder,
    acquire,
    lock,
    notify,
    pool,
    semaphore,
)

ITEMS = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
ITEMS.write("a\nb\n")
ITEMS.close()
SEED = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
SEED.write("10.0.0.1:8080\n")
SEED.close()
GPUS = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
GPUS.write("name,device\ngpu-0,0\n")
GPUS.close()

COMMANDS = [
    ["inspect_pool", "--database", "down"],
    ["inspect_pool", "--json", "--database", "down"],
    ["inspect_locks", "--database", "down"],
    ["inspect_groups", "--database", "down"],
    ["inspect_dispensers", "--database", "down"],
    ["inspect_dispensers", "--dispenser", "nope", "--database", "down"],
    ["inspect_topics", "--database", "down"],
    ["force_release", "--kind", "proxy", "--database", "down"],
    ["quarantine", "--kind", "proxy", "--seconds", "60", "--reason", "502s", "--database", "down"],
    ["restore", "--kind", "proxy", "--database", "down"],
    ["seed_proxies", SEED.name, "--database", "down"],
    ["seed_resources", GPUS.name, "--kind", "gpu", "--database", "down"],
    ["prune_lease_events", "--days", "30", "--database", "down"],
    ["enqueue", "crawl", ITEMS.name, "--database", "down"],
    ["run_worker", "tests.procs.sample_workers.OnDown", "--name", "w1", "--until-empty"],
]


class Holder(ResourceHolder):
    kind = "proxy"

    def is_valid(self) -> bool:
        return True


def _campaign() -> Any:
    with Election("nightly", using="down").campaign(timeout=0):
        pass


def _lock() -> Any:
    with lock("rebuild", using="down", timeout=0):
        pass


def _semaphore() -> Any:
    with semaphore("exports", slots=2, using="down", timeout=0):
        pass


CALLS: dict[str, Callable[[], Any]] = {
    "acquire": lambda: acquire("proxy", using="down"),
    "acquire(timeout=5)": lambda: acquire("proxy", using="down", timeout=5),
    "lock": _lock,
    "semaphore": _semaphore,
    "Election.campaign": _campaign,
    "Group.join": lambda: Group("crawlers", using="down").join(),
    "DoubleBarrier.enter": lambda: DoubleBarrier("b", size=2, using="down").enter(timeout=1),
    "Dispenser.put": lambda: Dispenser("d", using="down").put(["a"]),
    "Dispenser.assign": lambda: Dispenser("d", using="down").assign("w"),
    "Dispenser.counts": lambda: Dispenser("d", using="down").counts(),
    "Dispenser.is_empty": lambda: Dispenser("d", using="down").is_empty(),
    "notify": lambda: notify("index-built", using="down"),
    "Config": lambda: Config("c", defaults={"a": 1}, using="down"),
    "ResourceHolder.acquire": lambda: Holder(using="down").acquire(timeout=0),
    "pool.counts": lambda: pool.counts(using="down"),
    "pool.quarantine": lambda: pool.quarantine([1], reason="x", seconds=5, using="down"),
    "pool.restore": lambda: pool.restore([1], using="down"),
    "pool.force_release": lambda: pool.force_release([1], using="down"),
    "pool.database_now": lambda: pool.database_now("down"),
}


def command(argv: list[str]) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    status: Any = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            ManagementUtility(["manage.py", *argv]).execute()
        except SystemExit as exc:
            status = exc.code
        except Exception:  # noqa: BLE001  (what the user would see as a traceback)
            status = "uncaught"
            traceback.print_exc()
    return {"command": " ".join(argv), "status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}


def call(name: str, fn: Callable[[], Any]) -> dict[str, Any]:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001  (whatever it raised is the finding)
        return {"call": name, "raised": type(exc).__name__, "message": str(exc), "alias": getattr(exc, "alias", None)}
    return {"call": name, "raised": None}


if __name__ == "__main__":
    for argv in COMMANDS:
        print(json.dumps(command(argv)), flush=True)
    for name, fn in CALLS.items():
        print(json.dumps(call(name, fn)), flush=True)
    from prometheus_client import REGISTRY

    labels = {"kind": "proxy", "outcome": "error"}
    errors = REGISTRY.get_sample_value("resource_lease_acquire_wait_seconds_count", labels)
    print(json.dumps({"call": "metrics", "raised": None, "errors": errors}), flush=True)
    for made in (ITEMS, SEED, GPUS):
        os.unlink(made.name)
    sys.exit(0)
