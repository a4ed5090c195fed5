"""Shared health: ``lease.report()``, automatic quarantine with backoff, probation, retirement,
and ``pool_policy()``, on the real database.

- a failure adds 1 to the error score, a success multiplies it by the decay; at the threshold
  the resource is quarantined automatically for between half and all of the backoff (by the
  database's clock), one level up, and nobody is granted it meanwhile;
- the next grant is a probation grant: "ok" makes the resource healthy, a failure quarantines
  it at the next level (twice as long, to the cap), a release without a report keeps it on
  probation; an operator's restore forgets its health;
- a report from a lease no longer held raises LeaseLost and changes nothing;
- concurrent reports from four processes never lose an update (the negative control, read
  then write, does); every automatic quarantine across processes counts one level;
- max_uses and max_age retire a resource; bad input is a ValueError naming it, nothing written.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import time
from pathlib import Path

import pytest

import resource_lease
from resource_lease import LeaseLost, NoResourceAvailable, acquire, pool_policy
from resource_lease.health import POLICY_CACHE, Policy
from resource_lease.models import PoolPolicy, Resource
from resource_lease.pool import database_now, force_release, quarantine, restore

pytestmark = pytest.mark.django_db(transaction=True)


def row(lease) -> Resource:
    return Resource.objects.get(pk=lease.resource.pk)


def wait_until_free(resource: Resource) -> None:
    """Until the resource's quarantine has ended by the database's clock."""
    while True:
        until = Resource.objects.get(pk=resource.pk).quarantined_until
        if until is None or until <= database_now():
            return
        time.sleep(0.02)


def test_the_default_policy_and_a_stored_one() -> None:
    assert pool_policy("proxy") == Policy("proxy")
    assert pool_policy("proxy").backoff == (60.0, 3600.0) and pool_policy("proxy").error_threshold == 3.0
    assert not PoolPolicy.objects.exists()  # reading writes nothing
    policy = pool_policy("proxy", error_threshold=2, backoff=(1, 8), max_uses=100)
    assert policy.error_threshold == 2.0 and policy.backoff == (1.0, 8.0) and policy.max_uses == 100
    assert policy.error_decay == 0.5  # kept
    assert pool_policy("proxy") == policy
    assert pool_policy("proxy", max_uses=None).max_uses is None
    stored = PoolPolicy.objects.get(kind="proxy")
    assert (stored.backoff_base, stored.backoff_cap, stored.max_uses) == (1.0, 8.0, None)


def test_failures_add_up_and_quarantine_at_the_threshold_for_half_to_all_of_the_base(make_pool) -> None:
    make_pool("proxy", 1)
    pool_policy("proxy", error_threshold=3, backoff=(100, 1000))
    lease = acquire("proxy", ttl=30)
    assert lease.probation is False
    lease.report("error")
    lease.report("blocked")
    assert (row(lease).health_score, row(lease).backoff_level, row(lease).quarantined_until) == (2.0, 0, None)
    before = database_now()
    lease.report("error")
    after = database_now()
    state = row(lease)
    assert state.health_score == 3.0 and state.backoff_level == 1 and state.backoff_seconds == 100.0
    assert before + dt.timedelta(seconds=50) <= state.quarantined_until <= after + dt.timedelta(seconds=100)
    assert state.quarantine_reason.startswith("automatic: error reported by")
    lease.report("error")  # the same grant trips once: the score goes on, the level does not
    assert (row(lease).health_score, row(lease).backoff_level) == (4.0, 1)
    lease.release()
    with pytest.raises(NoResourceAvailable):
        acquire("proxy", timeout=0)


def test_a_success_decays_the_score(make_pool) -> None:
    make_pool("proxy", 1)
    pool_policy("proxy", error_threshold=10, error_decay=0.25)
    with acquire("proxy") as lease:
        lease.report("error")
        lease.report("error")
        lease.report("ok")
        assert row(lease).health_score == 0.5
        lease.report("ok")
        assert row(lease).health_score == 0.125


def test_probation_ok_makes_it_healthy_and_a_failure_doubles_the_backoff_to_the_cap(make_pool) -> None:
    (resource,) = make_pool("proxy", 1)
    pool_policy("proxy", error_threshold=1, backoff=(0.2, 0.3))
    with acquire("proxy") as lease:
        lease.report("error")  # level 1, 0.1 to 0.2 s
    wait_until_free(resource)
    lease = acquire("proxy", timeout=30)
    assert lease.probation is True
    before = database_now()
    lease.report("error")  # level 2: min(cap 0.3, 0.4) = 0.3 s, jittered to 0.15 to 0.3 s
    after = database_now()
    state = row(lease)
    assert state.backoff_level == 2 and state.backoff_seconds == 0.3
    assert before + dt.timedelta(seconds=0.15) <= state.quarantined_until <= after + dt.timedelta(seconds=0.3)
    lease.release()
    wait_until_free(resource)
    lease = acquire("proxy", timeout=30)
    assert lease.probation is True
    lease.report("ok")
    assert (row(lease).health_score, row(lease).backoff_level) == (0.0, 0)
    lease.release()
    assert acquire("proxy", timeout=30).probation is False


def test_a_probation_grant_released_without_a_report_leaves_the_next_on_probation(make_pool) -> None:
    (resource,) = make_pool("proxy", 1)
    pool_policy("proxy", error_threshold=1, backoff=(0.1, 1))
    with acquire("proxy") as lease:
        lease.report("error")
    wait_until_free(resource)
    with acquire("proxy", timeout=30) as lease:
        assert lease.probation
    with acquire("proxy", timeout=30) as lease:
        assert lease.probation


def test_blocked_with_retry_after_quarantines_for_that_long(make_pool) -> None:
    make_pool("proxy", 1)
    lease = acquire("proxy")
    before = database_now()
    lease.report("blocked", retry_after=600)
    after = database_now()
    state = row(lease)
    assert before + dt.timedelta(seconds=600) <= state.quarantined_until <= after + dt.timedelta(seconds=600)
    assert state.backoff_level == 0 and state.health_score == 1.0  # below the threshold: no backoff
    assert "retry after 600s" in state.quarantine_reason


def test_restore_forgets_the_health(make_pool) -> None:
    make_pool("proxy", 1)
    pool_policy("proxy", error_threshold=1)
    with acquire("proxy") as lease:
        lease.report("error")
    assert restore(Resource.objects.filter(kind="proxy")) == 1
    state = Resource.objects.get(kind="proxy")
    assert (state.health_score, state.backoff_level, state.backoff_seconds, state.quarantined_until) == (0, 0, 0, None)
    assert acquire("proxy").probation is False


def test_a_report_from_a_lease_no_longer_held_is_refused_and_changes_nothing(make_pool) -> None:
    make_pool("proxy", 1)
    pool_policy("proxy", error_threshold=1)
    old = acquire("proxy", ttl=30)
    force_release(Resource.objects.filter(kind="proxy"))  # cut off: its local deadline still runs
    new = acquire("proxy", ttl=30)
    for outcome in ("error", "ok", "blocked"):
        with pytest.raises(LeaseLost):
            old.report(outcome)
    assert old.lost
    state = row(new)
    assert (state.health_score, state.backoff_level, state.quarantined_until) == (0.0, 0, None)
    new.release()
    with pytest.raises(LeaseLost):
        new.report("error")  # released: refused before asking
    assert row(new).health_score == 0.0


def test_an_operator_quarantine_still_works_alongside(make_pool) -> None:
    make_pool("proxy", 2)
    quarantine(Resource.objects.filter(name="proxy-0"), reason="maintenance", seconds=600)
    with acquire("proxy") as lease:
        assert lease.resource.name == "proxy-1"
        lease.report("ok")


# -- across processes -------------------------------------------------------------------------


def concurrent_reports(spawn_worker, tmp_path: Path, lease, *extra: str) -> None:
    go = tmp_path / "go"
    key = ("--pk", str(lease.resource.pk), "--holder", lease.holder, "--fence", str(lease.fence))
    procs = [
        spawn_worker("tests.procs.reporter", *key, "--reports", "50", "--go", str(go), *extra, stdout=subprocess.PIPE)
        for _ in range(4)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    go.touch()
    for proc in procs:
        out, _ = proc.communicate(timeout=150)
        assert proc.returncode == 0 and out.strip() == "DONE", out


def test_concurrent_reports_never_lose_an_update(spawn_worker, tmp_path: Path, make_pool) -> None:
    make_pool("proxy", 1)
    pool_policy("proxy", error_threshold=1e9)
    lease = acquire("proxy", ttl=600)
    concurrent_reports(spawn_worker, tmp_path, lease)
    assert row(lease).health_score == 200.0


def test_negative_control_read_then_write_reports_lose_updates(spawn_worker, tmp_path: Path, make_pool) -> None:
    """Whether two processes interleave between the read and the write depends on the
    machine's scheduling: up to three runs, each judged on its own."""
    make_pool("proxy", 1)
    lease = acquire("proxy", ttl=600)
    for run in range(3):
        Resource.objects.filter(pk=lease.resource.pk).update(health_score=0)
        directory = tmp_path / f"run{run}"
        directory.mkdir()
        concurrent_reports(spawn_worker, directory, lease, "--naive")
        score = row(lease).health_score
        print(f"negative control, run {run + 1}: score {score} of 200")
        if score < 200:
            return
    raise AssertionError("read-then-write reports lost no update in three runs")


