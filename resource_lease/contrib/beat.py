"""Celery beat on every server: only the elected leader sends, and the schedule travels with it.

    celery -A proj beat -S resource_lease.contrib.beat:LeaderScheduler
    # or in settings: CELERY_BEAT_SCHEDULER = "resource_lease.contrib.beat:LeaderScheduler"

Run beat on every server. Each one campaigns in an ``Election`` (the database's row
``@election``/``celery-beat:<app name>``); the leader sends the due tasks, the others stand by
and try again at least every second; a beat standing by logs so, naming who leads (at once,
then whenever the leader changes). The schedule's last-run times are the leadership's
hand-over state: the leader stores an entry's new last-run time (a fenced write) *before*
sending it, and a new leader starts from the stored times. So a new leader neither sends
again what the old one sent, nor skips what fell due while nobody led: that is sent as soon
as it leads, at most ttl + 1 s late (once, as beat does after any restart). A leader killed
between storing a run and sending it loses that one run: at most once, never twice.

Settings (Celery's, so ``CELERY_BEAT_LEADER_TTL`` etc. in Django settings with the CELERY
namespace): ``beat_leader_ttl`` (seconds; default ``RESOURCE_LEASE["TTL"]``): a dead leader
is replaced within ttl + 1 s; ``beat_leader_name`` (default ``"celery-beat:<app.main>"``):
beats sharing a name share one leader; ``beat_leader_database``: the database alias
(default ``RESOURCE_LEASE["DATABASE"]``).
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
from typing import TYPE_CHECKING, Any

from celery.beat import Scheduler
from celery.utils.time import maybe_make_aware

from resource_lease.exceptions import LeaseError, LeaseLost

if TYPE_CHECKING:
    from resource_lease.lease import Lease
    from resource_lease.recipes.election import Election

logger = logging.getLogger("resource_lease.beat")

#: The most seconds a closing scheduler waits for its resignation (``resign_within``).
RESIGN_WAIT = 10.0


def resign_within(election: Election, seconds: float) -> None:
    """``election.resign()`` on a thread of its own, waited for at most ``seconds``.

    ``celery beat`` closes the scheduler from its SIGTERM handler, which runs on the main
    thread wherever the signal found it: possibly inside a lock the resignation needs (a
    statement of the scheduler's own, a signal's receivers). Resigning on that thread could
    then wait for ever; on another, it waits for the interrupted frame at worst until the
    timeout, and the leadership ends by its ttl instead (as the SIGTERM handler of
    ``resource_lease.shutdown`` gives back on a thread of its own)."""
    from resource_lease.shutdown import within  # here, not at import: Django is set up by now (_django_ready)

    if not within(election.resign, seconds, "resource-lease-beat-resign", daemon=True):
        logger.warning(
            "beat: resigning %r took longer than %gs; the leadership ends by its ttl", election.name, seconds
        )


def _django_ready() -> None:
    """beat may load the scheduler before Django is set up (a plain Celery app)."""
    from django.apps import apps

    if not apps.ready:
        import django

        django.setup()


class LeaderScheduler(Scheduler):
    """A beat scheduler that sends only while it leads its election (see the module's doc)."""

    #: Longest pause (seconds) between two attempts of a beat that is not the leader.
    standby_interval = 1.0
    #: Seconds between two looks, by a standing-by beat, at who leads (logged when it changes).
    standby_report_interval = 30.0

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self.election: Election | None = None
        self._leading: Lease | None = None
        self._retry_at = 0.0
        self._next_report = 0.0
        self._reported: tuple[str | None] | None = None
        super().__init__(app, *args, **kwargs)

    # -- set-up ------------------------------------------------------------------------

    def setup_schedule(self) -> None:
        _django_ready()
        from resource_lease.conf import lease_settings
        from resource_lease.recipes.election import Election

        super().setup_schedule()
        conf = self.app.conf
        ttl = conf.get("beat_leader_ttl")
        self.election = Election(
            conf.get("beat_leader_name") or f"celery-beat:{self.app.main or 'celery'}",
            ttl=float(lease_settings.TTL if ttl is None else ttl),
            using=conf.get("beat_leader_database"),
        )
        self.standby_interval = min(self.standby_interval, float(lease_settings.BACKOFF_MAX))

    @property
    def info(self) -> str:
        # One line of the banner's "Configuration" list: Celery prints it as it is, between
        # "    . scheduler -> ..." and "    . logfile -> ...", so it carries their indent.
        election = self.election
        if election is None:
            return "    . leader election -> (not set up)"
        return (
            f"    . leader election -> {election.name!r} as {election.holder!r}"
            f" (ttl {election.ttl:g}s, db {election.using!r})"
        )

    # -- the loop ------------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass: while leader, beat's own tick (send what is due); else stand by."""
        wait = self._retry_at - time.monotonic()
        if wait > 0:
            return wait
        if not self._lead():
            return random.uniform(0.5, 1.0) * self.standby_interval
        interval: float = super().tick(*args, **kwargs)
        return interval

    def _lead(self) -> bool:
        """Whether we lead now; campaigns once (one statement) if we do not."""
        assert self.election is not None
        lease = self._leading
        if lease is not None:
            try:
                lease.check()
                return True
            except LeaseLost as exc:
                logger.warning("beat: no longer the leader of %r: %s", self.election.name, exc)
                self._leading = None
                self._reported = None
        try:
            lease = self.election._grant_once(auto_renew=True)
        except LeaseError as exc:
            logger.warning("beat: campaigning for %r failed: %s", self.election.name, exc)
            return False
        if lease is None:
            self._standing_by()
            return False
        self._reported = None
        self._take_over(lease)
        return True

    def _standing_by(self) -> None:
        """Say that this beat stands by and who leads: at once, then when the leader changes
        (looked at every ``standby_report_interval`` seconds, one indexed read)."""
        assert self.election is not None
        now = time.monotonic()
        if self._reported is not None and now < self._next_report:
            return
        self._next_report = now + self.standby_report_interval
        try:
            leader = self.election.leader()
        except LeaseError as exc:
            logger.warning("beat: reading who leads %r failed: %s", self.election.name, exc)
            return
        if self._reported == (leader,):
            return
        self._reported = (leader,)
        logger.info(
            "beat: standing by: %s leads %r; this beat (%s) sends nothing until it leads",
            leader if leader is not None else "nobody (the leadership is changing hands)",
            self.election.name,
            self.election.holder,
        )

    def _take_over(self, lease: Lease) -> None:
        """Start from the schedule the previous leader stored, and store it at once (with
        entries it never had), so the next leader starts from the same times."""
        assert self.election is not None
        self._load(lease.resource.data or {})
        self._leading = lease
        logger.info(
            "beat: leading %r (fence %d); sending from now on, from the stored schedule",
            self.election.name,
            lease.fence,
        )
        self._store()

    def _load(self, state: dict[str, Any]) -> None:
        stored = state.get("entries") or {}
        for name, entry in self.schedule.items():
            saved = stored.get(name)
            if not saved:
                continue
            entry.last_run_at = maybe_make_aware(dt.datetime.fromisoformat(saved["last_run_at"]))
            entry.total_run_count = int(saved.get("total_run_count", 0))
        self._heap = None  # re-sorted from these times on the next tick

    def _state(self) -> dict[str, Any]:
        return {
            "entries": {
                name: {"last_run_at": entry.last_run_at.isoformat(), "total_run_count": entry.total_run_count}
                for name, entry in self.schedule.items()
                if entry.last_run_at is not None  # beat sets it when it makes an entry
            }
        }

    def _store(self) -> bool:
        """Store the schedule as the hand-over state (fenced); False if we may not send."""
        assert self.election is not None
        lease = self._leading
        if lease is None:
            return False
        try:
            self.election.save_state(self._state())
            return True
        except LeaseLost as exc:
            logger.warning("beat: no longer the leader of %r, not sending: %s", self.election.name, exc)
            self._leading = None
        except LeaseError as exc:
            # The database is away: send nothing we could not record, and go back to the
            # last stored times, so what is due stays due and is sent once it is recorded.
            logger.error("beat: storing the schedule of %r failed, not sending: %s", self.election.name, exc)
            self._load(lease.resource.data or {})
            self._retry_at = time.monotonic() + self.standby_interval
        return False

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        # beat's tick has just moved the entry's last run to now (reserve): record that
        # before sending, so no successor sends this run again.
        if self._store():
            super().apply_entry(entry, producer=producer)

    def close(self) -> None:
        """On a clean shutdown, hand leadership over at once instead of after the ttl."""
        try:
            super().close()
        finally:
            if self.election is not None and self._leading is not None:
                self._leading = None
                resign_within(self.election, RESIGN_WAIT)
