"""A double barrier whose cohort is frozen when it opens: the same ``index``/``size`` for all.

Rows (kinds behind the reserved prefix):

- ``@barrier:<name>``: one row per member that is waiting or inside, named by the member.
  Being there is a live lease on that row, renewed in the background, so a member that dies
  stops counting ttl later, with nobody cleaning up.
- ``@barrier-control``, row ``<name>``: the barrier's state, ``{"round": n, "cohort":
  [[member, fence], ...], "size": k}``. It is only ever written by whoever holds a short
  lease of that row, with a fenced write: the cohort is formed (and a member withdrawn after a
  timeout) under that lease, so two members can never form two cohorts, and every member
  reads the same frozen list.

A round: members take their rows and wait. When the previous cohort is done (none of its
members' grants is live any more: they left, or died and expired) and at least ``size``
members are waiting, one of them takes the control lease, reads everything again, freezes
the ``size`` earliest arrivals (sorted by name) as the next cohort and writes it. Each member
finds itself (its name and the fence of its grant) in the cohort: ``index`` is its position,
``size`` the cohort's length. ``leave()`` gives the row back and waits until no member of the
cohort holds its grant any more. A member that arrives while a cohort is inside is not part of
it: it waits for the next round.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from resource_lease import named
from resource_lease.backoff import wait_for
from resource_lease.doorbell import Doorbell
from resource_lease.exceptions import BarrierTimeout, LeaseError, MemberTaken, OutcomeUnknown
from resource_lease.lease import Lease
from resource_lease.models import Resource
from resource_lease.recipes.groups import check_member, member_row
from resource_lease.validation import Options, check_name, check_timeout, resolve_using

logger = logging.getLogger("resource_lease")

CONTROL_KIND = named.row_kind("barrier-control")


def member_kind(name: str) -> str:
    return named.row_kind("barrier", name)


def cohort_of(state: dict[str, Any]) -> list[tuple[str, int]]:
    """The frozen cohort in a control row's data: ``[(member, fence), ...]`` sorted by name."""
    return [(str(m), int(f)) for m, f in state.get("cohort") or []]


def inside(cohort: list[tuple[str, int]], snapshot: named.Snapshot) -> list[str]:
    """The members of ``cohort`` whose grant (the one the cohort froze) is still live."""
    still = []
    for member, fence in cohort:
        row = snapshot.live(member)
        if row is not None and row.fence == fence:
            still.append(member)
    return still


def read_state(using: str, name: str) -> dict[str, Any]:
    """The control row's data (empty before the first round)."""
    row = named.read(using, CONTROL_KIND, [name]).rows.get(name)
    return dict(row.data) if row is not None and isinstance(row.data, dict) else {}


def _check_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"size must be an integer >= 1, got {value!r}")
    return value