def test_every_automatic_quarantine_across_processes_is_one_level(spawn_worker, make_pool) -> None:
    make_pool("proxy", 1)
    pool_policy("proxy", error_threshold=1, backoff=(0.01, 0.02))
    procs = [
        spawn_worker("tests.procs.reporter", "--cycle", "proxy", "--grants", "5", stdout=subprocess.PIPE)
        for _ in range(3)
    ]
    grants = 0
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        grants += int(out.split()[-1])
    state = Resource.objects.get(kind="proxy")
    # Each grant was a failure that quarantined it (the first by the score, then every
    # probation grant): none lost, none doubled.
    assert grants == 15 == state.fence == state.backoff_level
    assert state.health_score == 15.0


# -- retirement -----------------------------------------------------------------------------


def test_max_uses_retires_a_resource_after_that_many_grants(make_pool) -> None:
    make_pool("proxy", 1)
    pool_policy("proxy", max_uses=2)
    with acquire("proxy"):
        pass
    with acquire("proxy") as lease:
        assert lease.fence == 2  # the last use is granted
        state = row(lease)
        assert state.enabled is False and "max_uses 2" in state.quarantine_reason
    with pytest.raises(NoResourceAvailable):
        acquire("proxy", timeout=0)


def test_max_age_retires_an_old_resource_and_its_grant_is_given_back(make_pool) -> None:
    make_pool("proxy", 2)
    Resource.objects.filter(name="proxy-0").update(created_at=database_now() - dt.timedelta(hours=2))
    pool_policy("proxy", max_age=3600)
    with acquire("proxy") as lease:  # proxy-0 granted first is retired and given back: then proxy-1
        assert lease.resource.name == "proxy-1"
        with pytest.raises(NoResourceAvailable):  # proxy-0 granted now is retired and given back
            acquire("proxy", timeout=0)
    old = Resource.objects.get(name="proxy-0")
    assert old.enabled is False and "max_age 3600s" in old.quarantine_reason
    assert old.fence <= 1 and not old.grant_token  # granted at most once, and given back at once


