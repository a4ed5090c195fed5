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
from urllib.parse import urlsplit

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


# -- --help, --plan creates nothing, --only, Ctrl-C when this script ignores SIGINT -------------


def test_help_prints_the_usage_and_runs_nothing(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["scripts/test", "--help"], cwd=REPO, env=env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "scripts/test --only mariadb" in proc.stdout and "anything after -- goes to pytest" in proc.stdout
    assert "== tests on" not in proc.stdout  # before: pytest --help, once per backend
    assert not (tmp_path / "var" / "test-logs").exists()


def _database_exists(url: str) -> bool | None:
    """Whether the database of ``url`` exists, asked of its server directly (None: the
    server does not answer)."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    try:
        if parts.scheme == "mysql":
            import MySQLdb

            conn = MySQLdb.connect(host=parts.hostname, port=parts.port, user=parts.username, connect_timeout=3)
            cursor = conn.cursor()
            found = cursor.execute("SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (name,))
            conn.close()
            return bool(found)
        import psycopg

        with psycopg.connect(
            host=parts.hostname, port=parts.port, user=parts.username, dbname="postgres", connect_timeout=3
        ) as pg:
            return pg.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None
    except Exception:  # noqa: BLE001 - no server here, or no driver: nothing to check
        return None


def _drop_database(url: str) -> None:
    """Drop what a failing ``--plan`` created (it must create nothing)."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if parts.scheme == "mysql":
        import MySQLdb

        conn = MySQLdb.connect(host=parts.hostname, port=parts.port, user=parts.username, connect_timeout=3)
        conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()
        return
    import psycopg

    with psycopg.connect(
        host=parts.hostname, port=parts.port, user=parts.username, dbname="postgres", autocommit=True
    ) as pg:
        pg.execute(f'DROP DATABASE IF EXISTS "{name}"')


def test_plan_creates_no_database_and_says_which_are_missing(tmp_path: Path) -> None:
    name = f"rl_plan_{os.getpid()}"
    urls = {
        "mariadb": f"mysql://root@127.0.0.1:3306/{name}",
        "postgresql": f"postgres://postgres@127.0.0.1:5432/{name}",
    }
    proc = subprocess.run(
        ["scripts/test", "--plan"],
        cwd=REPO,
        env=env(tmp_path, MARIADB_URL=urls["mariadb"], POSTGRES_URL=urls["postgresql"]),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    answered = 0
    for url in urls.values():
        exists = _database_exists(url)
        if exists is None:
            continue  # no server here: nothing to create anyway
        answered += 1
        if exists:
            _drop_database(url)
        assert exists is False, f"--plan created {url}"  # before: CREATE DATABASE IF NOT EXISTS
        assert f"database {name} (missing: the run would create it)" in proc.stdout, proc.stdout
    if not answered:
        pytest.skip("no MariaDB or PostgreSQL server answers here")


def test_only_picks_the_backends_to_run(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["scripts/test", "--plan", "--only", "sqlite"],
        cwd=REPO,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "test: mariadb not run (--only sqlite)" in proc.stdout
    assert "test: postgresql not run (--only sqlite)" in proc.stdout
    assert "test: sqlite: database files under" in proc.stdout
    assert "test: mariadb: server" not in proc.stdout
    bad = subprocess.run(
        ["scripts/test", "--only", "oracle"], cwd=REPO, env=env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "unknown backend 'oracle'" in bad.stderr
    clash = subprocess.run(
        ["scripts/test", "--only", "sqlite", "--require", "mariadb"],
        cwd=REPO,
        env=env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert clash.returncode == 2 and "--only sqlite leaves it out" in clash.stderr


def test_ctrl_c_names_the_running_test_even_when_the_script_ignores_sigint(tmp_path: Path) -> None:
    """Started as a background job of a non-interactive shell is (SIGINT ignored, which bash
    cannot trap), the script saw no Ctrl-C while its pytest run did. Before, it then printed
    the logs and a summary like a finished run's, naming no running test, exit status 1."""
    tests = tmp_path / "test_sample.py"
    tests.write_text(TESTS)
    out = tmp_path / "out.txt"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            ["scripts/test", "--only", "sqlite", "--", str(tests)],
            cwd=REPO,
            env=env(tmp_path, RESOURCE_LEASE_TEST_PROGRESS_SECONDS="1"),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # noqa: PLW1509
        )
    progress = tmp_path / "var" / "test-logs" / "sqlite.progress"
    deadline = time.monotonic() + 240
    try:
        while "test_slow" not in (json.loads(progress.read_text()).get("current", "") if progress.exists() else ""):
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130, out.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text()
    assert "== interrupted; where each run stopped" in text
    assert "sqlite: interrupted after 2 of 4 tests" in text
    assert "  was running " in text and "test_sample.py::test_slow" in text
    assert "total: " not in text  # no summary of a finished run
