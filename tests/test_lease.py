"""acquire() and Lease: the contract of API.md, on the real database."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import transaction

from resource_lease import Lease, LeaseError, LeaseLost, NoResourceAvailable, acquire, pool
from resource_lease.line import stats as line_stats
from resource_lease.models import Resource
from resource_lease.renewal import renewer
from tests.late_answers import acquire_short


def snapshot() -> list[tuple[Any, ...]]:
    return list(Resource.objects.order_by("pk").values_list())


def test_acquire_grants_a_free_resource_with_a_fence_and_a_database_expiry(make_pool) -> None:
    make_pool("proxy", 2)
    before = pool.database_now()
    lease = acquire("proxy", ttl=30)
    assert isinstance(lease, Lease)
    assert lease.resource.kind == "proxy"
    assert lease.resource.data["url"].startswith("http://")
    assert lease.fence == 1
    assert lease.expires_at.tzinfo is not None
    assert before < lease.expires_at <= pool.database_now() + pool_timedelta(30)
    row = Resource.objects.get(pk=lease.resource.pk)
    assert (row.holder, row.fence, row.busy_before) == (lease.holder, 1, lease.expires_at)
    assert lease.is_held()


def pool_timedelta(seconds: float) -> Any:
    import datetime as dt

    return dt.timedelta(seconds=seconds)


def test_each_grant_gets_a_different_resource_until_none_is_free(make_pool) -> None:
    make_pool("proxy", 3)
    leases = [acquire("proxy", ttl=30) for _ in range(3)]
    assert len({lease.resource.pk for lease in leases}) == 3
    with pytest.raises(NoResourceAvailable) as info:
        acquire("proxy", ttl=30)
    assert info.value.exists is True
    assert isinstance(info.value, LeaseError)


def test_fence_only_goes_up(make_pool) -> None:
    make_pool("proxy", 1)
    fences = []
    for _ in range(5):
        lease = acquire("proxy", ttl=30)
        fences.append(lease.fence)
        assert lease.release() is True
    assert fences == [1, 2, 3, 4, 5]


def test_a_kind_without_resources_says_so_at_once(make_pool) -> None:
    make_pool("proxy", 1)
    started = time.monotonic()
    with pytest.raises(NoResourceAvailable, match="no resources of kind 'gpu'") as info:
        acquire("gpu", ttl=5, timeout=30)
    assert info.value.exists is False
    assert time.monotonic() - started < 15, "it waited for the timeout instead of saying so at once"


def test_a_kind_without_resources_names_a_few_kinds_that_exist(make_pool) -> None:
    from resource_lease import lock

    make_pool("proxy", 1)
    lock("not-a-pool", ttl=5).release()  # a coordination row ("@lock"): not a pool's kind
    with pytest.raises(NoResourceAvailable, match=r"no resources of kind 'proxi' \(kinds: proxy\)"):
        acquire("proxi", ttl=5)
    for kind in ("a1", "a2", "a3", "a4", "a5"):
        make_pool(kind, 1)
    with pytest.raises(NoResourceAvailable, match=r"\(kinds: a1, a2, a3, a4, a5, \.\.\.\)"):
        acquire("proxi", ttl=5)


def test_timeout_keeps_trying_until_a_resource_is_released(make_pool) -> None:
    make_pool("proxy", 1)
    first = acquire("proxy", ttl=30)
    threading.Timer(0.3, first.release).start()
    second = acquire("proxy", ttl=30, timeout=20)
    assert second.resource.pk == first.resource.pk
    assert second.fence == first.fence + 1


def test_timeout_gives_up_with_no_resource_available(make_pool) -> None:
    make_pool("proxy", 1)
    acquire("proxy", ttl=30)
    with pytest.raises(NoResourceAvailable, match="within 0.2s"):
        acquire("proxy", ttl=30, timeout=0.2)


def test_renew_extends_by_the_database_clock(make_pool) -> None:
    make_pool("proxy", 1)
    lease = acquire("proxy", ttl=5)
    first = lease.expires_at
    time.sleep(0.05)
    new = lease.renew(ttl=60)
    assert new == lease.expires_at > first
    assert Resource.objects.get(pk=lease.resource.pk).busy_before == new


def test_release_frees_and_a_second_release_is_false(make_pool) -> None:
    make_pool("proxy", 1)
    lease = acquire("proxy", ttl=30)
    assert lease.release() is True
    assert lease.release() is False
    assert not lease.is_held()
    assert acquire("proxy", ttl=30).fence == 2


def test_stale_holder_cannot_renew_or_release_the_new_holders_lease(make_pool) -> None:
    make_pool("proxy", 1)
    old = acquire_short("proxy", ttl=0.3, holder="old")
    time.sleep(0.5)
    new = acquire("proxy", ttl=30, holder="new")
    assert new.resource.pk == old.resource.pk and new.fence == old.fence + 1
    assert new.resource.took_over and new.resource.previous_holder == "old"
    before = snapshot()
    with pytest.raises(LeaseLost):
        old.renew()
    assert old.release() is False
    assert not old.is_held()
    assert snapshot() == before, "the stale holder changed the new holder's row"
    assert new.is_held()


def test_renew_after_expiry_is_refused_even_if_nobody_took_it(make_pool) -> None:
    make_pool("proxy", 1)
    lease = acquire_short("proxy", ttl=0.2)
    time.sleep(0.4)
    with pytest.raises(LeaseLost):
        lease.renew()
    assert lease.lost
    assert lease.release() is False


def test_check_raises_after_the_local_deadline(make_pool) -> None:
    make_pool("proxy", 1)
    lease = acquire_short("proxy", ttl=0.3)
    lease.check()
    assert 0 < lease.remaining() <= 0.3
    time.sleep(0.35)
    with pytest.raises(LeaseLost, match="local deadline"):
        lease.check()


def test_context_manager_releases_on_exit_and_on_error(make_pool) -> None:
    make_pool("proxy", 1)
    with acquire("proxy", ttl=30) as lease:
        assert lease.is_held()
    assert not lease.is_held()
    with pytest.raises(RuntimeError):
        with acquire("proxy", ttl=30) as lease:
            raise RuntimeError("boom")
    assert not lease.is_held()
    assert acquire("proxy", ttl=30).fence == 3


def test_auto_renew_keeps_the_lease_past_several_ttls(make_pool) -> None:
    make_pool("proxy", 1)
    # ttl 1.5 s: short enough to see several renewals, long enough that a loaded machine's
    # stall of a second does not lose the lease.
    with acquire("proxy", ttl=1.5, auto_renew=True) as lease:
        first_expiry = lease.expires_at
        time.sleep(4.5)  # three ttls
        assert lease.is_held()
        assert not lease.lost
        assert lease.expires_at > first_expiry
        lease.check()
        with pytest.raises(NoResourceAvailable):
            acquire("proxy", ttl=1)
    deadline = time.monotonic() + 5
    while renewer().thread is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert renewer().thread is None, "the renewal thread did not stop after the last release"


def test_on_lost_fires_once_when_the_row_is_taken_away(make_pool) -> None:
    make_pool("proxy", 1)
    calls: list[Lease] = []
    lease = acquire("proxy", ttl=0.9, auto_renew=True, on_lost=calls.append)
    assert pool.force_release([lease.resource]) == 1
    assert lease.lost_event.wait(timeout=10), "the renewal did not notice the lease was gone"
    time.sleep(0.7)
    assert calls == [lease]
    assert "refused" in lease.lost_reason
    with pytest.raises(LeaseLost):
        lease.check()


def test_auto_renewed_lease_that_is_garbage_collected_stops_renewing(make_pool) -> None:
    import gc

    make_pool("proxy", 1)
    acquire("proxy", ttl=0.6, auto_renew=True)  # dropped at once
    gc.collect()
    time.sleep(1.2)
    # Nobody renewed it: it expired and is free again.
    assert acquire("proxy", ttl=30).fence == 2


def test_a_grant_inside_a_transaction_survives_its_rollback_or_is_refused(make_pool) -> None:
    """Never a grant that the caller's rollback silently undoes: acquiring inside an outer
    atomic() either works on its own connection or refuses clearly."""
    from django.db import connection

    from resource_lease.db import dialect_class

    make_pool("proxy", 1)

    class Rollback(Exception):
        pass

    if dialect_class(connection.vendor).single_writer:
        before = snapshot()
        with transaction.atomic():
            with pytest.raises(LeaseError, match="open transaction"):
                acquire("proxy", ttl=30)
        assert snapshot() == before
        return
    with pytest.raises(Rollback):
        with transaction.atomic():
            lease = acquire("proxy", ttl=30)
            raise Rollback
    assert lease.is_held()
    assert Resource.objects.get(pk=lease.resource.pk).holder == lease.holder
    assert lease.release() is True


def test_quarantined_and_disabled_resources_are_never_granted(make_pool) -> None:
    resources = make_pool("proxy", 3)
    pool.quarantine([resources[0]], seconds=60, reason="bad gateway")
    Resource.objects.filter(pk=resources[1].pk).update(enabled=False)
    lease = acquire("proxy", ttl=30)
    assert lease.resource.pk == resources[2].pk
    with pytest.raises(NoResourceAvailable):
        acquire("proxy", ttl=30)
    assert pool.restore([resources[0]]) == 1
    assert acquire("proxy", ttl=30).resource.pk == resources[0].pk


def test_quarantine_of_a_held_resource_takes_effect_on_release(make_pool) -> None:
    make_pool("proxy", 1)
    lease = acquire("proxy", ttl=30)
    pool.quarantine([lease.resource], seconds=60, reason="slow")
    assert lease.is_held(), "quarantine must not take a live lease away"
    assert lease.release() is True
    with pytest.raises(NoResourceAvailable):
        acquire("proxy", ttl=30)
    row = pool.with_state(Resource.objects.all()).get()
    assert (row.state, row.quarantine_reason) == ("quarantined", "slow")


@pytest.mark.parametrize("order", ["quarantine, then force release", "force release, then quarantine"])
def test_force_release_of_a_quarantined_resource_cuts_its_holder_off(make_pool, order: str) -> None:
    """Regression: releasing a quarantined row leaves busy_before at the quarantine's end, in
    the future; the cut-off holder (same holder, same fence) must not count that as its lease."""
    make_pool("proxy", 1)
    lease = acquire("proxy", ttl=30)
    steps = [
        lambda: pool.quarantine([lease.resource], seconds=600, reason="bad exit IP"),
        lambda: pool.force_release([lease.resource]),
    ]
    for step in steps if order.startswith("quarantine") else steps[::-1]:
        assert step() == 1
    row = Resource.objects.get(pk=lease.resource.pk)
    assert (row.holder, row.fence, row.grant_token) == (lease.holder, lease.fence, "")
    assert row.busy_before > pool.database_now(), "the quarantine keeps busy_before in the future"
    assert not lease.is_held()
    with pytest.raises(LeaseLost):
        lease.renew()
    with pytest.raises(LeaseLost):
        with lease.fenced():
            pass
    assert lease.release() is False  # no longer ours: the operator gave it back
    assert Resource.objects.get(pk=row.pk).busy_before == row.busy_before, "the quarantine stands"
    with pytest.raises(NoResourceAvailable):
        acquire("proxy", ttl=30)


def test_holder_defaults_to_host_pid_thread(make_pool) -> None:
    import os
    import socket

    make_pool("proxy", 1)
    lease = acquire("proxy", ttl=30)
    assert lease.holder == f"{socket.gethostname()}:{os.getpid()}:{threading.current_thread().name}"


def test_concurrent_threads_never_share_a_resource(make_pool) -> None:
    make_pool("proxy", 3)
    held: dict[int, str] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(15):
            try:
                lease = acquire("proxy", ttl=30, timeout=20)
            except NoResourceAvailable as exc:
                errors.append(str(exc))
                continue
            with lock:
                if lease.resource.pk in held:
                    errors.append(f"{lease.resource.pk} held twice")
                held[lease.resource.pk] = threading.current_thread().name
            time.sleep(0.001)
            with lock:
                del held[lease.resource.pk]
            lease.release()

    handed_back = line_stats.handed_back
    threads = [threading.Thread(target=work) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # Every grant was one of the 75 acquisitions, or (PostgreSQL) a row a release handed to a
    # waiter whose own grant of another row went through a moment before, given back by it.
    assert (
        Resource.objects.get(name="proxy-0").fence
        + Resource.objects.get(name="proxy-1").fence
        + Resource.objects.get(name="proxy-2").fence
        == 75 + line_stats.handed_back - handed_back
    )


BAD_ACQUIRE = [
    ({"kind": ""}, "kind"),
    ({"kind": "   "}, "kind"),
    ({"kind": None}, "kind"),
    ({"kind": 7}, "kind"),
    ({"ttl": 0}, "ttl"),
    ({"ttl": -1}, "ttl"),
    ({"ttl": float("nan")}, "ttl"),
    ({"ttl": float("inf")}, "ttl"),
    ({"ttl": True}, "ttl"),
    ({"ttl": "30"}, "ttl"),
    ({"timeout": -0.5}, "timeout"),
    ({"timeout": float("nan")}, "timeout"),
    ({"timeout": "5"}, "timeout"),
    ({"timeout": False}, "timeout"),
    ({"holder": ""}, "holder"),
    ({"holder": 12}, "holder"),
    ({"holder": "x" * 256}, "holder"),
    ({"using": "nope"}, "using"),
    ({"auto_renew": 1}, "auto_renew"),
    ({"on_lost": "print"}, "on_lost"),
]


@pytest.mark.parametrize(("kwargs", "name"), BAD_ACQUIRE)
def test_bad_arguments_are_refused_by_name_and_nothing_is_written(make_pool, kwargs: dict[str, Any], name: str) -> None:
    make_pool("proxy", 2)
    before = snapshot()
    args = {"kind": "proxy", "ttl": 30} | kwargs
    kind = args.pop("kind")
    with pytest.raises(ValueError, match=name):
        acquire(kind, **args)
    assert snapshot() == before


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), True, "5"])
def test_renew_with_a_bad_ttl_is_refused_and_changes_nothing(make_pool, ttl: Any) -> None:
    make_pool("proxy", 1)
    lease = acquire("proxy", ttl=30)
    before = snapshot()
    with pytest.raises(ValueError, match="ttl"):
        lease.renew(ttl=ttl)
    assert snapshot() == before
    assert lease.is_held()


def test_bad_quarantine_arguments_are_refused_and_change_nothing(make_pool) -> None:
    import datetime as dt

    resources = make_pool("proxy", 1)
    before = snapshot()
    with pytest.raises(ValueError, match="until"):
        pool.quarantine(resources, reason="x", until=dt.datetime(2030, 1, 1))  # naive
    with pytest.raises(ValueError, match="seconds"):
        pool.quarantine(resources, reason="x", seconds=-5)
    with pytest.raises(ValueError, match="exactly one"):
        pool.quarantine(resources, reason="x")
    with pytest.raises(ValueError, match="reason"):
        pool.quarantine(resources, reason=None, seconds=5)  # type: ignore[arg-type]
    assert snapshot() == before


def test_mysql_engine_connections_count_matched_rows_whatever_client_flag_the_user_set(make_pool) -> None:
    """An OPTIONS["client_flag"] replaces Django's CLIENT.FOUND_ROWS. The engine's
    own connections must still count matched rows (and take several statements per query)."""
    from django.db import connection

    from resource_lease.db.connections import close_connections, run

    if connection.vendor != "mysql":
        pytest.skip("MySQL/MariaDB client flags")
    row = make_pool("proxy", 1)[0]
    options = connection.settings_dict.setdefault("OPTIONS", {})
    saved = dict(options)
    options["client_flag"] = 0
    close_connections()
    try:

        def same_value_twice(dialect: Any, cursor: Any) -> list[int]:
            cursor.execute(f"UPDATE {dialect.table} SET name = name WHERE id = %s; SELECT 1", (row.pk,))
            counts = [cursor.rowcount]
            cursor.nextset()
            cursor.fetchall()
            return counts

        # Nothing changes, one row matches: with FOUND_ROWS the count is 1, without it 0.
        assert run("default", same_value_twice, what="probe") == [1]
        lease = acquire("proxy", ttl=30)
        assert lease.renew(ttl=30) and lease.release() is True
    finally:
        options.clear()
        options.update(saved)
        close_connections()


def test_lost_is_a_bool_so_if_lease_lost_reads_as_it_should(make_pool) -> None:
    make_pool("proxy", 1)
    lease = acquire_short("proxy", ttl=0.3)
    assert lease.lost is False
    if lease.lost:  # was always true while `lost` was a threading.Event
        pytest.fail("a fresh lease reads as lost")
    assert not lease.lost_event.is_set()
    time.sleep(0.35)
    with pytest.raises(LeaseLost):
        lease.check()
    assert lease.lost is True and lease.lost_event.is_set()
    with pytest.raises(AttributeError):
        lease.lost = False  # type: ignore[misc]  # read-only: the Event decides


@pytest.mark.parametrize("closer", ["on", "off"])
def test_an_ended_threads_lease_connections_close_with_it_not_at_the_next_collection(
    make_pool, monkeypatch, closer: str
) -> None:
    """Lease connections of user threads that ended were closed only by a garbage collection
    (they sit in reference cycles): a pool of short-lived threads kept dozens open. ``off`` is
    the negative control: the closer disabled, the connections stay open until collected."""
    import gc

    from resource_lease.db import connections as lease_connections

    if closer == "off":
        monkeypatch.setattr(lease_connections._ClosedWithThread, "__del__", lambda self: None)
    make_pool("proxy", 1)
    seen: list = []

    def work() -> None:
        acquire("proxy", ttl=30).release()
        seen.append(lease_connections.lease_connection("default"))

    gc.disable()  # no collection may close them meanwhile
    try:
        threads = [threading.Thread(target=work) for _ in range(3)]
        for thread in threads:
            thread.start()
            thread.join()
        del threads
        still_open = [conn for conn in seen if conn.wrapper.connection is not None]
        if closer == "on":
            assert still_open == []
        else:
            assert len(still_open) == 3
    finally:
        gc.enable()
        for conn in seen:
            conn.close()
