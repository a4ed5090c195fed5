"""Broken variants of the primitives: the nemesis checker's negative controls.

A nemesis client imports this module (``--patch tests.procs.nemesis_broken``) right after
Django is set up; it breaks, in that process only:

- the engine's grants: a row counts as free whatever its ``busy_before`` (every statement's
  ``busy_before <= now`` becomes ``busy_before IS NOT NULL``), so a lease, lock, semaphore
  slot, leadership or member name held by one process is granted to another;
- the barrier: no member of the last cohort ever counts as inside, so the next round forms
  while the last one is still at work;
- the dispenser: ``assign`` reads pending items and then claims them unconditionally (the
  read-to-write window widened to 50 ms), and ``done`` marks items done without asking whose
  claim is live.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from django.db.models import F

from resource_lease import Dispenser, WorkItem
from resource_lease.db.base import Dialect
from resource_lease.db.clock import DbNow
from resource_lease.models import DispenserItem
from resource_lease.recipes import barrier

_init = Dialect.__init__


def _free_always(self: Dialect, connection: Any) -> None:
    _init(self, connection)
    expired = f"busy_before <= {self.now_sql}"
    for table in (self.sql, *self.forms.values(), self.line.leaving):
        for name, text in table.items():
            if isinstance(text, str) and expired in text:
                table[name] = text.replace(expired, "busy_before IS NOT NULL")
    self.free = self.sql["FREE"]


def _nobody_inside(cohort: Any, snapshot: Any) -> list[str]:
    return []


def _naive_assign(self: Dispenser, worker: str, limit: int = 1, *, pattern: str | None = None) -> list[WorkItem]:
    pending = DispenserItem.objects.filter(dispenser=self.name, state="pending").order_by("id")
    ids = list(pending.values_list("id", flat=True)[:limit])
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


def _naive_done(self: Dispenser, worker: str, keys: Any, result: Any = None) -> int:
    keys = [k.key if isinstance(k, WorkItem) else k for k in keys]
    return DispenserItem.objects.filter(dispenser=self.name, key__in=keys).update(state="done")


Dialect.__init__ = _free_always  # type: ignore[method-assign]
barrier.inside = _nobody_inside
Dispenser.assign = _naive_assign  # type: ignore[method-assign]
Dispenser.done = _naive_done  # type: ignore[method-assign]
