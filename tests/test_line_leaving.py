"""A waiter's grant and its leaving of the line: on PostgreSQL one statement does both
(``db/postgresql.py``'s ``LEAVING_LINE``: one commit flush per hand-off, not two), and only
if it granted; elsewhere the waiter leaves after its grant (``LEAVE_LINE``). On every backend,
once the wait is over the place is gone and a refused grant kept it.

Negative control: a leaving that does not depend on the grant (the DELETE without its
``EXISTS (SELECT 1 FROM g)``) drops the place of a waiter whose grant was refused, which the
same check catches: the waiter would have left the line without being served."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from resource_lease import lock
from resource_lease.db.connections import lease_connection
from resource_lease.db.line import BY_NAME, Ask, Turn
from resource_lease.db.operations import ops
from resource_lease.models import Waiter
from resource_lease.recipes.locks import LOCK_KIND

pytestmark = pytest.mark.django_db(transaction=True)


def _enter(kind: str, name: str, holder: str) -> int:
    return ops("default").line.enter_line(kind, name, holder=holder, priority=0, where=None, ttl=30)


def _grant(kind: str, name: str, holder: str, place: int) -> Any:
    o = ops("default")
    row, _ = o.grant(Ask(kind, holder, 30, rows=BY_NAME, name=name), Turn(place=place))
    return row


def _places(*ids: int) -> int:
    return Waiter.objects.filter(id__in=ids).count()


@pytest.mark.parametrize("variant", ["engine", "negative-control"])
def test_a_waiters_grant_leaves_its_place_only_if_it_granted(
    variant: str, monkeypatch: pytest.MonkeyPatch, make_pool: Callable[..., Any]
) -> None:
    dialect = lease_connection("default").dialect
    if variant == "negative-control":
        if not dialect.line.leaving:
            pytest.skip(f"{connection.vendor} leaves the line after the grant (no leaving form to break)")
        broken = {key: sql.replace(" AND EXISTS (SELECT 1 FROM g)", "") for key, sql in dialect.line.leaving.items()}
        assert broken != dialect.line.leaving
        monkeypatch.setattr(dialect.line, "leaving", broken)
    held = lock("leaving", ttl=300, timeout=0)
    first = _enter(LOCK_KIND, "leaving", "first")
    second = _enter(LOCK_KIND, "leaving", "second")
    # The first waiter's try while the lock is held: refused, and its place is kept.
    refused = _grant(LOCK_KIND, "leaving", "first", first)
    kept = _places(first)
    assert held.release()
    # Its try once the lock is free: granted; the second waiter is still in line.
    granted = _grant(LOCK_KIND, "leaving", "first", first)
    left_by_grant = _places(first) == 0
    second_kept = _places(second)
    ops("default").line.leave_line(first)  # the waiter's own leaving, as Waiting.cleanup does
    ops("default").line.leave_line(second)
    checks = {
        "refused while held": refused is None,
        "refused grant kept its place": kept == 1,
        "granted once free": granted is not None,
        "the other waiter kept its place": second_kept == 1,
        "the grant itself left the line where the vendor can": left_by_grant == bool(dialect.line.leaving),
        "no place left after leaving": _places(first, second) == 0,
    }
    failed = [what for what, ok in checks.items() if not ok]
    if variant == "engine":
        assert not failed, failed
    else:
        # The place dropped with the refusal: the waiter is out of the line, and its next
        # try (as a place no longer live) is refused too.
        assert "refused grant kept its place" in failed, failed


def test_the_leaving_forms_are_those_of_the_grant_statements() -> None:
    """PostgreSQL renders a leaving form of each grant a waiter runs (with and without a
    where= filter, with and without a target), each the line form of the grant with the place's DELETE after it."""
    dialect = lease_connection("default").dialect
    if connection.vendor != "postgresql":
        assert dialect.line.leaving == {}
        return
    names = {name for name, _, _ in dialect.line.leaving}
    assert names == {"ACQUIRE_SCAN", "GRANT_BY_ID", "GRANT_BY_NAME", "GRANT_SAMPLED", "RW_READ", "RW_WRITE"}
    for (name, filtered, targeted), sql in dialect.line.leaving.items():
        assert dialect.forms[True, filtered, targeted][name] in sql
        assert sql.endswith("AND EXISTS (SELECT 1 FROM g) RETURNING id) SELECT g.*, (SELECT COUNT(*) FROM gone) FROM g")


@pytest.mark.parametrize("variant", ["engine", "negative-control"])
def test_a_place_gone_while_its_grant_is_tried_is_lost_only_if_the_grant_failed(variant: str) -> None:
    """On PostgreSQL the grant deletes the place as it commits, a moment before the waiter
    stops renewing it: a renewal in between finds the place gone. The place is judged lost
    (expired: the waiter takes a new one) only if the grant it was tried with failed.
    Simulated on every backend: the place's row deleted while ``attempting``. Negative control:
    a place that does not defer (``attempting`` never set) is lost even when served."""
    from resource_lease import line as line_module
    from resource_lease.exceptions import LeaseLost
    from resource_lease.line import places
    from resource_lease.line.wakeups import Waker
    from resource_lease.renewal import renewer

    outcomes = {}
    for granted in (True, False):
        line = line_module.Line("default", LOCK_KIND, f"gone-{granted}")
        place = places.enter(line, holder="w", priority=0, where=None, ttl=30, waker=Waker())
        renewer().discard(place)  # this test renews by hand
        place.attempting = variant == "engine"
        Waiter.objects.filter(id=place.id).delete()  # as a granting LEAVING_LINE does
        with pytest.raises(LeaseLost):
            place.renew()
        place.attempted(granted=granted)
        outcomes[granted] = place.lost
        ops("default").line.leave_line(place.id)
    checks = {"served: not lost": outcomes[True] is False, "refused: lost": outcomes[False] is True}
    failed = [what for what, ok in checks.items() if not ok]
    if variant == "engine":
        assert not failed, failed
    else:
        assert failed == ["served: not lost"], failed