class DoubleBarrier:
    """``enter()`` blocks until ``size`` live members are inside at once and returns the
    cohort; ``leave()`` blocks until all of the cohort has left. Reusable by name.

    After ``enter()``: ``cohort`` (sorted member names), ``index`` (ours in it), ``size``
    (its length) and ``round`` are the same view for every member of the cohort.
    """

    def __init__(
        self,
        name: str,
        size: int,
        *,
        ttl: float | None = None,
        member: str | None = None,
        using: str | None = None,
    ) -> None:
        self.name = check_name(name, "name")
        self.requested_size = _check_size(size)
        self.options = Options.of(ttl=ttl, using=using)
        self.ttl, self.using = self.options.ttl, self.options.using
        self.member = check_member(member)
        self.kind = member_kind(self.name)
        # Our place: the member row, renewed by the keeper while we wait and while inside.
        self._row = member_row(self, "barrier")
        self.holder = self._row.holder
        self.size = self.requested_size
        self.index = -1
        self.round = 0
        self.cohort: list[str] = []
        self._frozen: list[tuple[str, int]] = []
        self._lease: Lease | None = None
        self._lock = threading.Lock()
        # Rung at every change a member may wait for (one inside, a cohort formed, one left).
        self._bell = Doorbell(self.using, "barrier", self.name)

    def __repr__(self) -> str:
        return f"<DoubleBarrier {self.name!r} member={self.member!r} round={self.round} index={self.index}>"

    # -- enter -----------------------------------------------------------------------

    def enter(self, timeout: float | None = None) -> list[str]:
        """Wait until ``size`` live members are inside at once; return the cohort (sorted names).

        ``BarrierTimeout`` after ``timeout`` seconds (None: wait for ever), with this member
        withdrawn (its row given back); a cohort formed with us before the withdrawal is
        honoured instead (``enter`` then returns it).
        """
        wait = check_timeout(timeout)
        self.options.refuse_in_transaction("DoubleBarrier.enter()")
        with self._lock:
            if self._lease is not None:
                raise LeaseError(f"{self!r} is already inside (or waiting): leave() first")
            self._lease = _PENDING
        try:
            with self._bell.listening() as sleep:
                found = self._enter(wait, sleep)
        except BaseException:
            # Nothing left behind: a row taken before the failure is given back.
            taken, self._lease = self._lease, None
            if taken is not None and taken is not _PENDING:
                try:
                    self._row.give_back()
                    self._bell.ring()
                except LeaseError:
                    logger.exception("barrier %r: giving back %r failed; it expires by itself", self.name, taken)
            raise
        self._frozen = found[1]
        self.round = found[0]
        self.cohort = [m for m, _ in found[1]]
        self.size = len(self.cohort)
        self.index = self.cohort.index(self.member)
        return list(self.cohort)

    def _enter(self, wait: float | None, sleep: Callable[[float], None]) -> tuple[int, list[tuple[str, int]]]:
        """``enter``'s wait: our row, then the cohort (woken by the bell, ``sleep``)."""
        started = time.monotonic()
        lease = wait_for(self._take, timeout=wait)
        if lease is None:
            row = named.read(self.using, self.kind, [self.member]).live(self.member)
            raise MemberTaken(
                f"member {self.member!r} of barrier {self.name!r} is held by another live process"
                f" ({row.holder if row else '?'})",
                member=self.member,
                holder=row.holder if row else "",
            )
        self._lease = lease
        self._bell.ring()  # one more inside: a member that waits for us may form the cohort
        left = None if wait is None else max(0.0, wait - (time.monotonic() - started))
        found = wait_for(self._attempt, timeout=left, sleep=sleep)
        if found is None:
            found = self._withdraw()
            if found is None:
                raise BarrierTimeout(
                    f"barrier {self.name!r}: {self.requested_size} members were not inside at once within"
                    f" {wait:g}s; {self.member!r} withdrew"
                )
        return found

    def _take(self) -> Lease | None:
        return self._row.take()

    def _ours_in(self, state: dict[str, Any]) -> tuple[int, list[tuple[str, int]]] | None:
        assert self._lease is not None and self._lease is not _PENDING
        cohort = cohort_of(state)
        if (self.member, self._lease.fence) in cohort:
            return int(state.get("round", 0)), cohort
        return None

    def _attempt(self) -> tuple[int, list[tuple[str, int]]] | None:
        """One look: are we in the frozen cohort? If not, and a cohort can be formed, form it."""
        found = self._ours_in(read_state(self.using, self.name))
        if found is not None:
            return found
        assert self._lease is not None
        if self._lease.lost or not self._lease.remaining():
            # Our wait outlived our grant (a pause): take the row again, as a new arrival.
            self._row.give_back()
            retaken = self._take()
            if retaken is not None:
                self._lease = retaken
            return None
        return self._form()

    def _form(self) -> tuple[int, list[tuple[str, int]]] | None:
        """Form the next cohort if the last one is done and enough members wait; under the
        control row's lease, from a fresh read, written fenced."""
        members = named.read(self.using, self.kind)
        state = read_state(self.using, self.name)
        waiting = [n for n in members.live_names() if (n, members.rows[n].fence) not in cohort_of(state)]
        if inside(cohort_of(state), members) or len(waiting) < self.requested_size:
            return None  # cheap pre-check: nothing to form (decided again under the lease)
        control = named.try_grant(self.using, CONTROL_KIND, self.name, holder=self.holder, ttl=self.ttl)
        if control is None:
            return None  # someone else is forming (or withdrawing)
        try:
            state = dict(control.resource.data) if isinstance(control.resource.data, dict) else {}
            found = self._ours_in(state)
            if found is not None:
                return found
            members = named.read(self.using, self.kind)
            previous = cohort_of(state)
            if inside(previous, members):
                return None
            rows = [members.rows[n] for n in members.live_names() if (n, members.rows[n].fence) not in previous]
            if len(rows) < self.requested_size:
                return None
            rows.sort(key=lambda r: (r.acquired_at or members.now, r.name))
            chosen = sorted((r.name, r.fence) for r in rows[: self.requested_size])
            new = {
                "round": int(state.get("round", 0)) + 1,
                "cohort": [list(c) for c in chosen],
                "size": len(chosen),
                "formed_at": members.now.isoformat(),
                "formed_by": self.member,
            }
            try:
                if not named.write_data(control, new):
                    return None
            except OutcomeUnknown:
                return None  # maybe formed: the members read the round from the control row
            logger.info("barrier %r: round %s formed: %s", self.name, new["round"], [c[0] for c in chosen])
            formed = self._ours_in(new)
        finally:
            control.release()
        self._bell.ring()  # the others of the cohort find it at once
        return formed

    def _withdraw(self) -> tuple[int, list[tuple[str, int]]] | None:
        """After a timeout: give our row back under the control lease, so no cohort can be
        formed with us in the meantime. A cohort that already has us is returned instead."""
        lease = self._lease
        assert lease is not None and lease is not _PENDING

        def take_control() -> Lease | None:
            return named.try_grant(self.using, CONTROL_KIND, self.name, holder=self.holder, ttl=self.ttl)

        control = wait_for(take_control, timeout=self.ttl + 1.0)
        try:
            if control is not None:
                state = dict(control.resource.data) if isinstance(control.resource.data, dict) else {}
                found = self._ours_in(state)
                if found is not None:
                    return found
            self._row.give_back()
            self._lease = None
            return None
        finally:
            if control is not None:
                control.release()
            self._bell.ring()

    # -- leave -----------------------------------------------------------------------

    def leave(self, timeout: float | None = None) -> None:
        """Leave the cohort and wait until every member of it has left (or died and its
        ttl ran out). ``BarrierTimeout`` after ``timeout`` seconds (we have left anyway)."""
        wait = check_timeout(timeout)
        with self._lock:
            lease = self._lease
            if lease is None or lease is _PENDING:
                raise LeaseError(f"{self!r} is not inside: enter() first")
            self._lease = None
        frozen, round_ = self._frozen, self.round

        def all_left() -> bool | None:
            state = read_state(self.using, self.name)
            if int(state.get("round", 0)) > round_:
                return True  # the next round formed: ours was done
            return True if not inside(frozen, named.read(self.using, self.kind)) else None

        with self._bell.listening() as sleep:
            self._row.give_back()
            self._bell.ring()  # one less inside: the last to leave lets the others go
            done = wait_for(all_left, timeout=wait, sleep=sleep)
        self.index = -1
        if done is None:
            still = inside(frozen, named.read(self.using, self.kind))
            raise BarrierTimeout(
                f"barrier {self.name!r}: round {round_} members still inside after {wait:g}s: {', '.join(still)}"
            )

    def __enter__(self) -> DoubleBarrier:
        self.enter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.leave()


