"""A worker with a ``pattern`` and ``until_empty``: "empty" means nothing this worker could
ever claim, so work its pattern skips never keeps it waiting, and the log says what it leaves
to other workers and what it waits for."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from resource_lease import Dispenser, FolderWorker, Worker
from resource_lease.models import DispenserItem
from tests.conftest import REPO, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

#: Generous: a worker that returns does so within a few polls; one that hangs never does.
HANG = 90.0


class Cut(Worker):
    dispenser = "cuts"
    pattern = r".*-cut"
    poll = 0.1

    def do_work(self, key: str, payload: Any) -> bool:
        return True


def run_in_thread(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, kwargs={"until_empty": True}, daemon=True)
    thread.start()
    return thread


def finish(worker: Worker, thread: threading.Thread) -> None:
    thread.join(HANG)
    if thread.is_alive():
        worker.stop()
        thread.join(30)
        pytest.fail(f"{worker!r} with until_empty=True was still waiting after {HANG:g}s")


def test_run_worker_until_empty_returns_when_the_folder_holds_a_file_its_pattern_skips(tmp_path: Path) -> None:
    """The issue's reproduction: readme.txt next to job1-cut.txt, pattern ``.*-cut``."""
    (tmp_path / "readme.txt").write_text("how the farm works")
    (tmp_path / "job1-cut.txt").write_text("cut me")
    env = worker_env(RESOURCE_LEASE_TEST_FOLDER=str(tmp_path))
    try:
        proc = subprocess.run(
            [sys.executable, "manage.py", "run_worker", "tests.procs.sample_workers.CutFiles", "--name", "w1"]
            + ["--until-empty", "-v", "2"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"run_worker --until-empty was still waiting after {HANG:g}s")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "job1-cut.finish").exists()
    assert (tmp_path / "readme.txt").exists(), "a file the pattern skips is left alone"
    # The decision documented in docs/dispenser.md: a FolderWorker never puts files its
    # pattern skips, and says so.
    assert list(DispenserItem.objects.values_list("key", flat=True)) == ["job1-cut"]
    assert "leaving readme.txt to other workers: its pattern '.*-cut' does not match 'readme'" in proc.stderr


def test_a_folder_worker_puts_only_the_files_its_pattern_matches(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("x")
    (tmp_path / "a-cut.txt").write_text("x")

    class Folder(FolderWorker):
        pattern = r".*-cut"

        def do_work(self, key: str, payload: Any) -> bool:
            return True

    worker = Folder(name="f", folder=tmp_path)
    worker.before_batch()
    assert Dispenser(worker.queue.name).counts()["pending"] == 1
    assert worker.queue.is_empty(pattern=r"readme")


def test_a_worker_with_a_pattern_stops_when_only_keys_it_skips_are_left(caplog: pytest.LogCaptureFixture) -> None:
    Dispenser("cuts").put(["a-cut", "b-cut", "readme", "notes"])
    worker = Cut(name="w1")
    with caplog.at_level("INFO", logger="resource_lease.worker"):
        finish(worker, run_in_thread(worker))
    assert worker.stats.done == 2
    assert sorted(i.key for i in Dispenser("cuts").items(state="pending")) == ["notes", "readme"]
    assert (
        "worker w1: 2 unfinished item(s) of 'cuts' do not match its pattern '.*-cut': it never takes them,"
        " they are left to other workers"
    ) in caplog.text


def test_until_empty_still_waits_for_a_matching_item_another_worker_holds(caplog: pytest.LogCaptureFixture) -> None:
    """A live claim of another worker may come back (its worker dies): not empty yet."""
    d = Dispenser("cuts", ttl=300)
    d.put(["x-cut"])
    [item] = d.assign("other", 1)
    worker = Cut(name="w1")
    with caplog.at_level("INFO", logger="resource_lease.worker"):
        thread = run_in_thread(worker)
        deadline = threading.Event()
        for _ in range(int(HANG * 10)):
            if "waiting for 1 item(s) it could take, claimed by other workers now" in caplog.text:
                break
            deadline.wait(0.1)
        assert "waiting for 1 item(s) it could take" in caplog.text
        assert thread.is_alive()
        assert d.done("other", [item]) == 1
        finish(worker, thread)
    assert worker.stats.done == 0


def test_is_empty_and_unfinished_follow_the_pattern_as_the_database_matches_it() -> None:
    d = Dispenser("cuts")
    assert d.is_empty() and d.unfinished() == (0, 0)
    d.put(["job-cut", "job-cut-2", "readme"])
    assert d.unfinished() == (3, 3)
    assert d.unfinished(pattern=r".*-cut") == (3, 1), "the whole key must match (re.fullmatch)"
    assert not d.is_empty(pattern=r".*-cut")
    assert d.is_empty(pattern=r"nothing.*")
    [item] = d.assign("w", 1, pattern=r".*-cut")
    assert d.unfinished(pattern=r".*-cut") == (3, 1), "a live claim is still unfinished"
    d.done("w", [item])
    assert d.is_empty(pattern=r".*-cut")
    with pytest.raises(ValueError, match="pattern"):
        d.is_empty(pattern="(")


def test_put_refuses_a_repeated_key_and_writes_nothing() -> None:
    d = Dispenser("cuts")
    with pytest.raises(ValueError, match="items must not repeat a key, got 'a' twice"):
        d.put(["a", "b", "a"])
    assert not DispenserItem.objects.exists()
    with pytest.raises(ValueError, match="mapping must not repeat a key"):
        d.recreate(["a", "a"])
    assert d.put(["a", "b"]) == 2