def test_a_policy_changed_elsewhere_is_in_force_within_the_cache_time(make_pool) -> None:
    make_pool("proxy", 1)
    assert pool_policy("proxy").error_threshold == 3.0
    PoolPolicy.objects.create(kind="proxy", error_threshold=1.0)  # another process's write
    time.sleep(POLICY_CACHE)
    with acquire("proxy") as lease:
        lease.report("error")
        assert row(lease).backoff_level == 1


# -- bad input ------------------------------------------------------------------------------


BAD_POLICIES = [
    ("error_threshold", {"error_threshold": 0}),
    ("error_threshold", {"error_threshold": -1}),
    ("error_threshold", {"error_threshold": float("inf")}),
    ("error_threshold", {"error_threshold": "3"}),
    ("error_decay", {"error_decay": 1}),
    ("error_decay", {"error_decay": -0.1}),
    ("backoff base must be <= its cap", {"backoff": (60, 30)}),
    ("backoff", {"backoff": 60}),
    ("backoff base", {"backoff": (0, 30)}),
    ("backoff cap", {"backoff": (1, float("nan"))}),
    ("target_rate n", {"target_rate": (0, 60)}),
    ("target_rate per", {"target_rate": (10, 0)}),
    ("cooldown", {"cooldown": -1}),
    ("session_idle", {"session_idle": 0}),
    ("max_uses", {"max_uses": 0}),
    ("max_uses", {"max_uses": True}),
    ("max_age", {"max_age": -5}),
    ("kind", {"error_threshold": 2, "kind": ""}),
]


