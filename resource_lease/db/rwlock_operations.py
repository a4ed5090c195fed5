"""``ReaderOperations``: what a read grant of an rwlock (``db/rwlock.py``'s statements) renews,
checks and releases with; its grant is an ``Ask`` to ``READ`` (``Operations.grant``), settled by
its token as every grant is.

A read grant's release is never run twice: a second run would count another reader of the
period out and could let a writer in while that reader holds. An answer lost with the
connection is left unknown (False); the read period then lasts until its expiry.
"""

from __future__ import annotations

import datetime as dt
import logging

from resource_lease.db.connections import Disconnected, run, run_repeatable
from resource_lease.db.operations import Operations

logger = logging.getLogger("resource_lease")


class ReaderOperations(Operations):
    """``Operations`` whose renew, is_held and release are a read grant's (``RW_READ_*``):
    the grant is known by the row and its fence (the holder is not on the row: the last
    reader's is)."""

    def renew(self, *, pk: int, holder: str, fence: int, ttl: float) -> dt.datetime | None:
        """Keep a live read grant (repeatable: it only pushes the period's expiry); the
        period's expiry, or None if the grant is gone."""
        return run_repeatable(
            self.alias,
            lambda d, c: d.rw.read_renew(c, pk=pk, fence=fence, ttl=ttl),
            what=f"renewing read grant {fence}",
        )

    def is_held(self, *, pk: int, holder: str, fence: int) -> bool:
        return run_repeatable(
            self.alias, lambda d, c: d.rw.read_is_held(c, pk=pk, fence=fence), what=f"checking read grant {fence}"
        )

    def release(self, *, pk: int, holder: str, fence: int) -> bool:
        """Give a read grant back: True if it was live. Run once (see the module's docstring)."""
        try:
            return run(
                self.alias, lambda d, c: d.rw.read_release(c, pk=pk, fence=fence), what=f"releasing read grant {fence}"
            )
        except Disconnected as exc:
            logger.warning("connection lost releasing read grant %s; it ends with its read period: %s", fence, exc)
            return False

    def release_to_line(self, *, pk: int, holder: str, fence: int) -> tuple[bool, int]:
        """A read grant's release hands nothing to a place in line (``release``)."""
        return self.release(pk=pk, holder=holder, fence=fence), 0


_reader_ops: dict[str, ReaderOperations] = {}


def reader_ops(alias: str) -> ReaderOperations:
    """The read grants' operations on ``alias`` (one object per alias)."""
    found = _reader_ops.get(alias)
    if found is None:
        found = _reader_ops[alias] = ReaderOperations(alias)
    return found


__all__ = ["ReaderOperations", "reader_ops"]
