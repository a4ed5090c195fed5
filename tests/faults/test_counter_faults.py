"""counter.add and Config.compare_and_set when the answer is lost after the server committed
(MariaDB and PostgreSQL, through a TCP proxy that hangs up instead of passing the answer on):
the caller is told ``OutcomeUnknown``, and the write is never sent again blindly, so it is
applied exactly once (an add sent twice would count twice; a compare-and-set sent again would
be refused by its own first success and answer False)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator

import pytest
from django.db import connection

from resource_lease import Config, counter
from resource_lease.models import ConfigEntry
from tests.conftest import worker_env
from tests.faults.harness import CutProxy

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _server_databases_only() -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server: no connection to lose")


@pytest.fixture
def proxy() -> Iterator[CutProxy]:
    settings = connection.settings_dict
    cut = CutProxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"]))
    yield cut
    cut.close()


def run_once(spawn_worker: Callable[..., subprocess.Popen[str]], proxy: CutProxy, name: str) -> dict[str, dict]:
    settings = connection.settings_dict
    scheme = "mysql" if connection.vendor == "mysql" else "postgres"
    env = worker_env(
        DJANGO_SETTINGS_MODULE="tests.faults.settings",
        DATABASE_URL=f"{scheme}://{settings['USER']}@127.0.0.1:{proxy.port}/unused",
    )
    proc = spawn_worker("tests.procs.counter_race", "once", "--name", name, env=env, stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    events = [json.loads(line) for line in out.strip().splitlines() if line.startswith("{")]
    return {e["ev"]: e for e in events}


def test_an_add_whose_answer_is_lost_is_outcome_unknown_and_applied_once(spawn_worker, proxy: CutProxy) -> None:
    hits = counter("cut")
    assert hits.add(5) == 5
    Config("cut", defaults={"n": 0})
    proxy.arm(b"INSERT", b"resource_lease_counter")
    report = run_once(spawn_worker, proxy, "cut")
    assert not proxy.cuts.empty(), "the add's answer was not cut: the fault was not injected"
    assert report["add"].get("error") == "OutcomeUnknown", report
    assert "may or may not have been applied" in report["add"]["message"]
    assert hits.value() == 6  # applied once: committed by the server, never sent again
    assert report["cas"] == {**report["cas"], "answer": True}  # the next call works on a new connection


def test_a_compare_and_set_whose_answer_is_lost_is_outcome_unknown_and_applied_once(
    spawn_worker, proxy: CutProxy
) -> None:
    Config("cut", defaults={"n": 0})
    # CONFIG_CAS's own SET (the declaration's upsert and CONFIG_SET read the version otherwise).
    proxy.arm(b"UPDATE", b"version" + (b"`" if connection.vendor == "mysql" else b'"') + b" + 1")
    report = run_once(spawn_worker, proxy, "cut")
    assert not proxy.cuts.empty(), "the compare-and-set's answer was not cut: the fault was not injected"
    assert report["add"]["answer"] == 1
    assert report["cas"].get("error") == "OutcomeUnknown", report
    entry = ConfigEntry.objects.get(namespace="cut", key="n")
    assert (entry.value, entry.version) == (1, 1)  # applied once
    assert Config("cut", defaults={"n": 0})["n"] == 1
