"""A dispenser worker for the tests: works items, and records each outcome in a ledger.

    python -m tests.procs.dispenser_worker --dispenser D --name N --dir LEDGER
        [--batch B] [--ttl T] [--hold H] [--until-empty] [--naive] [--folder F] [--fail-pattern P]

Ledger lines (``ledger-<pid>``): ``batch <key> <key> ...`` for each claimed batch,
``work <key> <name>`` when ``do_work`` starts on a key, then ``<accepted|refused> <key> <fence>
<name>`` for each outcome ``done`` reported. Negative controls the checks must catch:
``--naive`` uses a broken ``done`` that marks the key done without asking whether the claim is
still this worker's and live; ``--naive-assign`` a broken ``assign`` that reads pending items,
then claims them with an unconditional UPDATE.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path
from typing import Any

from tests.procs import setup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dispenser", default="")
    parser.add_argument("--name", required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--ttl", type=float, default=10.0)
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--until-empty", action="store_true")
    parser.add_argument("--naive", action="store_true")
    parser.add_argument("--naive-assign", action="store_true")
    parser.add_argument("--folder", default="")
    parser.add_argument("--fail-pattern", default="")
    args = parser.parse_args()
    setup()
    import logging

    logging.basicConfig(level=logging.WARNING, format=f"{args.name} %(levelname)s %(message)s")

    from resource_lease import Dispenser, FolderWorker, Worker, WorkItem
    from resource_lease.models import DispenserItem

    ledger = args.dir / f"ledger-{os.getpid()}"

    def write(line: str) -> None:
        with open(ledger, "a") as f:
            f.write(line + "\n")
            f.flush()

    class NaiveDispenser(Dispenser):
        def done(self, worker: str, keys: Any, result: Any = None) -> int:
            keys = [k.key if isinstance(k, WorkItem) else k for k in keys]
            return DispenserItem.objects.filter(dispenser=self.name, key__in=keys).update(state="done")

    class NaiveAssignDispenser(Dispenser):
        def assign(self, worker: str, limit: int = 1, *, pattern: str | None = None) -> list[WorkItem]:
            import datetime as dt

            from django.db.models import F

            from resource_lease.db.clock import DbNow

            pending = DispenserItem.objects.filter(dispenser=self.name, state="pending").order_by("id")
            ids = list(pending.values_list("id", flat=True)[:limit])
            # The window between the read and the write, widened (as the ledger's counter is) so
            # that workers running side by side meet in it whatever the machine's load.
            time.sleep(0.05)
            DispenserItem.objects.filter(id__in=ids).update(
                state="assigned",
                worker=worker,
                fence=F("fence") + 1,
                attempts=F("attempts") + 1,
                expires_at=DbNow() + dt.timedelta(seconds=self.ttl),
            )
            rows = DispenserItem.objects.filter(id__in=ids).order_by("id")
            return [WorkItem(r.key, r.payload, r.attempts, r.fence, self.name) for r in rows]

    class Ledgered:
        name: str

        def do_work(self, key: str, payload: Any) -> bool:
            write(f"work {key} {self.name}")
            time.sleep(args.hold)
            return not (args.fail_pattern and re.fullmatch(args.fail_pattern, key))

        def finished(self, item: Any, ok: bool, counted: bool) -> None:
            if ok:
                write(f"{'accepted' if counted else 'refused'} {item.key} {item.fence} {args.name}")
            super().finished(item, ok, counted)  # type: ignore[misc]

    base: type[Worker] = FolderWorker if args.folder else Worker

    class TestWorker(Ledgered, base):  # type: ignore[valid-type,misc]
        dispenser = args.dispenser
        folder = args.folder
        batch = args.batch
        ttl = args.ttl
        poll = 0.2

        def _work(self, items: list[Any]) -> None:
            write("batch " + " ".join(i.key for i in items))
            super()._work(items)

    worker = TestWorker(name=args.name)
    if args.naive or args.naive_assign:
        broken = NaiveDispenser if args.naive else NaiveAssignDispenser
        worker.queue = broken(worker.queue.name, ttl=args.ttl, max_attempts=worker.queue.max_attempts)
    stats = worker.run(until_empty=args.until_empty)
    write(f"stats {stats.done} {stats.failed} {stats.refused} {stats.released}")


if __name__ == "__main__":
    main()