@pytest.mark.parametrize(("argument", "changes"), BAD_POLICIES)
def test_a_bad_policy_is_a_value_error_naming_it_and_writes_nothing(argument, changes) -> None:
    kind = changes.pop("kind", "proxy")
    with pytest.raises(ValueError, match=argument):
        pool_policy(kind, **changes)
    assert not PoolPolicy.objects.exists()


@pytest.mark.parametrize(
    ("argument", "outcome", "retry_after"),
    [
        ("outcome", "banned", None),
        ("outcome", None, None),
        ("outcome", "OK", None),
        ("retry_after", "blocked", -1),
        ("retry_after", "blocked", 0),
        ("retry_after", "blocked", float("inf")),
        ("retry_after", "blocked", "60"),
        ("retry_after", "error", 60),
    ],
)
def test_a_bad_report_is_a_value_error_naming_it_and_writes_nothing(make_pool, argument, outcome, retry_after) -> None:
    make_pool("proxy", 1)
    with acquire("proxy") as lease:
        with pytest.raises(ValueError, match=argument):
            lease.report(outcome, retry_after=retry_after)
        state = row(lease)
        assert (state.health_score, state.backoff_level, state.quarantined_until) == (0.0, 0, None)


def test_exported_from_the_package() -> None:
    assert resource_lease.pool_policy is pool_policy
    assert "pool_policy" in resource_lease.__all__


def test_reports_and_automatic_quarantines_are_counted(make_pool) -> None:
    from prometheus_client import REGISTRY

    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    make_pool("m-report", 1)
    pool_policy("m-report", error_threshold=2)
    before = {o: value("resource_lease_reports_total", kind="m-report", outcome=o) for o in ("ok", "error", "blocked")}
    quarantines = value("resource_lease_auto_quarantines_total", kind="m-report")
    with acquire("m-report") as lease:
        lease.report("ok")
        lease.report("error")
        lease.report("blocked")  # trips
        lease.report("error")  # the same grant: no second quarantine
    after = {o: value("resource_lease_reports_total", kind="m-report", outcome=o) for o in ("ok", "error", "blocked")}
    assert {o: after[o] - before[o] for o in after} == {"ok": 1, "error": 2, "blocked": 1}
    assert value("resource_lease_auto_quarantines_total", kind="m-report") == quarantines + 1
    with pytest.raises(LeaseLost):
        lease.report("ok")  # refused: not counted
    assert value("resource_lease_reports_total", kind="m-report", outcome="ok") == after["ok"]


def test_a_lock_s_lease_has_no_health_to_report() -> None:
    from resource_lease import LeaseError, lock

    with lock("rebuild", ttl=30) as lease:
        with pytest.raises(LeaseError, match="report\\(\\) is for a pool's resources"):
            lease.report("error")
        assert row(lease).health_score == 0.0


def test_a_grant_made_for_a_waiter_in_line_is_retired_too(make_pool) -> None:
    """On PostgreSQL the release hands the row to the waiter's place (``lease.retiring``);
    elsewhere the waiter's own grant finds it due: either way it is retired, not handed out."""
    import threading

    from resource_lease.line import Line, waiters

    make_pool("proxy", 1)
    held = acquire("proxy", ttl=30)  # granted before the policy: not retired
    Resource.objects.update(created_at=database_now() - dt.timedelta(hours=2))
    pool_policy("proxy", max_age=3600)
    outcome: list[str] = []

    def wait() -> None:
        try:
            acquire("proxy", ttl=30, timeout=3).release()
            outcome.append("granted")
        except NoResourceAvailable:
            outcome.append("none")

    waiter = threading.Thread(target=wait)
    waiter.start()
    while not waiters(Line("default", "proxy")) and waiter.is_alive():
        time.sleep(0.01)
    held.release()
    waiter.join()
    assert outcome == ["none"]
    state = Resource.objects.get(kind="proxy")
    assert state.enabled is False and "max_age 3600s" in state.quarantine_reason and not state.grant_token
