"""Shared health's and policies' named operations (``db/health.py``'s statements), a part of
``db.operations.Operations``: ``ops(using).health.report_ok(...)``, ``.report_failure(...)``,
``.retire(...)``, ``.read_policy(...)``. A report is never repeated blindly (it adds to a
score): a lost answer raises ``OutcomeUnknown``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from resource_lease.db.answers import Answer
from resource_lease.db.base import Dialect
from resource_lease.db.connections import run_once, run_repeatable


@dataclass(frozen=True)
class Health:
    """A resource's health as a report left it (the database's values)."""

    score: float
    level: int
    quarantined_until: dt.datetime | None


def _returned(d: Dialect, c: Any, sql: str, params: dict[str, Any]) -> Health | None:
    c.execute(sql, params)
    if c.description is None:  # MySQL/MariaDB: the UPDATE, then the read-back's result set
        matched = c.rowcount == 1
        c.nextset()
        rows = c.fetchall()
        row: Sequence[Any] | None = rows[0] if matched and rows else None
    else:
        rows = c.fetchall()  # every row: SQLite ends the statement (and its lock) only then
        row = rows[0] if rows else None
    if row is None:
        return None
    score, level, until = row
    return Health(float(score), int(level), None if until is None else d.to_datetime(until))


@dataclass(frozen=True)
class HealthOperations:
    alias: str

    def report_ok(
        self, *, pk: int, holder: str, fence: int, probation: bool, level: int, decay: float
    ) -> Health | None:
        """A success on a live grant of ours: the score decays (a probation grant's: the
        resource is healthy again). The health it left, or None if the grant is no longer ours
        (nothing changed)."""
        params = {"pk": pk, "holder": holder, "fence": fence, "probation": int(probation), "level": level}
        params["decay"] = decay
        return run_once(self.alias, lambda d, c: _returned(d, c, d.sql["REPORT_OK"], params), what="lease.report('ok')")

    def report_failure(
        self,
        *,
        pk: int,
        holder: str,
        fence: int,
        probation: bool,
        level: int,
        threshold: float,
        base: float,
        cap: float,
        jitter: float,
        hold: float,
        reason: str,
        hold_reason: str,
        outcome: str,
    ) -> Health | None:
        """A failure on a live grant of ours (``db/health.py``'s REPORT_FAILURE). The health it
        left, or None if the grant is no longer ours (nothing changed)."""
        params = {
            "pk": pk,
            "holder": holder,
            "fence": fence,
            "probation": int(probation),
            "level": level,
            "threshold": threshold,
            "base": base,
            "cap": cap,
            "jitter": jitter,
            "hold": hold,
            "reason": reason,
            "hold_reason": hold_reason,
        }
        return run_once(
            self.alias,
            lambda d, c: _returned(d, c, d.sql["REPORT_FAILURE"], params),
            what=f"lease.report({outcome!r})",
        )

    def retire(self, *, pk: int, max_uses: int, max_age: float, reason: str) -> bool:
        """Disable the row ``pk`` (``reason`` says why) if it has been granted ``max_uses``
        times or is ``max_age`` seconds old; whether it was retired now (repeatable)."""
        params = {"pk": pk, "max_uses": max_uses, "max_age": max_age, "reason": reason}

        def retire(d: Dialect, c: Any) -> bool:
            return bool(d.execute(c, "RETIRE", params, answer=Answer.CHANGED_ONE))

        return run_repeatable(self.alias, retire, what="retiring a resource")

    def read_level(self, pk: int) -> int:
        """The backoff level of the row ``pk`` now (0 if it is gone)."""

        def read(d: Dialect, c: Any) -> int:
            level = d.execute(c, "LEVEL_READ", {"pk": pk}, answer=Answer.VALUE)
            return 0 if level is None else int(level)

        return run_repeatable(self.alias, read, what="reading a resource's backoff level")

    def read_policy(self, kind: str) -> tuple[Any, ...] | None:
        """The stored policy of ``kind`` (``db/health.py``'s POLICY_READ columns), or None."""

        def read(d: Dialect, c: Any) -> tuple[Any, ...] | None:
            row = d.execute(c, "POLICY_READ", {"kind": kind}, answer=Answer.FIRST)
            return None if row is None else tuple(row)

        return run_repeatable(self.alias, read, what=f"reading the policy of {kind!r}")
