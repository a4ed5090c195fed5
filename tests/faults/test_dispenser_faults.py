"""The dispenser when the answer to a statement is lost after the server committed it
(MariaDB and PostgreSQL, through a TCP proxy that hangs up instead of passing the answer on).

- an assign: the claims committed; the worker is told exactly those items (settled by
  reading back the assign's token), so none is stuck claimed by a worker that does not know;
- a done: the items were marked done; the count the worker is told is settled by counting the
  outcome's token, not reported as 0 (which would make it redo work).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator

import pytest
from django.db import connection

from resource_lease import Dispenser
from tests.conftest import worker_env
from tests.faults.harness import CutProxy

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

CLAIM = {"mysql": (b"UPDATE", b"AS pick STRAIGHT_JOIN"), "postgresql": (b"UPDATE", b"WITH pick AS MATERIALIZED")}
DONE = (b"UPDATE", b"SET state = 'done'")


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


def run_op(spawn_worker: Callable[..., subprocess.Popen[str]], proxy: CutProxy, name: str, *args: str) -> dict:
    settings = connection.settings_dict
    scheme = "mysql" if connection.vendor == "mysql" else "postgres"
    env = worker_env(
        DJANGO_SETTINGS_MODULE="tests.faults.settings",
        DATABASE_URL=f"{scheme}://{settings['USER']}@127.0.0.1:{proxy.port}/unused",
    )
    proc = spawn_worker("tests.procs.dispenser_op", "--dispenser", name, *args, env=env, stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    return json.loads(out.strip().splitlines()[-1])


def test_an_assign_whose_answer_is_lost_returns_what_it_claimed(spawn_worker, proxy: CutProxy, figures) -> None:
    d = Dispenser("cut-assign")
    d.put([f"k{i}" for i in range(5)])
    proxy.arm(*CLAIM[connection.vendor])
    report = run_op(spawn_worker, proxy, "cut-assign")
    assert not proxy.cuts.empty(), "the claim's answer was not cut: the fault was not injected"
    claimed = sorted(i.key for i in d.items(state="assigned"))
    figures("dispenser assign answer lost", told=len(report["assigned"]), claimed=len(claimed))
    assert sorted(report["assigned"]) == claimed == ["k0", "k1", "k2"]


def test_a_done_whose_answer_is_lost_is_counted(spawn_worker, proxy: CutProxy, figures) -> None:
    d = Dispenser("cut-done")
    d.put([f"k{i}" for i in range(5)])
    proxy.arm(*DONE)
    report = run_op(spawn_worker, proxy, "cut-done", "--done")
    assert not proxy.cuts.empty(), "the done's answer was not cut: the fault was not injected"
    figures("dispenser done answer lost", told=report["done"], done=d.counts()["done"])
    assert report["done"] == 3 == d.counts()["done"]
