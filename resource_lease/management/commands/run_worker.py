"""``manage.py run_worker dotted.path.WorkerClass --name NAME [--until-empty]``

Runs a ``Worker`` (or ``FolderWorker``) subclass in this process, printing a line per item;
SIGTERM finishes the current item and gives the rest of the batch back.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.module_loading import import_string

from resource_lease.management.commands._base import LeaseCommand
from resource_lease.recipes.dispenser import WorkItem
from resource_lease.recipes.worker import Worker


class Command(LeaseCommand):
    help = "Run a dispenser worker (a resource_lease.Worker subclass) until stopped or, with --until-empty, drained."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("worker_class", help="dotted path of the Worker subclass, e.g. myapp.workers.Crawl")
        parser.add_argument("--name", required=True, help="this worker's name (a restart under it resumes its items)")
        parser.add_argument(
            "--until-empty",
            action="store_true",
            help="stop when nothing is left that this worker could claim (pending or assigned, matching its pattern)",
        )

    def handle(self, *args: Any, worker_class: str, name: str, until_empty: bool, **options: Any) -> None:
        try:
            cls = import_string(worker_class)
        except ImportError as exc:
            raise CommandError(f"cannot import {worker_class!r}: {exc}") from None
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise CommandError(f"{worker_class!r} is not a resource_lease.Worker subclass")
        try:
            worker = cls(name=name)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        # A database that cannot be reached at start is one clear error, not a worker that
        # retries for ever (once running, the worker rides out a database restart).
        worker.queue.unfinished()
        verbosity = int(options.get("verbosity", 1))
        stdout = self.stdout
        original = worker.finished

        def progress(item: WorkItem, ok: bool, counted: bool) -> None:
            original(item, ok, counted)
            if verbosity >= 1:
                outcome = ("done" if ok else "failed") if counted else "refused (claim lost)"
                s = worker.stats
                stdout.write(f"[{s.done} done, {s.failed} failed, {s.refused} refused] {item.key}: {outcome}")

        worker.finished = progress  # type: ignore[method-assign]
        if verbosity >= 1:
            stdout.write(
                f"{worker!r}: batch {worker.batch}, ttl {worker.ttl:g}s{', until empty' if until_empty else ''}"
            )
        stats = worker.run(until_empty=until_empty)
        if verbosity >= 1:
            stdout.write(
                f"{worker.name}: {stats.done} done, {stats.failed} failed, {stats.refused} refused, "
                f"{stats.released} given back, {stats.batches} batches"
            )
