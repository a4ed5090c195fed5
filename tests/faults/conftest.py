"""Fixtures of the fault suite, and the table of figures printed at the end of the run.

Every scenario records one line of figures (grants, violations, recovery times) with the
``figures`` fixture; ``pytest_terminal_summary`` prints them whether or not output is
captured, so they show in CI logs, and they are also written to ``var/faults-<vendor>.json``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tests.conftest import worker_env
from tests.faults.harness import Child, long_seconds

_FIGURES: list[dict[str, Any]] = []


@pytest.fixture
def figures() -> Callable[..., dict[str, Any]]:
    """``figures(scenario, **values)``: record one line of figures for this database."""

    def record(scenario: str, **values: Any) -> dict[str, Any]:
        line = {"scenario": scenario, "db": connection.vendor, **values}
        _FIGURES.append(line)
        return line

    return record


@pytest.fixture
def start_child(spawn_worker: Callable[..., subprocess.Popen[str]]) -> Callable[..., Child]:
    """``start_child(program, *args, env=...)``: a worker from tests/procs, as a Child."""
    counter = itertools.count(1)

    def start(program: str, *args: Any, env: dict[str, str] | None = None) -> Child:
        proc = spawn_worker(
            f"tests.procs.{program}",
            *map(str, args),
            env=worker_env(DJANGO_SETTINGS_MODULE="tests.faults.settings", **(env or {})),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        return Child(proc, f"{program}-{next(counter)}")

    return start


@pytest.fixture
def start_holder(start_child: Callable[..., Child]) -> Callable[..., Child]:
    """``start_holder(kind, ttl, auto_renew=True, timeout=30, env=...)``: tests/procs/holder.py."""

    def start(
        kind: str, ttl: float, *, auto_renew: bool = True, timeout: float = 30, env: dict[str, str] | None = None
    ) -> Child:
        flags = ["--auto-renew"] if auto_renew else []
        return start_child("holder", "--kind", kind, "--ttl", ttl, "--timeout", timeout, *flags, env=env)

    return start


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not _FIGURES:
        return
    mode = f"long ({long_seconds():g}s per scenario)" if long_seconds() else "short"
    terminalreporter.section(f"fault figures ({mode})")
    for line in _FIGURES:
        rest = " ".join(f"{k}={_format(v)}" for k, v in line.items() if k not in ("scenario", "db"))
        terminalreporter.write_line(f"{line['scenario']:<28} {line['db']:<10} {rest}")
    var = Path(getattr(settings, "VAR_DIR", "var"))
    vendors = sorted({line["db"] for line in _FIGURES})
    for vendor in vendors:
        path = var / f"faults-{vendor}.json"
        rows = [line for line in _FIGURES if line["db"] == vendor]
        path.write_text(json.dumps({"mode": mode, "figures": rows}, indent=1, default=str) + "\n")
