"""Worker processes on the real database: every item done exactly once, through SIGKILL,
SIGSTOP past the ttl, restarts under the same name and SIGTERM; FolderWorker on real files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from resource_lease import Dispenser, FolderWorker, Worker
from resource_lease.models import DispenserItem

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "tests.procs.dispenser_worker"
#: Items drained by four workers: fewer in CI's short mode (CI=true), where the machine is shared.
DRAIN_ITEMS = 120 if os.environ.get("CI") == "true" else 300


@dataclass
class Ledger:
    accepted: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    worked: Counter[str] = field(default_factory=Counter)
    by_worker: dict[str, set[str]] = field(default_factory=dict)
    batches: list[list[str]] = field(default_factory=list)

    def duplicates(self) -> dict[str, int]:
        return {k: n for k, n in self.accepted.items() if n > 1}


def read_ledger(directory: Path) -> Ledger:
    ledger = Ledger()
    for path in sorted(directory.glob("ledger-*")):
        for line in path.read_text().splitlines():
            word, *rest = line.split(" ")
            if word == "batch":
                ledger.batches.append(rest)
            elif word == "work":
                ledger.worked[rest[0]] += 1
            elif word in ("accepted", "refused"):
                key, _fence, worker = rest
                getattr(ledger, word)[key] += 1
                if word == "accepted":
                    ledger.by_worker.setdefault(worker, set()).add(key)
    return ledger


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start(spawn_worker: Callable[..., subprocess.Popen[str]], tmp_path: Path, name: str, *args: str):
    return spawn_worker(WORKER, "--name", name, "--dir", str(tmp_path), *args)


def assert_all_done_exactly_once(d: Dispenser, keys: list[str], ledger: Ledger) -> None:
    assert ledger.duplicates() == {}, f"done more than once: {ledger.duplicates()}"
    assert set(ledger.accepted) == set(keys), f"missing: {sorted(set(keys) - set(ledger.accepted))[:10]}"
    assert d.counts() == {"pending": 0, "assigned": 0, "done": len(keys), "failed": 0}


def drain(
    spawn_worker, tmp_path: Path, name: str, *flags: str, hold: float = 0.05
) -> tuple[Dispenser, list[str], Ledger]:
    d = Dispenser(name)
    keys = [f"item-{i:04d}" for i in range(DRAIN_ITEMS)]
    d.put({k: {"n": i} for i, k in enumerate(keys)})
    # Each item takes `hold` (50 ms), so one worker alone would need seconds: the others, however
    # slowly a loaded machine starts them, join in before the pool is empty.
    procs = [
        start(
            spawn_worker,
            tmp_path,
            f"w{i}",
            "--dispenser",
            name,
            "--batch",
            "5",
            "--hold",
            "0.05",
            "--until-empty",
            *flags,
        )
        for i in range(4)
    ]
    for proc in procs:
        assert proc.wait(timeout=180) == 0
    return d, keys, read_ledger(tmp_path)


def test_several_workers_drain_the_pool_each_item_done_exactly_once(spawn_worker, tmp_path: Path) -> None:
    d, keys, ledger = drain(spawn_worker, tmp_path, "drain")
    assert_all_done_exactly_once(d, keys, ledger)
    twice = {k: n for k, n in ledger.worked.items() if n > 1}
    assert twice == {}, f"worked by two workers: {twice}"
    assert len(ledger.by_worker) >= 2, "the workers should share the pool"


def test_negative_control_an_unconditional_claim_is_caught(spawn_worker, tmp_path: Path) -> None:
    """The same check must catch an assign that reads pending items, then claims them with an
    unconditional UPDATE: two workers then work one item."""
    _d, _keys, ledger = drain(spawn_worker, tmp_path, "naive-assign", "--naive-assign")
    twice = {k: n for k, n in ledger.worked.items() if n > 1}
    print(f"negative control (assign): {len(twice)} items worked twice or more")
    assert twice, "the check did not notice a broken assign"


def test_a_worker_killed_mid_batch_leaves_its_items_to_the_others_after_its_ttl(spawn_worker, tmp_path: Path) -> None:
    d = Dispenser("killed")
    keys = [f"k{i:03d}" for i in range(40)]
    d.put(keys)
    victim = start(
        spawn_worker, tmp_path, "victim", "--dispenser", "killed", "--batch", "20", "--ttl", "2", "--hold", "0.2"
    )
    wait_for(lambda: sum(read_ledger(tmp_path).accepted.values()) >= 2, what="the victim to finish two items")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    victims_batch = read_ledger(tmp_path).batches[0]
    unfinished = set(victims_batch) - read_ledger(tmp_path).by_worker["victim"]
    assert unfinished, "the victim must die mid-batch"
    others = [
        start(spawn_worker, tmp_path, f"w{i}", "--dispenser", "killed", "--batch", "5", "--ttl", "2", "--until-empty")
        for i in range(2)
    ]
    for proc in others:
        assert proc.wait(timeout=120) == 0
    ledger = read_ledger(tmp_path)
    assert_all_done_exactly_once(d, keys, ledger)
    taken_over = {i.key for i in d.items() if i.key in unfinished}
    assert all(DispenserItem.objects.get(dispenser="killed", key=k).attempts == 2 for k in taken_over)


def paused_past_ttl(spawn_worker, tmp_path: Path, name: str, *, naive: bool) -> tuple[Dispenser, list[str], Ledger]:
    d = Dispenser(name)
    keys = [f"k{i:02d}" for i in range(12)]
    d.put(keys)
    flags = ["--naive"] if naive else []
    paused = start(
        spawn_worker,
        tmp_path,
        "paused",
        "--dispenser",
        name,
        "--batch",
        "4",
        "--ttl",
        "1.5",
        "--hold",
        "0.4",
        "--until-empty",
        *flags,
    )
    wait_for(lambda: sum(read_ledger(tmp_path).accepted.values()) >= 1, what="the paused worker's first item")
    paused.send_signal(signal.SIGSTOP)
    try:
        time.sleep(2.5)  # past its ttl: its claims expire
        other = start(
            spawn_worker, tmp_path, "other", "--dispenser", name, "--batch", "4", "--ttl", "5", "--until-empty"
        )
        assert other.wait(timeout=120) == 0
    finally:
        paused.send_signal(signal.SIGCONT)
    assert paused.wait(timeout=120) == 0
    return d, keys, read_ledger(tmp_path)


def test_a_worker_paused_past_its_ttl_cannot_mark_done_what_another_finished(spawn_worker, tmp_path: Path) -> None:
    d, keys, ledger = paused_past_ttl(spawn_worker, tmp_path, "paused", naive=False)
    print(f"paused: accepted={sum(ledger.accepted.values())} refused={sum(ledger.refused.values())}")
    assert ledger.refused, "the resumed worker's done must have been refused"
    assert_all_done_exactly_once(d, keys, ledger)
    for key in ledger.refused:
        assert DispenserItem.objects.get(dispenser="paused", key=key).worker == "other", (
            "the new owner's outcome stands"
        )


def test_negative_control_done_without_the_live_claim_check_is_caught(spawn_worker, tmp_path: Path) -> None:
    """The same check must catch a done() that does not ask whose live claim the item is."""
    _d, _keys, ledger = paused_past_ttl(spawn_worker, tmp_path, "naive", naive=True)
    print(f"negative control: duplicates={ledger.duplicates()}")
    assert ledger.duplicates(), "the exactly-once check did not notice a broken done()"


def test_a_restart_under_the_same_name_resumes_its_own_items_first(spawn_worker, tmp_path: Path) -> None:
    d = Dispenser("restart")
    keys = [f"k{i:02d}" for i in range(30)]
    d.put(keys)
    first = start(
        spawn_worker, tmp_path, "same", "--dispenser", "restart", "--batch", "10", "--ttl", "60", "--hold", "0.2"
    )
    wait_for(lambda: sum(read_ledger(tmp_path).accepted.values()) >= 2, what="two items done")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    before = read_ledger(tmp_path)
    unfinished = [k for k in before.batches[0] if k not in before.by_worker["same"]]
    assert unfinished
    # Long before the ttl of 60 s: only the same name gets these back.
    again = start(
        spawn_worker, tmp_path, "same", "--dispenser", "restart", "--batch", "10", "--ttl", "60", "--until-empty"
    )
    assert again.wait(timeout=120) == 0
    ledger = read_ledger(tmp_path)
    # The restarted worker's first batch, from its own ledger file (read_ledger orders the
    # files by name, and a later pid may sort first: 100123 before 99987).
    lines = (tmp_path / f"ledger-{again.pid}").read_text().splitlines()
    resumed = next(line.split(" ")[1:] for line in lines if line.startswith("batch "))
    assert resumed[: len(unfinished)] == unfinished, "its own unfinished items come first"
    assert_all_done_exactly_once(d, keys, ledger)


def test_sigterm_finishes_the_current_item_and_gives_the_rest_back(spawn_worker, tmp_path: Path) -> None:
    d = Dispenser("sigterm")
    keys = [f"k{i:02d}" for i in range(10)]
    d.put(keys)
    proc = start(spawn_worker, tmp_path, "term", "--dispenser", "sigterm", "--batch", "10", "--hold", "0.5")
    wait_for(lambda: sum(read_ledger(tmp_path).accepted.values()) >= 1, what="the first item")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    ledger = read_ledger(tmp_path)
    done = sum(ledger.accepted.values())
    assert 1 <= done < 10
    assert d.counts() == {"pending": 10 - done, "assigned": 0, "done": done, "failed": 0}
    assert all(i.attempts == 0 for i in d.items(state="pending")), "a released item is not an attempt"


def test_two_folder_workers_never_take_one_file(spawn_worker, tmp_path: Path) -> None:
    folder = tmp_path / "tasks"
    folder.mkdir()
    ledger_dir = tmp_path / "ledger"
    ledger_dir.mkdir()
    keys = [f"task-{i:03d}" for i in range(60)] + ["bad-1", "bad-2"]
    for key in keys:
        (folder / f"{key}.txt").write_text(f"text of {key}")
    (folder / "task-000.finish").write_text("an old outcome, replaced")
    (folder / "notes.md").write_text("not a task")
    # A file name that is not UTF-8 (Python sees lone surrogates): no key can hold it.
    Path(os.fsdecode(bytes(folder) + b"/bad-\xff.txt")).write_text("skipped, left alone")
    procs = [
        spawn_worker(
            WORKER,
            "--name",
            f"f{i}",
            "--dir",
            str(ledger_dir),
            "--folder",
            str(folder),
            "--batch",
            "3",
            "--fail-pattern",
            "bad-.*",
            "--until-empty",
        )
        for i in range(2)
    ]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    ledger = read_ledger(ledger_dir)
    good = [k for k in keys if not k.startswith("bad")]
    assert ledger.duplicates() == {}
    assert set(ledger.accepted) == set(good)
    assert sorted(p.name for p in folder.glob("*.finish")) == sorted(f"{k}.finish" for k in good)
    assert sorted(p.name for p in folder.glob("*.error")) == ["bad-1.error", "bad-2.error"]
    assert [os.fsencode(p.name) for p in folder.glob("*.txt")] == [b"bad-\xff.txt"]
    assert (folder / "task-000.finish").read_text() == "text of task-000"
    assert (folder / "notes.md").exists()
    d = Dispenser(str(folder.resolve()))
    assert d.counts() == {"pending": 0, "assigned": 0, "done": 60, "failed": 2}


def test_worker_in_process_logs_failures_with_the_exception(caplog: pytest.LogCaptureFixture) -> None:
    class Flaky(Worker):
        dispenser = "inproc"
        batch = 3
        max_attempts = 1

        def do_work(self, key: str, payload: object) -> bool:
            if key == "boom":
                raise RuntimeError("kaput")
            return key != "no"

    Dispenser("inproc").put(["ok", "boom", "no"])
    with caplog.at_level("INFO", logger="resource_lease.worker"):
        stats = Flaky(name="solo").run(until_empty=True)
    assert (stats.done, stats.failed, stats.refused) == (1, 2, 0)
    errors = {i.key: i.error for i in Dispenser("inproc").items(state="failed")}
    assert errors == {"boom": "RuntimeError: kaput", "no": "do_work returned False"}
    text = caplog.text
    assert "starts on dispenser 'inproc'" in text and "finished 'ok'" in text
    assert "kaput" in text and any(r.exc_info for r in caplog.records), "the exception is logged with its traceback"


BAD_WORKERS = [
    (lambda: Worker(name=""), "name"),
    (lambda: Worker(name="w"), "dispenser"),
    (lambda: type("W", (Worker,), {"dispenser": "d", "batch": 0})(name="w"), "batch"),
    (lambda: type("W", (Worker,), {"dispenser": "d", "ttl": -1})(name="w"), "ttl"),
    (lambda: type("W", (Worker,), {"dispenser": "d", "pattern": "("})(name="w"), "pattern"),
    (lambda: Worker(name="w", dispenser="d", colour="red"), "colour"),
    (lambda: FolderWorker(name="w", folder="/nonexistent/folder"), "folder"),
    (lambda: FolderWorker(name="w", folder=".", extension="t/x"), "extension"),
]


@pytest.mark.parametrize(("make", "named"), BAD_WORKERS)
def test_bad_worker_settings_are_value_errors_naming_them(make: Callable[[], object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make()
    assert not DispenserItem.objects.exists()


def test_pid_is_not_needed_in_the_name() -> None:
    assert Worker(name="x", dispenser="d").name == "x"
    assert str(os.getpid()) in Worker(dispenser="d").name


def test_the_demo_proves_exactly_once_after_a_kill() -> None:
    """``manage.py demo_dispenser`` (the main job's dispenser part), small, on the test database."""
    from django.db import connection

    from tests.conftest import REPO, worker_env

    if connection.vendor != "sqlite":
        pytest.skip("the main job runs on embedded SQLite; the other backends run the same scenarios above")
    proc = subprocess.run(
        [sys.executable, "manage.py", "demo_dispenser", "--items", "60", "--workers", "2", "--ttl", "2"],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Every one of the 60 items was done exactly once." in proc.stdout
    assert "done twice or more: 0, never done: 0" in proc.stdout


def test_a_claim_lost_while_working_is_logged_loudly_and_its_outcome_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Slow(Worker):
        dispenser = "lost-claim"
        batch = 1
        ttl = 1.5  # renewed every 0.5 s

        def do_work(self, key: str, payload: object) -> bool:
            Dispenser("lost-claim").release(self.name)  # an operator's "release claims", mid-work
            time.sleep(1.5)
            return True

    Dispenser("lost-claim").put(["a"])
    worker = Slow(name="slow")
    with caplog.at_level("INFO", logger="resource_lease.worker"):
        stats = worker.run(max_batches=1)
    assert (stats.done, stats.refused) == (0, 1)
    assert "slow lost 1 of its 1 claim(s)" in caplog.text, "the background renewal must report the loss"
    assert "the outcome of 'a' was refused" in caplog.text


def test_renewal_keeps_claims_alive_past_the_ttl() -> None:
    class Long(Worker):
        dispenser = "renewed"
        batch = 2
        ttl = 1.0

        def do_work(self, key: str, payload: object) -> bool:
            time.sleep(1.5)  # longer than the ttl: only the background renewal keeps the claim
            return True

    Dispenser("renewed").put(["a", "b"])
    stats = Long(name="long").run(until_empty=True)
    assert (stats.done, stats.refused) == (2, 0)
