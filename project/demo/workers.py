"""The demo's dispenser worker: "works" an item for a moment and writes each accepted
outcome to a ledger file, which the demo reads to prove every item was done exactly once."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from resource_lease import Worker, WorkItem

DISPENSER = "demo-dispenser"


class DemoWorker(Worker):
    dispenser = DISPENSER
    batch = int(os.environ.get("DEMO_DISPENSER_BATCH", "5"))
    ttl = float(os.environ.get("DEMO_DISPENSER_TTL", "3"))
    poll = 0.2

    def do_work(self, key: str, payload: Any) -> bool:
        time.sleep(float(os.environ.get("DEMO_DISPENSER_HOLD", "0.02")))
        return True

    def finished(self, item: WorkItem, ok: bool, counted: bool) -> None:
        ledger = os.environ.get("DEMO_DISPENSER_LEDGER")
        if ledger and ok:
            with open(Path(ledger) / f"ledger-{os.getpid()}", "a") as f:
                f.write(f"{'accepted' if counted else 'refused'} {item.key} {item.fence} {self.name}\n")
