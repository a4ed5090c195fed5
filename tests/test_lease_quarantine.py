"""A holder that finds its resource broken takes it out of service itself: ``lease.quarantine``,
and ``LeaseTask.lease_is_valid`` (the holder's ``is_valid`` for Celery tasks); and
``pool.counts(using=...)``."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery
from django.db import transaction

from resource_lease import LeaseError, NoResourceAvailable, acquire, audit, pool
from resource_lease.contrib.celery import LeaseTask
from resource_lease.models import LeaseEvent, Resource

pytestmark = pytest.mark.django_db(transaction=True)


def state(name: str) -> tuple[str, str]:
    row = pool.with_state(Resource.objects.filter(name=name)).get()
    return row.state, row.quarantine_reason


def test_a_holder_quarantines_the_resource_it_holds_and_gives_it_back(
    make_pool: Callable[..., list[Resource]], audit_on: Callable[..., Any]
) -> None:
    audit_on(AUDIT_FLUSH_INTERVAL=60)
    make_pool("proxy", 2)
    Resource.objects.filter(name="proxy-1").update(enabled=False)
    lease = acquire("proxy", ttl=60, holder="crawler-7")
    assert lease.quarantine("403 from the target site", seconds=600) is True
    assert lease.released
    assert state("proxy-0") == ("quarantined", "403 from the target site")
    with pytest.raises(NoResourceAvailable):
        acquire("proxy", ttl=60)  # never granted until the quarantine ends
    audit.writer.flush()
    assert list(LeaseEvent.objects.filter(event=LeaseEvent.QUARANTINED).values_list("actor", "detail")) == [
        ("crawler-7", "for 10m 00s: 403 from the target site")
    ]


def test_quarantine_defaults_to_the_quarantine_seconds_setting(make_pool: Callable[..., list[Resource]]) -> None:
    make_pool("proxy", 1)
    lease = acquire("proxy", ttl=60)
    lease.quarantine("timeouts")
    row = Resource.objects.get()
    left = (row.quarantined_until - pool.database_now()).total_seconds()
    assert 3500 < left <= 3600


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"reason": " "}, "reason"),
        ({"reason": "x", "seconds": 0}, "seconds"),
        ({"reason": "x", "seconds": "1"}, "seconds"),
    ],
)
def test_bad_quarantine_arguments_are_refused_and_the_lease_kept(
    make_pool: Callable[..., list[Resource]], kwargs: dict[str, Any], named: str
) -> None:
    make_pool("proxy", 1)
    lease = acquire("proxy", ttl=60)
    with pytest.raises(ValueError, match=named):
        lease.quarantine(**kwargs)
    assert lease.is_held() and state("proxy-0") == ("held", "")


def test_quarantine_inside_a_transaction_is_refused(make_pool: Callable[..., list[Resource]]) -> None:
    make_pool("proxy", 1)
    lease = acquire("proxy", ttl=60)
    with transaction.atomic(), pytest.raises(LeaseError, match="inside an open transaction"):
        lease.quarantine("broken")
    assert lease.is_held() and state("proxy-0") == ("held", "")


# -- LeaseTask.lease_is_valid -------------------------------------------------------------


def declare(body: Callable[..., Any], base: type[LeaseTask] = LeaseTask, **options: Any) -> Any:
    app = Celery("validity", set_as_current=False)
    task = app.task(bind=True, base=base, name=f"validity-{uuid.uuid4().hex}", shared=False, **options)(body)
    app.finalize()
    return task


def used(self: LeaseTask) -> str:
    return str(self.lease.resource.name)


def test_a_task_quarantines_the_resources_its_check_refuses_and_runs_on_a_good_one(
    make_pool: Callable[..., list[Resource]],
) -> None:
    make_pool("proxy", 3)
    checked: list[str] = []

    def only_proxy_2(task: LeaseTask, lease: Any) -> bool:
        checked.append(lease.resource.name)
        return bool(lease.resource.name == "proxy-2")

    task = declare(used, lease_kind="proxy", lease_is_valid=only_proxy_2, lease_quarantine_seconds=120)
    assert task() == "proxy-2"
    assert checked[-1] == "proxy-2" and len(checked) == len(set(checked)), "each refused one is out of the pool"
    for name in set(checked) - {"proxy-2"}:
        assert state(name) == ("quarantined", f"{task.name}: lease_is_valid() returned False")
    assert state("proxy-2") == ("free", "")


def test_a_check_may_quarantine_with_its_own_reason(make_pool: Callable[..., list[Resource]]) -> None:
    make_pool("proxy", 2)

    class Crawl(LeaseTask):
        lease_kind = "proxy"

        def lease_is_valid(self, lease: Any) -> bool:
            if lease.resource.name == "proxy-0":
                lease.quarantine("407 proxy authentication required", 300)
                return False
            return True

    task = declare(used, base=Crawl)
    while state("proxy-0")[0] != "quarantined":  # until the grant fell on proxy-0 once
        assert task() == "proxy-1"
    assert state("proxy-0") == ("quarantined", "407 proxy authentication required")


def test_a_check_that_raises_fails_the_task_and_quarantines_nothing(make_pool: Callable[..., list[Resource]]) -> None:
    make_pool("proxy", 1)

    def broken(task: LeaseTask, lease: Any) -> bool:
        raise RuntimeError("the probe itself is broken")

    task = declare(used, lease_kind="proxy", lease_is_valid=broken)
    with pytest.raises(RuntimeError, match="probe itself"):
        task()
    assert state("proxy-0") == ("free", ""), "released, not quarantined: a bug must not empty the pool"


def test_all_refused_is_no_resource_available(make_pool: Callable[..., list[Resource]]) -> None:
    make_pool("proxy", 2)
    task = declare(used, lease_kind="proxy", lease_is_valid=lambda task, lease: False)
    with pytest.raises(NoResourceAvailable):
        task()
    assert pool.counts()["proxy"]["quarantined"] == 2


def test_a_bad_quarantine_seconds_option_is_refused_when_declared() -> None:
    with pytest.raises(ValueError, match="lease_quarantine_seconds"):
        declare(used, lease_kind="proxy", lease_quarantine_seconds=0)


# -- pool.counts(using=...) -----------------------------------------------------------------


def test_counts_takes_a_database_alias(make_pool: Callable[..., list[Resource]]) -> None:
    make_pool("proxy", 2)
    assert (
        pool.counts(using="default")
        == pool.counts()
        == {"proxy": {"free": 2, "held": 0, "expired": 0, "quarantined": 0, "disabled": 0, "total": 2}}
    )
    assert pool.counts(Resource.objects.filter(name="proxy-0"), using="default")["proxy"]["total"] == 1
    with pytest.raises(ValueError, match="using must name a database"):
        pool.counts(using="nowhere")
