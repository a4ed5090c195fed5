"""The ``resource-lease`` command (resource_lease/client/lease_client.py) against a uvicorn
server, run as ``python -I -S lease_client.py``: no site-packages, so no Django (it is the
standard library only, as docs/http.md#client promises)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from resource_lease.api.tokens import create_token
from resource_lease.db.operations import ops
from resource_lease.lease import acquire
from resource_lease.models import Resource
from tests.conftest import REPO

CLIENT = str(REPO / "resource_lease" / "client" / "lease_client.py")


@pytest.fixture
def cli(make_pool: Callable[..., Any], servers: Any) -> Callable[..., subprocess.Popen[str]]:
    (row,) = make_pool("gpu", 1)
    Resource.objects.filter(pk=row.pk).update(data={"device": 3})
    (server,) = servers(1)
    token = create_token("ci", "gpu")[1]
    env = {"RESOURCE_LEASE_URL": server.url, "RESOURCE_LEASE_TOKEN": token, "PATH": "/usr/bin:/bin"}

    def start(*args: str, **popen: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", CLIENT, *args], env=env, text=True, stdout=subprocess.PIPE, **popen
        )

    return start


def held_rows() -> list[Resource]:
    return list(Resource.objects.live().filter(kind="gpu"))


def test_acquire_renew_release_print_json_and_75_when_none(cli: Callable[..., subprocess.Popen[str]]) -> None:
    out, _ = cli("acquire", "--kind", "gpu", "--ttl", "30", "--holder", "script").communicate(timeout=60)
    lease = json.loads(out)
    assert lease["data"] == {"device": 3} and lease["holder"].startswith("http:ci:script:")
    none = cli("acquire", "--kind", "gpu", "--wait", "0.5")
    none.communicate(timeout=60)
    assert none.returncode == 75
    out, _ = cli("renew", lease["id"], "--ttl", "60").communicate(timeout=60)
    assert json.loads(out)["ttl"] == 60
    out, _ = cli("release", lease["id"]).communicate(timeout=60)
    assert json.loads(out) == {"released": True}
    assert held_rows() == []


def test_run_passes_the_resource_holds_it_releases_it_and_exits_with_the_status(
    cli: Callable[..., subprocess.Popen[str]],
) -> None:
    script = (
        "import json, os, sys;"
        "print(os.environ['RESOURCE_LEASE_NAME'], os.environ['RESOURCE_LEASE_FENCE'],"
        " json.loads(os.environ['RESOURCE_LEASE_DATA'])['device'], 'RESOURCE_LEASE_TOKEN' in os.environ);"
        "sys.exit(7)"
    )
    run = cli("run", "--kind", "gpu", "--ttl", "10", "--", sys.executable, "-c", script)
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 7
    name, fence, device, token_seen = out.split()
    assert (name, device, token_seen) == ("gpu-0", "3", "False") and int(fence) >= 1
    assert held_rows() == []  # released at exit


def _killed_after_loss(cli: Callable[..., subprocess.Popen[str]], tmp_path: Path, renew_every: str) -> bool:
    """Whether ``run``'s command is stopped once its lease is lost (force released behind its
    back), within three ttl; the command itself would run a minute."""
    started = tmp_path / "started"
    script = f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(60)"
    run = cli(
        "run",
        "--kind",
        "gpu",
        "--ttl",
        "2",
        "--grace",
        "1",
        "--renew-every",
        renew_every,
        "--",
        sys.executable,
        "-c",
        script,
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert time.monotonic() < deadline and run.poll() is None, "the command never started"
            time.sleep(0.05)
        (row,) = held_rows()
        assert ops("default").release(pk=row.pk, holder=row.holder, fence=row.fence)  # lost
        taker = acquire("gpu", ttl=30)  # and someone else holds it now
        try:
            run.wait(3 * 2)
            return run.returncode == 128 + 15
        except subprocess.TimeoutExpired:
            return False
        finally:
            taker.release()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(30)


def test_run_stops_its_command_when_the_lease_is_lost(
    cli: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    assert _killed_after_loss(cli, tmp_path, renew_every="0.3")


def test_negative_control_with_renewal_broken_the_command_runs_on(
    cli: Callable[..., subprocess.Popen[str]], tmp_path: Path
) -> None:
    assert not _killed_after_loss(cli, tmp_path, renew_every="0")
