"""Which row ``acquire()`` tries: a probe of one free id by primary key, else the scan.

The scan (the dialect's ``acquire``: the first free row of the kind in the acquire index,
``SKIP LOCKED`` where the database has it) is always right, but it walks the front of the
``(kind, busy_before)`` index, which every grant and release rewrites, and on MySQL it needs
a join. A grant of one row by its primary key costs what any single-row UPDATE costs. So each
thread keeps, per kind, a sample of ids that were free when it last looked (a cache of ids,
refreshed every ``PROBE_REFRESH`` seconds), and an acquire first tries one of them, chosen at
random so that processes spread over the pool instead of meeting at its front.

The cache is a hint, never trusted for the decision: the probe is the same conditional
UPDATE as every grant (free by the database's clock, enabled, not quarantined; the
matched-row count decides a race) and the row is read back from the database, so a
quarantine, a disabled row or a new URL count at once. What the cache can delay is only
that a *new* resource is probed: up to ``PROBE_REFRESH`` seconds after it was added (the
scan, which runs whenever a probe misses, finds it at once).

Under scarcity most probes would miss (the sampled row was taken meanwhile), so each kind
keeps the fraction of recent probes that hit, and an acquire probes only with that
probability (never below ``MIN_PROBE_RATE``, so that the estimate follows when rows free up
again); otherwise it goes straight to the scan, which then also serves the least recently
used row first. With plenty of free rows a probe nearly always hits, and which free row is
granted is random, not least recently used.

A grant for a target (``acquire(target=...)``) probes the same sample with its own statement
(the row not cooling down for the target: ``OWN_TARGET``), and keeps a hit rate of its own per
target, since a row free for one site may be cooling down for another: its misses neither
teach the kind's rate nor take the row out of the sample the other targets probe.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time
from typing import Any

from resource_lease.conf import lease_settings
from resource_lease.db.base import Dialect, Row
from resource_lease.db.line import NEWCOMER, Ask, Turn
from resource_lease.models import Resource
from resource_lease.validation import where_matches

#: Rows sampled per kind (any free ones; on MySQL the least recently used): plenty to spread contenders,
#: small enough that refreshing the sample costs little on a pool of 100,000.
SAMPLE_SIZE = 256
#: Weight of the newest probe in the hit rate (an exponential moving average).
SMOOTHING = 0.1
#: Under scarcity, still probe this often, so the hit rate notices rows freeing up.
MIN_PROBE_RATE = 0.05
#: While at least this share of probes hits, an attempt probes up to ``PROBES`` sampled rows
#: before it scans (a miss costs a primary-key lookup; the scan walks the acquire index).
PLENTY = 0.5
PROBES = 3
#: Targets whose hit rates one thread keeps per kind (the oldest is forgotten past this).
TARGETS_KEPT = 256


#: The position of ``data`` in a lease table row (the model's column order).
_DATA = [f.attname for f in Resource._meta.concrete_fields].index("data")


def row_data(row: Row) -> Any:
    """A sampled row's payload (raw: JSON text on some vendors, decoded on others)."""
    value = row[_DATA]
    return json.loads(value) if isinstance(value, (str, bytes)) else value


class Clock:
    """The database's clock as of a read, carried forward on this machine's monotonic clock."""

    __slots__ = ("at", "read_at")

    def __init__(self, at: dt.datetime, read_at: float) -> None:
        self.at = at
        self.read_at = read_at

    def now(self) -> dt.datetime:
        """An estimate of the database's clock now (off by a round trip and by drift)."""
        return self.at + dt.timedelta(seconds=time.monotonic() - self.read_at)


class KindSample:
    """One thread's view of one kind: rows that were free, and how often probing them paid."""

    __slots__ = ("rows", "clock", "refresh_at", "hit_rate", "target_rates")

    def __init__(
        self, rows: list[Row], clock: Clock | None, refresh_at: float, hit_rate: float, target_rates: dict[str, float]
    ) -> None:
        self.rows = rows
        self.clock = clock
        self.refresh_at = refresh_at
        self.hit_rate = hit_rate
        #: Per target, how often its probes of these rows paid (see the module's docstring).
        self.target_rates = target_rates

    @property
    def ids(self) -> list[int]:
        return [row[0] for row in self.rows]


class Picker:
    """Per engine connection (so per thread and alias): the kinds' samples, and the grant of
    any free row. ``probes`` and ``probe_hits`` count what the probes did (for tests and
    benchmarks)."""

    def __init__(self) -> None:
        self.kinds: dict[str, KindSample] = {}
        self.probes = 0
        self.probe_hits = 0

    def sample(self, dialect: Dialect, cursor: Any, kind: str) -> KindSample:
        """The kind's sample, read again once it is ``PROBE_REFRESH`` seconds old."""
        entry = self.kinds.get(kind)
        now = time.monotonic()
        if entry is None or now >= entry.refresh_at:
            refresh = float(lease_settings.PROBE_REFRESH)
            rows: list[Row] = []
            clock = None
            if refresh > 0:
                rows, db_now = dialect.leases.free_rows(cursor, kind=kind, limit=SAMPLE_SIZE)
                clock = Clock(dialect.to_datetime(db_now), time.monotonic())
            entry = self.kinds[kind] = KindSample(
                rows,
                clock,
                now + refresh,
                1.0 if entry is None else entry.hit_rate,
                {} if entry is None else entry.target_rates,
            )
        return entry

    def grant_any(self, dialect: Dialect, cursor: Any, ask: Ask, *, token: str, turn: Turn = NEWCOMER) -> Row | None:
        """Grant any free row of the ``ask``'s kind that is the caller's ``turn`` in line (and
        matches its ``where``) under ``token``: probes while they are likely to pay, then the
        scan. Each is a conditional single statement under the same token and the first that
        grants ends the attempt, so a lost answer is settled by the token as before."""
        kind, where, target = ask.kind, ask.where, ask.target
        entry = self.sample(dialect, cursor, kind)
        if target:
            # The sample does not know the target's cooldowns: a miss may be a row free for
            # others, so it stays in the sample (probed from a copy) and teaches only the
            # target's own rate.
            rows = [row for row in entry.rows if where is None or where_matches(where, row_data(row))]
            rate = entry.target_rates.get(target, 1.0)
        else:
            rows = entry.rows if where is None else [row for row in entry.rows if where_matches(where, row_data(row))]
            rate = entry.hit_rate
        if rows and (rate >= PLENTY or random.random() < max(rate, MIN_PROBE_RATE)):
            for _ in range(PROBES if rate >= PLENTY else 1):
                i = random.randrange(len(rows))
                self.probes += 1
                row = dialect.leases.grant_sampled(
                    cursor, ask, sampled=rows[i], token=token, clock=entry.clock, turn=turn
                )
                if row is not None:
                    self.probe_hits += 1
                    rate += SMOOTHING * (1.0 - rate)
                else:
                    rate -= SMOOTHING * rate
                if target:
                    entry.target_rates.pop(target, None)  # the newest last: the oldest is forgotten first
                    entry.target_rates[target] = rate
                    if len(entry.target_rates) > TARGETS_KEPT:
                        del entry.target_rates[next(iter(entry.target_rates))]
                else:
                    entry.hit_rate = rate
                if row is not None:
                    return row
                sampled = rows[i]
                rows[i] = rows[-1]  # taken (or gone): not probed again until the next refresh
                rows.pop()
                if rows is not entry.rows and not target:
                    entry.rows.remove(sampled)
                if not rows:
                    break
        return dialect.leases.acquire(cursor, ask, token=token, turn=turn)
