"""The dispenser's commands: enqueue, run_worker, inspect_dispensers."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from resource_lease import Dispenser
from resource_lease.models import DispenserItem
from tests.conftest import REPO, worker_env

pytestmark = pytest.mark.django_db(transaction=True)


def call(*args: str, stdin: str | None = None) -> str:
    out = io.StringIO()
    if stdin is not None:
        real, sys.stdin = sys.stdin, io.StringIO(stdin)
    try:
        call_command(*args, stdout=out)
    finally:
        if stdin is not None:
            sys.stdin = real
    return out.getvalue()


def test_enqueue_reads_keys_and_json_payloads(tmp_path: Path) -> None:
    source = tmp_path / "items.txt"
    source.write_text('# a comment\nalpha {"n": 1}\n\nbeta\ngamma\t[1, 2]\n')
    assert "3 new of 3 items" in call("enqueue", "q", str(source))
    assert "0 new of 1 items" in call("enqueue", "q", "-", stdin="alpha 5\n")
    assert {i.key: i.payload for i in Dispenser("q").items()} == {"alpha": {"n": 1}, "beta": None, "gamma": [1, 2]}


def test_enqueue_recreate_replaces_the_pending_pool() -> None:
    call("enqueue", "q", "-", stdin="a\nb\n")
    assert "1 added, 0 queued again, 1 removed" in call("enqueue", "q", "-", "--recreate", stdin="b\nc\n")
    assert sorted(i.key for i in Dispenser("q").items()) == ["b", "c"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ok\nbad {nope\n", "line 2"),
        ("ok\n" + "k" * 256 + "\n", "line 2: key must be at most 255"),
        ("ok\nok\n", "line 2: key 'ok' appears twice"),
        ("ok\nnan NaN\n", "line 2"),
    ],
)
def test_enqueue_bad_line_names_it_and_writes_nothing(text: str, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call("enqueue", "q", "-", stdin=text)
    assert not DispenserItem.objects.exists()


def test_enqueue_reports_every_bad_line_not_only_the_first() -> None:
    with pytest.raises(CommandError) as caught:
        call("enqueue", "q", "-", stdin="ok\nbad {nope\nfine\nok\nnan NaN\n")
    message = str(caught.value)
    assert message.startswith("standard input: 3 bad lines, nothing was written")
    assert "line 2:" in message and "line 4: key 'ok' appears twice" in message and "line 5:" in message
    assert not DispenserItem.objects.exists()


def test_enqueue_bad_name_or_file() -> None:
    with pytest.raises(CommandError, match="name must be"):
        call("enqueue", " ", "-", stdin="a\n")
    with pytest.raises(CommandError, match="cannot read"):
        call("enqueue", "q", "/nonexistent/file")
    assert not DispenserItem.objects.exists()


def test_inspect_dispensers_json_and_table() -> None:
    d = Dispenser("shown")
    d.put(["a", "b", "c", "d"])
    items = d.assign("w1", limit=2)
    d.done("w1", items[:1])
    report = json.loads(call("inspect_dispensers", "--json"))
    shown = report["dispensers"]["shown"]
    assert {k: shown[k] for k in ("pending", "assigned", "done", "failed", "total")} == {
        "pending": 2,
        "assigned": 1,
        "done": 1,
        "failed": 0,
        "total": 4,
    }
    assert shown["workers"]["w1"]["claims"] == 1
    text = call("inspect_dispensers")
    assert "shown: 4 items: 2 pending, 1 assigned, 1 done, 0 failed" in text and "w1: 1 claimed" in text
    Dispenser("other").put(["x", "y"])
    # Each dispenser named once, however many items it has (the model's ordering by id
    # would make DISTINCT see one row per item).
    with pytest.raises(CommandError, match=r"no dispenser 'nope' \(dispensers: other, shown\)$"):
        call("inspect_dispensers", "--dispenser", "nope")


def test_run_worker_drains_and_shows_progress() -> None:
    Dispenser("cmd").put(["a", "b", "bad-c"])
    proc = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "run_worker",
            "tests.procs.sample_workers.Echo",
            "--name",
            "cli",
            "--until-empty",
        ],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[1 done, 0 failed, 0 refused] a: done" in proc.stdout
    assert "bad-c: failed" in proc.stdout
    assert "cli: 2 done, 1 failed, 0 refused" in proc.stdout
    assert Dispenser("cmd").counts() == {"pending": 0, "assigned": 0, "done": 2, "failed": 1}


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no.such.Worker", "cannot import"),
        ("resource_lease.recipes.dispenser.Dispenser", "not a resource_lease.Worker"),
    ],
)
def test_run_worker_bad_class(path: str, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call("run_worker", path, "--name", "x")
