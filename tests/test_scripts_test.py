"""``scripts/test`` itself: test-specific default database names, what it says before and
while it runs (progress per backend, failures at once), and a summary after Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

# The script does not depend on the database under test: run it once, with the SQLite run.
pytestmark = pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")), reason="scripts/test itself is tested once, on the SQLite run"
)

DOWN = {"MARIADB_URL": "mysql://root@127.0.0.1:1/nowhere", "POSTGRES_URL": "postgres://postgres@127.0.0.1:1/nowhere"}

TESTS = """
import time

def test_fast():
    pass

def test_fails():
    assert 1 == 2, "a failure named while the run goes on"

def test_slow():
    time.sleep(300)

def test_never_reached():
    pass
"""


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("MARIADB_URL", "POSTGRES_URL", "DATABASE_URL")}
    environ.pop("PYTHONPATH", None)
    environ.update(RESOURCE_LEASE_TEST_VAR=str(tmp_path / "var"), **extra)
    return environ


def test_the_default_databases_are_the_tests_own_and_the_plan_says_where(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["scripts/test", "--plan"], cwd=REPO, env=env(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for backend in ("mariadb", "postgresql"):
        said = re.search(rf"^test: {backend}: (server \S+: database (\S+) |skipped)", out, re.MULTILINE)
        assert said, out
        if said.group(2):
            # Never "resource_lease": a user's own database on a shared server.
            assert said.group(2) == "resource_lease_tests", out
            assert "the tests run in test_resource_lease_tests, created and dropped by pytest-django" in out
    assert f"test: sqlite: database files under {tmp_path / 'var'}/test-sqlite/" in out
    assert "a full run takes" in out or "the last full run here took" in out


def test_progress_while_it_runs_and_a_summary_after_ctrl_c(tmp_path: Path) -> None:
    tests = tmp_path / "test_sample.py"
    tests.write_text(TESTS)
    out = tmp_path / "out.txt"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            ["scripts/test", "--", str(tests)],
            cwd=REPO,
            env=env(tmp_path, RESOURCE_LEASE_TEST_PROGRESS_SECONDS="1", **DOWN),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: Ctrl-C goes to the whole group
        )
    progress = tmp_path / "var" / "test-logs" / "sqlite.progress"
    deadline = time.monotonic() + 240
    try:
        while "test: [" not in out.read_text() or "test_slow" not in (
            json.loads(progress.read_text()).get("current", "") if progress.exists() else ""
        ):
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        # A progress line that counts the failure (printed every second; later on a loaded
        # machine, where a fixed wait of 1.5 s once ended before it).
        while not re.search(r"^test: \[\d+s\] sqlite 2/4, 1 FAILED", out.read_text(), re.MULTILINE):
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C at a terminal does
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text()
    assert "test: mariadb skipped: no MariaDB/MySQL server answers at 127.0.0.1:1" in text
    assert re.search(r"^test: \[\d+s\] sqlite 2/4, 1 FAILED", text, re.MULTILINE), text
    assert "test: FAILED on sqlite: " in text and "test_sample.py::test_fails" in text
    assert "== interrupted; where each run stopped" in text
    assert "sqlite: interrupted after 2 of 4 tests" in text and ": 1 passed, 1 failed, 0 skipped" in text
    assert "  was running " in text and "test_sample.py::test_slow" in text
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing of the run is left going


def _junit(path: Path, cases: dict[str, float]) -> str:
    rows = "".join(
        f'<testcase classname="{name.rsplit("::", 1)[0]}" name="{name.rsplit("::", 1)[1]}" time="{seconds}"/>'
        for name, seconds in cases.items()
    )
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{rows}</testsuite></testsuites>')
    return str(path)


def test_each_backends_shards_are_dealt_by_that_backends_weights(tmp_path: Path) -> None:
    from tests import sharding

    files = [
        _junit(tmp_path / "mariadb.xml", {"tests.test_galera::a": 100.0, "tests.test_x::b": 10.0}),
        _junit(tmp_path / "mariadb-2.xml", {"tests.test_y::c": 40.0, "tests.test_x::d": 5.0}),
        _junit(tmp_path / "mariadb-restarts.xml", {"tests.test_y::r": 500.0}),  # not dealt: left out
        _junit(tmp_path / "postgresql.xml", {"tests.test_galera::a": 0.0, "tests.test_x::b": 30.0}),
        _junit(tmp_path / "postgresql-2.xml", {"tests.test_y::c": 30.0}),
    ]
    weights = sharding.junit_weights(files)
    assert weights == {
        "mariadb": {"tests/test_galera.py": 100.0, "tests/test_x.py": 15.0, "tests/test_y.py": 40.0},
        "postgresql": {"tests/test_galera.py": 0.0, "tests/test_x.py": 30.0, "tests/test_y.py": 30.0},
    }
    names = ["tests/test_galera.py", "tests/test_x.py", "tests/test_y.py"]
    # MariaDB: the Galera file alone in one shard; PostgreSQL, where it weighs nothing: x and y
    # apart (dealt by MariaDB's weights, they would share a shard and leave the other empty).
    on_mariadb = sharding.deal(names, 2, weights["mariadb"])
    assert on_mariadb["tests/test_x.py"] == on_mariadb["tests/test_y.py"] != on_mariadb["tests/test_galera.py"]
    on_postgresql = sharding.deal(names, 2, weights["postgresql"])
    assert on_postgresql["tests/test_x.py"] != on_postgresql["tests/test_y.py"]
    with pytest.raises(ValueError, match="not a backend's junit file"):
        sharding.junit_weights([_junit(tmp_path / "oracle.xml", {})])
    with pytest.raises(ValueError, match="backend must be one of"):
        sharding.weights("oracle")
