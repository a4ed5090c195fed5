"""Equal workers draining a dispenser: ``Worker`` and ``FolderWorker`` (task files in a folder).

A worker claims a batch with ``Dispenser.assign``, runs ``do_work`` on each item, and reports
each outcome at once with the WorkItem (so a fenced ``done``: a former self is refused). The
process's keeper renews the batch's claims while it works (``BatchClaims``); a renewal the
database refuses, or one that keeps failing until the claims' ttl has passed, is logged as
an error. SIGTERM
(or ``stop()``) lets the current item finish, then gives the rest of the batch back.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resource_lease.conf import lease_settings
from resource_lease.db.connections import close_connections
from resource_lease.exceptions import LeaseError
from resource_lease.lease import default_holder, safety_margin
from resource_lease.recipes.dispenser import (
    Dispenser,
    WorkItem,
    check_count,
    check_file_key,
    check_key,
    check_pattern,
    key_matches,
)
from resource_lease.renewal import renew_once, renewer
from resource_lease.validation import check_name, check_seconds, resolve_ttl

# Named before the module moved into recipes/, and kept: logging configurations name it.
logger = logging.getLogger("resource_lease.worker")

#: Seconds between two looks, by an idle worker that runs for ever, at what it waits for.
IDLE_LOOK = 60.0


@dataclass
class WorkerStats:
    """What a ``run()`` did."""

    done: int = 0
    failed: int = 0
    refused: int = 0  # outcomes the database refused: the claim was lost (expired, taken)
    released: int = 0
    batches: int = 0


class Worker:
    """The hand-written WorkerBase's shape: one of several equal workers draining a dispenser.

    Subclasses set ``dispenser`` (its name), and may set ``batch``, ``ttl``, ``pattern``
    (the keys this worker takes: ``Dispenser.assign``'s pattern, a full match of the key),
    ``max_attempts`` and ``poll``, and implement ``do_work(key, payload)``: True when done;
    False or an exception when failed.
    """

    dispenser: str = ""
    batch: int = 10
    #: Seconds a claim lasts unless renewed; default: the ``DISPENSER_TTL`` setting (300).
    ttl: float | None = None
    pattern: str | None = None
    max_attempts: int = 3
    #: Seconds between two looks at an empty dispenser.
    poll: float = 1.0
    using: str | None = None

    def __init__(self, name: str | None = None, **options: Any) -> None:
        for option, value in options.items():
            if option not in ("dispenser", "batch", "ttl", "pattern", "max_attempts", "poll", "using"):
                raise ValueError(f"{option} is not a Worker option")
            setattr(self, option, value)
        self.name = check_name(default_holder()[:200] if name is None else name, "name")
        self.batch = check_count(self.batch, "batch")
        self.ttl = resolve_ttl(self.ttl, lease_settings.DISPENSER_TTL)
        self.poll = check_seconds(self.poll, "poll")
        self.pattern = check_pattern(self.pattern)
        self.queue = Dispenser(self.dispenser_name(), ttl=self.ttl, max_attempts=self.max_attempts, using=self.using)
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._current: list[WorkItem] = []
        self._current_lock = threading.Lock()
        self._next_idle_look = 0.0
        self._idle_report: tuple[int, int] | None = None

    def dispenser_name(self) -> str:
        return check_name(self.dispenser, "dispenser")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {self.queue.name!r}>"

    # -- the work ----------------------------------------------------------------------------

    def do_work(self, key: str, payload: Any) -> bool:
        """Work on one item: True when done; False (or an exception) when it failed."""
        raise NotImplementedError(f"{type(self).__name__} must implement do_work(key, payload)")

    def load(self, item: WorkItem) -> Any:
        """The payload ``do_work`` gets for an item (FolderWorker reads the file)."""
        return item.payload

    def finished(self, item: WorkItem, ok: bool, counted: bool) -> None:
        """Called after an item's outcome was reported (``counted``: the database took it)."""

    def before_batch(self) -> None:
        """Called before each assign (FolderWorker puts the folder's new files)."""

    # -- the loop ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask ``run()`` to stop: the current item finishes, the rest of the batch is released."""
        self._stop.set()
        self.queue.bell.wake_here()  # an idle run() sleeping on the bell looks at _stop now

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, until_empty: bool = False, *, max_batches: int | None = None) -> WorkerStats:
        """Claim and work batches until stopped (SIGTERM, ``stop()``), or, with
        ``until_empty``, until nothing is left that this worker could ever claim: nothing
        pending or assigned whose key its ``pattern`` matches (other workers' live claims
        count: they come back if their worker dies)."""
        self._stop.clear()
        logger.info(
            "worker %s starts on dispenser %r (batch %d, ttl %gs)", self.name, self.queue.name, self.batch, self.ttl
        )
        claims = BatchClaims(self)
        renewer().add(claims)  # the keeper renews the current batch's claims
        try:
            # Idle, it sleeps on the dispenser's bell: woken when items come to the pool, and
            # looking anyway every ``poll`` seconds (claims that expired come back unrung).
            with self._sigterm(), self.queue.bell.listening() as sleep:
                while not self._stop.is_set():
                    if max_batches is not None and self.stats.batches >= max_batches:
                        break
                    self.before_batch()
                    try:
                        items = self.queue.assign(self.name, self.batch, pattern=self.pattern)
                    except LeaseError as exc:
                        # The database is unwell: try again after a pause (what this assign
                        # may have claimed comes back to this name first next time).
                        logger.error("worker %s: assign failed, retrying in %gs: %s", self.name, self.poll, exc)
                        self._stop.wait(self.poll)
                        continue
                    if not items:
                        if self._idle(until_empty):
                            break
                        sleep(self.poll)
                        continue
                    self._idle_report = None
                    self.stats.batches += 1
                    self._work(items)
        finally:
            self._stop.set()
            renewer().discard(claims)
            with self._current_lock:
                rest, self._current = self._current, []
            if rest:  # an exception escaped mid-batch: give the rest back
                self.stats.released += self.queue.release(self.name, rest)
            logger.info(
                "worker %s stops: %d done, %d failed, %d refused, %d released",
                self.name,
                self.stats.done,
                self.stats.failed,
                self.stats.refused,
                self.stats.released,
            )
            close_connections()
        return self.stats

    def _idle(self, until_empty: bool) -> bool:
        """Nothing was claimed: whether ``run(until_empty=True)`` is done, i.e. nothing is left
        that this worker could ever claim (its ``pattern`` matches no unfinished key). Says in
        the log, once per change, what it waits for and which items it leaves to others."""
        now = time.monotonic()
        if not until_empty and now < self._next_idle_look:
            return False  # a worker that runs for ever looks (and logs) once a minute at most
        self._next_idle_look = now + IDLE_LOOK
        try:
            total, takeable = self.queue.unfinished(pattern=self.pattern)
        except LeaseError as exc:
            logger.error(
                "worker %s: counting the unfinished items failed, retrying in %gs: %s", self.name, self.poll, exc
            )
            return False
        if (total, takeable) != self._idle_report:
            self._idle_report = (total, takeable)
            if total > takeable:
                logger.warning(
                    "worker %s: %d unfinished item(s) of %r do not match its pattern %r: it never takes them,"
                    " they are left to other workers",
                    self.name,
                    total - takeable,
                    self.queue.name,
                    self.pattern,
                )
            if takeable:
                logger.info(
                    "worker %s: waiting for %d item(s) it could take, claimed by other workers now"
                    " (they come back to the pool if a claim expires)",
                    self.name,
                    takeable,
                )
        return until_empty and takeable == 0

    def _work(self, items: list[WorkItem]) -> None:
        with self._current_lock:
            self._current = list(items)
        for i, item in enumerate(items):
            if self._stop.is_set():
                rest = items[i:]
                released = self.queue.release(self.name, rest)
                self.stats.released += released
                logger.info("worker %s stopping: gave back %d unstarted item(s)", self.name, released)
                break
            self._one(item)
        with self._current_lock:
            self._current = []

    def _one(self, item: WorkItem) -> None:
        logger.info("worker %s starts %r (attempt %d)", self.name, item.key, item.attempts)
        error = ""
        try:
            ok = bool(self.do_work(item.key, self.load(item)))
            if not ok:
                error = "do_work returned False"
        except Exception as exc:
            ok = False
            error = f"{type(exc).__name__}: {exc}"
            logger.exception("worker %s failed %r", self.name, item.key)
        # No longer renewed: its outcome is being reported (and a renewal racing with the
        # report must not take the finished item for a lost claim).
        with self._current_lock:
            self._current = [i for i in self._current if i != item]
        try:
            if ok:
                counted = self.queue.done(self.name, [item]) == 1
            else:
                counted = self.queue.fail(self.name, [item], error[:10_000]) == 1
        except LeaseError:
            # Not recorded: the claim runs out and the item is worked again (at least once).
            logger.exception("worker %s: reporting the outcome of %r failed", self.name, item.key)
            counted = False
        if not counted:
            self.stats.refused += 1
            logger.error(
                "worker %s: the outcome of %r was refused: its claim (fence %d) expired or was taken over",
                self.name,
                item.key,
                item.fence,
            )
        elif ok:
            self.stats.done += 1
            logger.info("worker %s finished %r", self.name, item.key)
        else:
            self.stats.failed += 1
            logger.warning("worker %s: %r failed: %s", self.name, item.key, error)
        self.finished(item, ok, counted)

    @contextmanager
    def _sigterm(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            logger.info("worker %s got SIGTERM: finishing the current item", self.name)
            self._stop.set()

        previous = signal.signal(signal.SIGTERM, on_sigterm)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)


