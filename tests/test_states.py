"""The lease states written twice, as the engine's SQL (``Dialect``) and as the ORM's
``ResourceQuerySet``, select exactly the same rows on this database.

One pool holds a resource in every state, each put there by the engine itself (acquire,
release, quarantine, an expired grant never given back); the raw conditions run on the
engine's own connection and the QuerySet methods on Django's, both by the database's clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from resource_lease import acquire, pool
from resource_lease.db.base import Dialect
from resource_lease.db.connections import run_repeatable
from resource_lease.models import DISABLED, EXPIRED, FREE, HELD, QUARANTINED, Resource

pytestmark = pytest.mark.django_db(transaction=True)

KIND = "states"


def add(name: str, **fields: Any) -> Resource:
    return Resource.objects.create(kind=KIND, name=name, **fields)


def grant(name: str, ttl: float = 600) -> Any:
    """Lease the row ``name`` with the engine: it is the only free, never-leased row when asked."""
    add(name)
    lease = acquire(KIND, ttl=ttl, holder=f"holder-of-{name}")
    assert lease.resource.name == name
    return lease


@pytest.fixture
def every_state(transactional_db: None) -> dict[str, str]:
    """One resource per state, created one at a time so each grant takes the intended row;
    returns {name: the state ``with_state()`` must give it}."""
    expired = grant("expired-unreleased", ttl=1)
    quarantined_expired = grant("quarantined-expired-unreleased", ttl=1)
    assert pool.quarantine([quarantined_expired.resource], reason="probe failed", seconds=600) == 1
    expired_at = max(expired.expires_at, quarantined_expired.expires_at)
    grant("held")
    quarantined_held = grant("quarantined-while-held")
    assert pool.quarantine([quarantined_held.resource], reason="probe failed", seconds=600) == 1
    released_in_quarantine = grant("released-while-quarantined")
    pool.quarantine([released_in_quarantine.resource], reason="probe failed", seconds=600)
    assert released_in_quarantine.release() is True  # busy_before becomes the quarantine's end
    released = grant("free-released")
    assert released.release() is True
    add("free-never-leased")
    quarantined = add("quarantined")
    assert pool.quarantine([quarantined], reason="probe failed", seconds=600) == 1
    add("disabled", enabled=False)  # never leased: only ``enabled`` keeps it from a grant
    deadline = time.monotonic() + 30
    while pool.database_now() <= expired_at:  # by the database's clock, not ours
        assert time.monotonic() < deadline, "the 1 s grant did not expire within 30 s"
        time.sleep(0.2)
    return {
        "free-never-leased": FREE,
        "free-released": FREE,
        "held": HELD,
        "expired-unreleased": EXPIRED,
        "quarantined": QUARANTINED,
        "quarantined-while-held": QUARANTINED,
        "quarantined-expired-unreleased": QUARANTINED,
        "released-while-quarantined": QUARANTINED,
        "disabled": DISABLED,
    }


def sql_names(condition: Callable[[Dialect], str], params: tuple[Any, ...] = ()) -> set[str]:
    """Names of the rows of KIND matching a raw SQL condition, on the engine's connection."""

    def statement(dialect: Dialect, cursor: Any) -> list[Any]:
        p = dialect.placeholder
        cursor.execute(
            f"SELECT name FROM {dialect.table} WHERE kind = {p} AND ({condition(dialect)})",
            (KIND, *params),
        )
        return list(cursor.fetchall())

    return {row[0] for row in run_repeatable("default", statement, what="test_states")}


def dialect_free(dialect: Dialect) -> str:
    return dialect.free  # starts with "kind = %s": its parameter is given below


def orm(queryset: Any) -> set[str]:
    return set(queryset.filter(kind=KIND).values_list("name", flat=True))


def test_the_dialects_free_condition_and_the_querysets_free_select_the_same_rows(every_state) -> None:
    from_sql = sql_names(dialect_free, (KIND,))
    from_orm = orm(Resource.objects.free(KIND))
    assert from_sql == from_orm == {"free-never-leased", "free-released", "expired-unreleased"}
    # And with_state() calls exactly those rows free or expired (an expired grant is taken over).
    assert from_orm == {name for name, state in every_state.items() if state in (FREE, EXPIRED)}


def test_the_dialects_lease_condition_and_live_select_the_same_rows(every_state) -> None:
    live = orm(Resource.objects.live())
    assert live == {"held", "quarantined-while-held"}
    # Dialect.ours (renew, release, fenced writes) holds for a row exactly when live() has it.
    for row in Resource.objects.filter(kind=KIND):
        held = run_repeatable("default", is_held(row), what="test_states")
        assert held == (row.name in live), row.name


def is_held(row: Resource) -> Callable[[Dialect, Any], bool]:
    return lambda dialect, cursor: dialect.leases.is_held(cursor, pk=row.pk, holder=row.holder, fence=row.fence)


def test_expired_and_quarantined_and_with_state(every_state) -> None:
    # Filters, not the one state with_state() shows: an expired grant under a quarantine is in both.
    assert orm(Resource.objects.expired()) == {"expired-unreleased", "quarantined-expired-unreleased"}
    assert orm(Resource.objects.quarantined()) == {
        "quarantined",
        "quarantined-while-held",
        "quarantined-expired-unreleased",
        "released-while-quarantined",
    }
    states = dict(Resource.objects.with_state().filter(kind=KIND).values_list("name", "state"))  # type: ignore[misc]
    assert states == every_state
    assert states == dict(pool.with_state(Resource.objects.filter(kind=KIND)).values_list("name", "state"))  # type: ignore[misc]
    left = dict(Resource.objects.with_state().filter(kind=KIND).values_list("name", "time_left"))  # type: ignore[misc]
    assert {name for name, value in left.items() if value is not None} == {"held", "quarantined-while-held"}


def test_negative_control_a_free_condition_without_the_quarantine_is_caught(every_state) -> None:
    """The comparison must notice a condition that forgets one clause, or it proves nothing."""

    def broken(dialect: Dialect) -> str:
        clause = f" AND (quarantined_until IS NULL OR quarantined_until <= {dialect.now_sql})"
        assert clause in dialect.free
        return dialect.free.replace(clause, "")

    from_sql = sql_names(broken, (KIND,))
    assert from_sql != orm(Resource.objects.free(KIND))
    # The row whose grant expired under a quarantine decided while it was held: only the
    # quarantine clause keeps it from a grant.
    assert from_sql - orm(Resource.objects.free(KIND)) == {"quarantined-expired-unreleased"}


def test_negative_control_a_free_condition_without_enabled_is_caught(every_state) -> None:
    def broken(dialect: Dialect) -> str:
        clause = f" AND enabled = {dialect.true}"
        assert clause in dialect.free
        return dialect.free.replace(clause, "")

    assert sql_names(broken, (KIND,)) - orm(Resource.objects.free(KIND)) == {"disabled"}
