"""The line of waiters' named operations (``db/line.py``'s statements), a part of
``db.operations.Operations``: ``ops(using).line.enter_line(...)``, ``.look(...)``, ...

Taking a place is settled by its token when the connection is lost (a second place would
stand behind the first and block it: docs/pitfalls.md#unknown-outcome); everything else is
repeated.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from resource_lease.db.base import Row
from resource_lease.db.connections import Disconnected, run, run_repeatable
from resource_lease.db.line import Look, Turn, WaiterRow


@dataclass(frozen=True)
class LineOperations:
    """The line's operations on ``alias`` (see the module's docstring)."""

    alias: str

    def enter_line(
        self,
        kind: str,
        name: str,
        *,
        holder: str,
        priority: int,
        where: str | None,
        ttl: float,
        target: str = "",
        shared: bool = False,
        mark: bool = True,
        channel: str = "",
        grant_ttl: float = 0.0,
        token: str | None = None,
    ) -> int:
        """Take a place at the back of the line (kind, name) for ``ttl`` seconds, the line's
        rows marked first if ``mark``; its id (``target``: rows cooling down for it do not
        serve it; ``shared``: a reader of an rwlock; ``channel``:
        where its process hears its turn, PostgreSQL; ``grant_ttl``: the ttl of a grant a
        release may hand it, ``LineStatements.hands_off``; ``token``: the place's token, random if
        not given, under which a handed grant is held)."""
        what = f"taking a place in line {kind}:{name}" if name else f"taking a place in line {kind}"

        def enter(d: Any, c: Any) -> int:
            return d.line.enter_line(  # type: ignore[no-any-return]
                c,
                kind=kind,
                name=name,
                holder=holder,
                priority=priority,
                where=where,
                token=place_token,
                ttl=ttl,
                target=target,
                shared=shared,
                mark=mark,
                channel=channel,
                grant_ttl=grant_ttl,
            )

        place_token = token or secrets.token_hex(16)
        try:
            return run(self.alias, enter, what=what)
        except Disconnected:
            found = run_repeatable(
                self.alias, lambda d, c: d.line.find_place(c, token=place_token), what=f"settling: {what}"
            )
            if found is not None:
                return found
            # The insert never committed (the statement never reached the server): once more,
            # under the same token, which that insert never took.
            return run_repeatable(self.alias, enter, what=what)

    def renew_place(
        self, place: int, *, kind: str, name: str, where: str | None, ttl: float, mark: bool = True
    ) -> bool:
        """Keep a live place of the line (kind, name) ``ttl`` seconds more, and (``mark``) the
        line's rows marked; False if it had expired (it is lost)."""
        return run_repeatable(
            self.alias,
            lambda d, c: d.line.renew_place(c, kind=kind, name=name, where=where, place=place, ttl=ttl, mark=mark),
            what=f"keeping place {place} in line",
        )

    def claim_handed(self, kind: str, *, token: str, pk: int = 0) -> tuple[Row, float] | None:
        """The live grant a release handed to the place whose token is ``token`` (the row
        ``pk`` if known), with its seconds left by the database's clock; None if none (a read:
        repeatable)."""
        return run_repeatable(
            self.alias,
            lambda d, c: d.line.claim_handed(c, kind=kind, token=token, pk=pk),
            what=f"reading a grant handed in line {kind}",
        )

    def leave_line(self, place: int) -> bool:
        """Leave the line; whether the place was there to delete (repeated after a lost
        answer, a place the first run deleted reads as not there)."""
        return run_repeatable(
            self.alias, lambda d, c: d.line.leave_line(c, place=place), what=f"leaving line (place {place})"
        )

    def pass_turn(self, kind: str, name: str) -> None:
        """Tell the first waiters of the line (kind, name) that it may be their turn
        (PostgreSQL; elsewhere they look): a turn its waiter did not take, passed on."""
        run_repeatable(
            self.alias, lambda d, c: d.line.pass_turn(c, kind=kind, name=name), what=f"passing a turn in line {kind}"
        )

    def purge_line(self, kind: str, name: str) -> None:
        """Drop the line's expired places (dead or paused waiters)."""
        run_repeatable(self.alias, lambda d, c: d.line.purge_line(c, kind=kind, name=name), what=f"purging line {kind}")

    def purge_lines(self) -> int:
        """Drop every line's expired places (lines nobody enters again too); how many."""
        return run_repeatable(self.alias, lambda d, c: d.line.purge_lines(c), what="purging the lines")

    def look(
        self, kind: str, name: str, *, turn: Turn, where: str | None, target: str = "", shared: bool = False
    ) -> Look:
        """A waiter's look at its line (reads only; ``target``: the waiter's, '' for none;
        ``shared``: as a reader of an rwlock)."""
        return run_repeatable(
            self.alias,
            lambda d, c: d.line.look(c, kind=kind, name=name, turn=turn, where=where, target=target, shared=shared),
            what=f"looking at line {kind}",
        )

    def line_waiters(self, kind: str, name: str, *, limit: int) -> list[WaiterRow]:
        """The first ``limit`` live places of the line, in the order of service."""
        return run_repeatable(
            self.alias,
            lambda d, c: d.line.line_waiters(c, kind=kind, name=name, limit=limit),
            what=f"reading line {kind}",
        )
