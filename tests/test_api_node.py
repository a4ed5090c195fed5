"""Node and Python holders race for one resource through the HTTP API (uvicorn): Node's
holders use examples/node/lease_client.mjs (Node's built-in fetch), Python's the stdlib
client. Each does a critical section that is not atomic (read a counter, pause, write it back)
and appends its grant to a ledger: no update is lost, and the fences in the ledger's order
only go up. The negative control runs Node's holders without a lease: updates are lost."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from resource_lease.api.tokens import create_token
from resource_lease.client.lease_client import LeaseClient
from tests.conftest import REPO

NODE = shutil.which("node")
RACE = str(REPO / "examples" / "node" / "race.mjs")
CYCLES = 8

pytestmark = pytest.mark.skipif(NODE is None, reason="Node is not installed (node 20+ runs examples/node)")


def _python_holder(url: str, token: str, counter: Path, ledger: Path, who: str) -> None:
    client = LeaseClient(url, token)
    for _ in range(CYCLES):
        lease = client.acquire("gpu", ttl=10, wait=60, holder=who)
        try:
            value = int(counter.read_text())
            time.sleep(0.005)
            counter.write_text(str(value + 1))
            with ledger.open("a") as out:
                out.write(f"{lease['name']} {lease['fence']} {who}\n")
        finally:
            client.release(lease["id"])


def _race(servers: Any, make_pool: Callable[..., Any], tmp_path: Path, *, node_leases: bool) -> tuple[int, list[str]]:
    make_pool("gpu", 1)
    token = create_token("race", "gpu")[1]
    a, b = servers(2)
    counter, ledger = tmp_path / "counter", tmp_path / "ledger"
    counter.write_text("0")
    ledger.write_text("")
    assert NODE is not None
    go = tmp_path / "go"
    env = {"RESOURCE_LEASE_TOKEN": token, "PATH": "/usr/bin:/bin", "RACE_GO": str(go)}
    nodes = [
        subprocess.Popen(
            [NODE, RACE, (a, b)[i].url, "gpu", str(CYCLES), str(counter), str(ledger), f"node{i}"]
            + ([] if node_leases else ["--no-lease"]),
            env=env,
        )
        for i in range(2)
    ]
    pythons = [
        threading.Thread(target=_python_holder, args=((b, a)[i].url, token, counter, ledger, f"python{i}"))
        for i in range(2)
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"go.node{i}").exists() for i in range(2)):  # both Node holders started
        assert time.monotonic() < deadline and all(proc.poll() is None for proc in nodes), "Node did not start"
        time.sleep(0.01)
    go.touch()  # all four start at once
    for thread in pythons:
        thread.start()
    for proc in nodes:
        assert proc.wait(120) == 0
    for thread in pythons:
        thread.join(120)
    return int(counter.read_text()), ledger.read_text().splitlines()


def test_node_and_python_holders_never_overlap_and_fences_go_up(
    servers: Any, make_pool: Callable[..., Any], tmp_path: Path
) -> None:
    count, lines = _race(servers, make_pool, tmp_path, node_leases=True)
    assert count == len(lines) == 4 * CYCLES  # no update lost: never two holders at once
    fences = [int(line.split()[1]) for line in lines]
    assert fences == sorted(fences) and len(set(fences)) == len(fences)
    assert {line.split()[2] for line in lines} == {"node0", "node1", "python0", "python1"}


def test_negative_control_node_without_a_lease_loses_updates(
    servers: Any, make_pool: Callable[..., Any], tmp_path: Path
) -> None:
    count, lines = _race(servers, make_pool, tmp_path, node_leases=False)
    assert count < len(lines)  # the check catches holders that overlap
