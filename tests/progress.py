"""A pytest plugin for ``scripts/test``: writes where a run stands to a JSON file, and lets
Ctrl-C stop a run that ``scripts/test`` started in the background.

``-p tests.progress`` with ``RESOURCE_LEASE_TEST_PROGRESS=<file>``: after collection and
after each test the file holds ``{"collected", "done", "passed", "failed", "skipped",
"failures": [node ids], "current", "started", "finished", "ended", "interrupted"}`` (written whole, atomically), which
``scripts/test_progress.py`` reads to print progress per backend while the runs go on.

A shell that starts a command in the background without job control makes it ignore SIGINT
(POSIX), so Ctrl-C would stop ``scripts/test`` and leave its pytest runs going; this plugin
gives SIGINT back its usual meaning (KeyboardInterrupt: pytest stops, prints its summary
and writes its JUnit report of the tests run so far), once: further SIGINTs are ignored
while the run cleans up.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest


class Progress:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.state: dict[str, Any] = {
            "collected": None,
            "done": 0,
            "passed": 0,
            "failed": 0,
            "skipped": 0,
            "failures": [],
            "current": "",
            "started": time.time(),
            "finished": False,
        }
        self._failed: set[str] = set()
        self._skipped: set[str] = set()
        self.write()

    def write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.path)

    @pytest.hookimpl
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.state["collected"] = len(session.items)
        self.write()

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.state["current"] = nodeid
        self.write()

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        state, nodeid = self.state, report.nodeid
        if report.failed and nodeid not in self._failed:
            self._failed.add(nodeid)
            state["failures"].append(nodeid)
            state["failed"] += 1
            self.write()
        elif report.skipped:
            self._skipped.add(nodeid)
        if report.when == "teardown":
            state["done"] += 1
            if nodeid in self._failed:
                pass
            elif nodeid in self._skipped:
                state["skipped"] += 1
            else:
                state["passed"] += 1
            self.write()

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.state["finished"] = True
        self.state["ended"] = time.time()
        self.state["interrupted"] = exitstatus == pytest.ExitCode.INTERRUPTED
        self.write()


def _interrupted(signum: int, frame: Any) -> None:
    # Once: a second SIGINT (a second Ctrl-C, or scripts/test passing the first one on) must
    # not cut short the clean-up (test databases dropped, the JUnit report written).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGINT, _interrupted)
    path = os.environ.get("RESOURCE_LEASE_TEST_PROGRESS")
    if path:
        config.pluginmanager.register(Progress(Path(path)), "resource_lease_progress")
