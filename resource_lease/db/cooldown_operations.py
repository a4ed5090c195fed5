"""Targets' cooldowns as named operations (``db/cooldowns.py``'s statements), a part of
``db.operations.Operations``: ``ops(using).cooldowns.cool(...)``, ``.count_grant(...)``,
``.read_recent(...)``. Each write only moves a cooldown later and stores what it is given,
so running one again after a lost answer changes nothing more: they are repeatable."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from resource_lease.db.answers import Answer
from resource_lease.db.base import Dialect
from resource_lease.db.connections import run_repeatable


@dataclass(frozen=True)
class CooldownOperations:
    alias: str

    def cool(self, *, pk: int, holder: str, fence: int, target: str, seconds: float) -> bool:
        """Cool the leased row ``pk`` down for ``target`` for ``seconds`` from now (database
        clock; a later cooldown already stored stays). False if the lease is no longer ours
        (nothing written)."""
        params = {"pk": pk, "holder": holder, "fence": fence, "target": target, "seconds": seconds, "recent": "[]"}

        def cool(d: Dialect, c: Any) -> bool:
            return bool(d.execute(c, "COOL", params, answer=Answer.COUNT) >= 1)

        return run_repeatable(self.alias, cool, what=f"cooling a resource down for {target!r}")

    def count_grant(
        self, *, pk: int, holder: str, fence: int, target: str, recent: list[float], seconds: float
    ) -> bool:
        """Store the grant times ``recent`` of the leased row ``pk`` for ``target`` (the
        policy's ``target_rate``), and cool it down for ``seconds`` from now if that is later
        than its cooldown (0: no later). False if the lease is no longer ours."""
        params = {
            "pk": pk,
            "holder": holder,
            "fence": fence,
            "target": target,
            "seconds": seconds,
            "recent": json.dumps(recent),
        }

        def count(d: Dialect, c: Any) -> bool:
            return bool(d.execute(c, "COUNT_GRANT", params, answer=Answer.COUNT) >= 1)

        return run_repeatable(self.alias, count, what=f"counting a grant for {target!r}")

    def read_recent(self, *, pk: int, target: str) -> list[float]:
        """The grant times stored for the row ``pk`` and ``target`` (epoch seconds, database
        clock), oldest first; [] if none."""

        def read(d: Dialect, c: Any) -> list[float]:
            value = d.execute(c, "RECENT_READ", {"pk": pk, "target": target}, answer=Answer.VALUE)
            if value is None:
                return []
            return [float(t) for t in (json.loads(value) if isinstance(value, (str, bytes)) else value)]

        return run_repeatable(self.alias, read, what=f"reading the grants counted for {target!r}")
