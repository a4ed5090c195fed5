"""The leadership log's named operations (``db/terms.py``'s statements), a part of
``db.operations.Operations``: ``ops(using).terms.record_term(...)``, ``.terms_after(...)``,
``.wake_observers(...)``. Each is repeatable: writing a term twice keeps the first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resource_lease.db.answers import Answer
from resource_lease.db.base import Dialect
from resource_lease.db.connections import lease_connection, run_repeatable


@dataclass(frozen=True)
class TermOperations:
    alias: str

    def record_term(self, kind: str, name: str, *, fence: int, holder: str, channel: str) -> bool:
        """Write down the live grant ``fence`` of ``holder`` on the election row ``(kind,
        name)`` as a term, with the term before it; whether the log has this term as
        ``holder``'s now (False: the grant was no longer live, nothing written)."""
        params = {"kind": kind, "name": name, "fence": fence, "holder": holder, "channel": channel}

        def record(d: Dialect, c: Any) -> bool:
            c.execute(d.sql["TERM_RECORD"], params)
            if c.description is not None:  # PostgreSQL's form selects its NOTIFY
                c.fetchall()
            leader = d.execute(c, "TERM_LEADER", {"election": name, "fence": fence}, answer=Answer.VALUE)
            return bool(leader == holder)

        return run_repeatable(self.alias, record, what=f"election {name!r} writing down term {fence}")

    def terms_after(self, name: str, fence: int) -> list[tuple[int, str]]:
        """``(fence, leader)`` of the written terms of election ``name`` after ``fence``,
        oldest first (at most ``db.terms.TERMS_READ``)."""

        def read(d: Dialect, c: Any) -> list[tuple[int, str]]:
            rows = d.execute(c, "TERMS_AFTER", {"election": name, "fence": fence}, answer=Answer.ROWS)
            return [(int(f), str(leader)) for f, leader in rows]

        return run_repeatable(self.alias, read, what=f"election {name!r} reading its terms")

    def wake_observers(self, channel: str) -> None:
        """Wake an election's observers now (PostgreSQL: NOTIFY; elsewhere they poll, and
        nothing is sent)."""
        if "TERM_WAKE" not in lease_connection(self.alias).dialect.sql:
            return

        def wake(d: Dialect, c: Any) -> None:
            d.execute(c, "TERM_WAKE", {"channel": channel}, answer=Answer.ROWS)

        run_repeatable(self.alias, wake, what="waking an election's observers")