class BatchClaims:
    """The claims of a worker's current batch, renewed by the process's keeper every ttl x
    ``RENEW_FRACTION`` under the one failure policy (``renewal.renew_once``): a renewal the
    database could not answer is tried again while the claims may still be trusted; past
    that, or when it refuses some of them (expired, taken over), the loss is logged as an
    error and the renewals go on for the items the worker still works on."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.ttl = worker.queue.ttl
        self._renewed_at = time.monotonic()

    def __repr__(self) -> str:
        return f"<the claims of worker {self.worker.name!r}>"

    def current(self) -> list[WorkItem]:
        with self.worker._current_lock:
            return list(self.worker._current)

    def renew(self) -> None:
        items = self.current()
        sent_at = time.monotonic()
        if items:
            renewed = self.worker.queue.renew(self.worker.name, items)
            if renewed < len(items):
                # Items still current now were current during the whole renewal (one is
                # dropped only when its outcome is reported), so each must have been renewed.
                still = sum(1 for item in self.current() if item in items)
                if renewed < still:
                    logger.error(
                        "worker %s lost %d of its %d claim(s): they expired or were taken over",
                        self.worker.name,
                        still - renewed,
                        still,
                    )
        self._renewed_at = sent_at

    def remaining(self) -> float:
        return max(0.0, self._renewed_at + self.ttl - safety_margin(self.ttl) - time.monotonic())

    def mark_lost(self, reason: str) -> None:
        logger.error("worker %s could not renew its claims within their ttl: %s", self.worker.name, reason)
        self._renewed_at = time.monotonic()  # a fresh window for the claims assigned next

    def renew_in_background(self) -> float | None:
        interval = self.ttl * float(lease_settings.RENEW_FRACTION)
        step = renew_once(self, interval=interval, prefix=f"worker {self.worker.name}: ")
        return interval if step.retry_in is None else step.retry_in


class FolderWorker(Worker):
    """A shared-folder worker, as written by hand before: each ``<key>.<extension>`` file in ``folder`` is a task.

    New files are put into the dispenser (named after the folder unless ``dispenser`` is
    set) and claimed through the database, never by rename, so two workers never take one
    file. A file whose key ``pattern`` does not match is not put: it is not this worker's
    task (a worker whose pattern matches it puts it), and never keeps ``until_empty`` waiting. After ``do_work(key, text)`` the file becomes ``<key>.finish`` or ``<key>.error``
    (an existing one is replaced). ``max_attempts`` is 1: a failed file is an error at once.
    """

    folder: str = ""
    extension: str = "txt"
    max_attempts: int = 1

    def __init__(self, name: str | None = None, **options: Any) -> None:
        folder = options.pop("folder", None)
        extension = options.pop("extension", None)
        if folder is not None:
            self.folder = folder
        if extension is not None:
            self.extension = extension
        if not isinstance(self.folder, (str, os.PathLike)) or not str(self.folder):
            raise ValueError(f"folder must be a directory path, got {self.folder!r}")
        if not isinstance(self.extension, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", self.extension):
            raise ValueError(f"extension must be letters, digits, _ or -, got {self.extension!r}")
        self.path = Path(self.folder).resolve()
        if not self.path.is_dir():
            raise ValueError(f"folder must be an existing directory, got {str(self.folder)!r}")
        self._known: set[str] = set()
        self._unusable: set[str] = set()
        super().__init__(name, **options)

    def dispenser_name(self) -> str:
        return check_name(self.dispenser or str(self.path)[-200:], "dispenser")

    def task_path(self, key: str, suffix: str | None = None) -> Path:
        """``<key>.<extension>`` (or ``<key>.<suffix>``) in the folder. ``ValueError`` naming
        the key unless it is one plain file name (``check_file_key``: anyone who can put
        keys into the dispenser could put ``../outside`` or ``/abs/path``) and the path,
        resolved, is a file of the folder itself, not a symbolic link to anywhere."""
        key = check_file_key(key)
        path = self.path / f"{key}.{self.extension if suffix is None else suffix}"
        if path.is_symlink() or path.resolve().parent != self.path:
            raise ValueError(f"key {key!r}: {path.name!r} is a symbolic link or resolves outside {str(self.path)!r}")
        return path

    def before_batch(self) -> None:
        """Put the folder's new task files; tidy files whose item is finished already (a
        worker died between its outcome and the rename, or the claim expired for good)."""
        keys = sorted(
            p.name[: -len(self.extension) - 1]
            for p in self.path.glob(f"*.{self.extension}")
            if p.is_file() or p.is_symlink()  # a link is refused below, by name
        )
        new = []
        for key in keys:
            if key in self._known or key in self._unusable:
                continue
            if not key_matches(self.pattern, key):
                # Not this worker's task: it is never put, so it never counts as work
                # left for this worker (a worker whose pattern matches it puts it).
                self._unusable.add(key)
                logger.info(
                    "worker %s: leaving %s to other workers: its pattern %r does not match %r",
                    self.name,
                    self.task_path(key).name,
                    self.pattern,
                    key,
                )
                continue
            try:
                self.task_path(key)  # a symbolic link is no task: never followed out of the folder
                new.append(check_key(key))
            except ValueError as exc:  # e.g. a name longer than a key may be
                self._unusable.add(key)
                logger.warning("worker %s: skipping task file %r: %s", self.name, key, exc)
        if new:
            self.queue.put(new)
            self._known.update(new)
        keys = [k for k in keys if k not in self._unusable]
        if keys:
            for key, state in self.queue.finished(keys[:1000]):
                self._rename(key, "finish" if state == "done" else "error")

    def load(self, item: WorkItem) -> Any:
        # O_NOFOLLOW: a task file swapped for a link after task_path's check is not read.
        fd = os.open(self.task_path(item.key), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with open(fd) as file:  # the default encoding, as Path.read_text
            return file.read()

    def _one(self, item: WorkItem) -> None:
        try:
            self.task_path(item.key)
        except ValueError as exc:
            # Put by someone else (enqueue, another service): no file of this folder. Failed
            # by name, and no file anywhere is read or renamed.
            self.queue.fail(self.name, [item], f"not a task file of this folder: {exc}")
            logger.error("worker %s: refusing item %r: %s", self.name, item.key, exc)
            return
        if not self.task_path(item.key).exists():
            # Renamed by the worker that finished it, or removed by hand.
            self.queue.fail(self.name, [item], "the task file is gone")
            logger.warning("worker %s: the task file of %r is gone", self.name, item.key)
            return
        super()._one(item)

    def finished(self, item: WorkItem, ok: bool, counted: bool) -> None:
        # A refused outcome belongs to the new owner, who renames the file; a failure with
        # attempts left (max_attempts raised above 1) stays a task file.
        if counted and (ok or item.attempts >= self.max_attempts):
            self._rename(item.key, "finish" if ok else "error")

    def _rename(self, key: str, suffix: str) -> None:
        try:
            os.replace(self.task_path(key), self.task_path(key, suffix))
        except FileNotFoundError:
            pass  # another worker tidied it first
        except ValueError as exc:  # a link, or a key that is no file name: left alone
            logger.error("worker %s: not renaming the task file of %r: %s", self.name, key, exc)
