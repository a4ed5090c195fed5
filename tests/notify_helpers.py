"""What the notification tests share: a notify_proc child as a JSON-lines Child, and the
check of a watcher's deliveries."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable
from typing import Any

from tests.faults.harness import Child


def notify_child(spawn_worker: Callable[..., subprocess.Popen[str]]) -> Callable[..., Child]:
    """For a test's ``start`` fixture: ``start(*args, env=None)`` runs
    tests/procs/notify_proc.py as a Child (JSON lines on stdout, commands on stdin)."""

    def run(*args: Any, env: dict[str, str] | None = None) -> Child:
        proc = spawn_worker(
            "tests.procs.notify_proc",
            *map(str, args),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        return Child(proc, f"notify_proc-{args[0]}")

    return run


def deliveries(child: Child) -> list[dict[str, Any]]:
    return child.of("got")


def wait_version(child: Child, version: int, timeout: float = 30.0) -> dict[str, Any]:
    return child.wait_for("got", timeout=timeout, where=lambda e: e["version"] >= version)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] if ordered else math.nan


def check_deliveries(got: list[dict[str, Any]], sent: dict[int, Any], final: int) -> list[str]:
    """Versions strictly increase, each with the payload sent under it, the last is final."""
    problems = []
    versions = [e["version"] for e in got]
    if any(b <= a for a, b in zip(versions, versions[1:], strict=False)):
        problems.append(f"versions went backwards or repeated: {versions}")
    for e in got:
        if e["version"] in sent and e["payload"] != sent[e["version"]]:
            problems.append(f"version {e['version']} came with {e['payload']}, was sent with {sent[e['version']]}")
    if not versions or versions[-1] != final:
        problems.append(f"the last delivery is {versions[-1:]} not the final version {final}")
    return problems
