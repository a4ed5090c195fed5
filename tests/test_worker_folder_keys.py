"""A ``FolderWorker`` reads and renames files of its own folder only (issue 37, point 2).

Its task file is ``<key>.<extension>`` in the folder, and anyone who can put keys into its
dispenser (``manage.py enqueue``, another service) could put ``../outside`` or
``/abs/path``: the worker read that file as the payload and renamed it to ``.finish``. A key
that is not one plain file name is now refused where it enters (``enqueue --file-names``,
``check_file_key``) and, when it reaches the worker anyway, failed by name without touching
any file; a task file that is a symbolic link is never followed.

Negative control: with ``task_path`` joining the key to the folder and ``load`` following
links as before, the same worker reads and renames the files outside the folder.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from resource_lease import Dispenser, FolderWorker
from resource_lease.recipes.dispenser import check_file_key

pytestmark = pytest.mark.django_db(transaction=True)


class Recording(FolderWorker):
    extension = "txt"
    dispenser = "folder-keys"
    batch = 10

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.seen: dict[str, str] = {}

    def do_work(self, key: str, payload: object) -> bool:
        self.seen[key] = str(payload)
        return True


def layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A folder with one real task and a task file that links outside it; two files outside
    (one beside the folder, one anywhere) that keys could name, and the link's target."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "real.txt").write_text("real work")
    beside = tmp_path / "outside.txt"
    beside.write_text("secret beside the folder")
    anywhere = tmp_path / "elsewhere" / "abs.txt"
    anywhere.parent.mkdir()
    anywhere.write_text("secret anywhere")
    (tmp_path / "linked.txt").write_text("secret behind a link")
    (folder / "link.txt").symlink_to(tmp_path / "linked.txt")
    return folder, beside, anywhere


def run_worker(folder: Path, anywhere: Path) -> Recording:
    # Keys put by someone else, straight into the worker's dispenser.
    Dispenser("folder-keys").put(["../outside", str(anywhere)[: -len(".txt")], "..", "a\\b"])
    worker = Recording(name="w", folder=str(folder))
    worker.run(until_empty=True)
    return worker


def test_keys_that_are_not_plain_file_names_touch_no_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder, beside, anywhere = layout(tmp_path)
    with caplog.at_level(logging.ERROR, logger="resource_lease.worker"):
        worker = run_worker(folder, anywhere)
    assert worker.seen == {"real": "real work"}  # never the text of a file outside
    assert beside.read_text() == "secret beside the folder" and anywhere.read_text() == "secret anywhere"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "linked.txt", "outside.txt", "tasks"]
    assert sorted(p.name for p in anywhere.parent.iterdir()) == ["abs.txt"]
    assert sorted(p.name for p in folder.iterdir()) == ["link.txt", "real.finish"]  # the link left alone
    assert (folder / "link.txt").is_symlink()
    failed = {item.key: item.error for item in Dispenser("folder-keys").items(state="failed")}
    assert sorted(failed) == sorted(["../outside", str(anywhere)[: -len(".txt")], "..", "a\\b"])
    assert all("plain file name" in error for error in failed.values()), failed
    assert "'../outside'" in caplog.text
    assert not Dispenser("folder-keys").items(state="pending")  # the link was never put


def test_control_joining_the_key_as_before_reads_and_renames_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, beside, anywhere = layout(tmp_path)

    def joined(self: FolderWorker, key: str, suffix: str | None = None) -> Path:
        return self.path / f"{key}.{self.extension if suffix is None else suffix}"

    monkeypatch.setattr(FolderWorker, "task_path", joined)
    monkeypatch.setattr(FolderWorker, "load", lambda self, item: self.task_path(item.key).read_text())
    worker = run_worker(folder, anywhere)
    assert worker.seen["../outside"] == "secret beside the folder"
    assert worker.seen["link"] == "secret behind a link"
    assert worker.seen[str(anywhere)[: -len(".txt")]] == "secret anywhere"
    assert (tmp_path / "outside.finish").exists() and (anywhere.parent / "abs.finish").exists()


@pytest.mark.parametrize("key", ["../outside", "/abs/path", "a/b", "a\\b", ".", ".."])
def test_check_file_key_names_the_key(key: str) -> None:
    with pytest.raises(ValueError, match="plain file name"):
        check_file_key(key)


def test_enqueue_with_file_names_refuses_such_keys_by_line(tmp_path: Path) -> None:
    lines = tmp_path / "items.txt"
    lines.write_text("good-1\n../outside\n")
    with pytest.raises(CommandError, match=r"line 2: .*'\.\./outside'"):
        call_command("enqueue", "folder-keys", str(lines), "--file-names")
    assert not Dispenser("folder-keys").items()
    lines.write_text("good-1\n..x\n.hidden\n")
    call_command("enqueue", "folder-keys", str(lines), "--file-names")
    assert sorted(item.key for item in Dispenser("folder-keys").items()) == ["..x", ".hidden", "good-1"]
    assert os.path.basename("..x") == "..x"