#: Placeholder while ``enter`` takes its row (so a second enter from another thread is refused).
_PENDING: Any = object()


def barriers(using: str | None = None) -> list[dict[str, Any]]:
    """Every barrier's state for operators: round, cohort, who of it is inside, who waits
    (``using``: default the lease database, ``RESOURCE_LEASE["DATABASE"]``)."""
    using = resolve_using(using)
    result = []
    controls = {r.name: r for r in Resource.objects.using(using).filter(kind=CONTROL_KIND)}
    kinds = Resource.objects.using(using).filter(kind__startswith=member_kind("")).values_list("kind", flat=True)
    names = sorted(set(controls) | {k[len(member_kind("")) :] for k in kinds.distinct()})
    for name in names:
        row = controls.get(name)
        state = dict(row.data) if row is not None and isinstance(row.data, dict) else {}
        snapshot = named.read(using, member_kind(name))
        cohort = cohort_of(state)
        live_inside = inside(cohort, snapshot)
        result.append(
            {
                "name": name,
                "round": int(state.get("round", 0)),
                "size": state.get("size"),
                "cohort": [m for m, _ in cohort],
                "inside": live_inside,
                "waiting": [n for n in snapshot.live_names() if (n, snapshot.rows[n].fence) not in cohort],
                "formed_at": state.get("formed_at"),
            }
        )
    return result
