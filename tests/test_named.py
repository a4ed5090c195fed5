"""Rows created on demand and leased like a resource (the base of locks, elections, groups)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from django.core.management import call_command

from resource_lease import acquire, named
from resource_lease.exceptions import LeaseLost
from resource_lease.models import Resource
from resource_lease.pool import counts

pytestmark = pytest.mark.django_db(transaction=True)

RACERS = 8


def race_new_name(spawn_worker, tmp_path: Path, name: str, *, plain_insert: bool = False) -> list[str]:
    go = tmp_path / f"go-{name}"
    extra = ["--plain-insert"] if plain_insert else []
    procs = [
        spawn_worker(
            "tests.procs.named_race",
            *("--kind", "@test", "--name", name, "--go", str(go), *extra),
            stdout=subprocess.PIPE,
        )
        for _ in range(RACERS)
    ]
    for proc in procs:  # every racer has imported Django and connected: start them together
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    go.touch()
    return [proc.communicate(timeout=60)[0].strip() for proc in procs]


def test_a_brand_new_name_used_by_8_processes_at_once_has_one_winner(spawn_worker, tmp_path: Path) -> None:
    outcomes = race_new_name(spawn_worker, tmp_path, "brand-new")
    assert not [o for o in outcomes if o.startswith("ERROR")], outcomes
    assert sorted(outcomes) == ["GRANTED 1"] + ["REFUSED"] * (RACERS - 1), outcomes
    assert Resource.objects.filter(kind="@test", name="brand-new").count() == 1


def test_negative_control_check_then_insert_is_caught(spawn_worker, tmp_path: Path) -> None:
    """The same race with "look, then INSERT" must surface errors, or the test proves nothing."""
    for attempt in range(3):  # the window is narrow; a few rounds make it certain enough
        outcomes = race_new_name(spawn_worker, tmp_path, f"plain-{attempt}", plain_insert=True)
        if any(o.startswith("ERROR") for o in outcomes):
            return
    pytest.fail(f"a plain check-then-INSERT never collided: {outcomes}")


def test_grants_of_a_named_row_raise_its_fence_and_exclude_each_other() -> None:
    first = named.try_grant("default", "@test", "n", holder="a", ttl=30)
    assert first is not None and first.fence == 1
    assert named.try_grant("default", "@test", "n", holder="b", ttl=30) is None
    assert first.release()
    second = named.try_grant("default", "@test", "n", holder="b", ttl=30)
    assert second is not None and second.fence == 2
    snapshot = named.read("default", "@test")
    assert snapshot.live_names() == ["n"]
    assert snapshot.live("n").holder == "b"
    second.release()
    assert named.read("default", "@test").live_names() == []


def test_a_named_row_deleted_by_an_operator_is_made_again() -> None:
    lease = named.try_grant("default", "@test", "gone", holder="a", ttl=30)
    assert lease is not None
    lease.release()
    Resource.objects.filter(kind="@test", name="gone").delete()
    # The process's hint still has the row; the miss finds it gone, makes it and grants it.
    again = named.try_grant("default", "@test", "gone", holder="a", ttl=30)
    assert again is not None and again.fence == 1
    again.release()


def test_write_data_is_fenced() -> None:
    lease = named.try_grant("default", "@test", "state", holder="a", ttl=0.3)
    assert lease is not None
    assert named.write_data(lease, {"step": 1})
    time.sleep(0.5)
    taker = named.try_grant("default", "@test", "state", holder="b", ttl=30)
    assert taker is not None
    assert not named.write_data(lease, {"step": "stale"})
    assert Resource.objects.get(kind="@test", name="state").data == {"step": 1}
    with pytest.raises(LeaseLost):
        lease.renew()
    taker.release()


def test_coordination_rows_stay_out_of_the_pools(make_pool, capsys) -> None:
    make_pool("proxy", 2)
    lease = named.try_grant("default", "@test", "hidden", holder="a", ttl=30)
    assert lease is not None
    assert set(counts()) == {"proxy"}
    call_command("inspect_pool", "--json")
    assert "@test" not in capsys.readouterr().out
    lease.release()


@pytest.mark.parametrize("kind", ["@lock", "@group:x"])
def test_acquire_refuses_the_reserved_prefix(kind: str) -> None:
    with pytest.raises(ValueError, match="must not start with '@'"):
        acquire(kind)
    assert not Resource.objects.exists()
