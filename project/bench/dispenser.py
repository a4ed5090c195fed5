"""The dispenser benchmark's worker: no work at all, so the figures are the dispenser's cost."""

from __future__ import annotations

import os
from typing import Any

from resource_lease import Worker


class BenchWorker(Worker):
    dispenser = os.environ.get("DISPENSER_BENCH_NAME", "bench-drain")
    batch = int(os.environ.get("DISPENSER_BENCH_BATCH", "10"))
    ttl = 60.0
    poll = 0.05

    def do_work(self, key: str, payload: Any) -> bool:
        return True
