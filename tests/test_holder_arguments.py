"""ResourceHolder's arguments: a bad one is a ValueError naming it, before anything is written;
defaults come from the settings."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import pytest

from resource_lease.holder import ResourceHolder
from resource_lease.models import Resource
from tests.holder_helpers import Holder


class Bare(ResourceHolder):
    def is_valid(self) -> bool:
        return True


BAD_ARGUMENTS = [
    ({}, "kind"),
    ({"kind": ""}, "kind"),
    ({"kind": 5}, "kind"),
    ({"kind": "x" * 101}, "kind"),
    ({"kind": "k", "ttl": 0}, "ttl"),
    ({"kind": "k", "ttl": -1}, "ttl"),
    ({"kind": "k", "ttl": math.nan}, "ttl"),
    ({"kind": "k", "ttl": math.inf}, "ttl"),
    ({"kind": "k", "ttl": True}, "ttl"),
    ({"kind": "k", "ttl": "5"}, "ttl"),
    ({"kind": "k", "ttl": 10, "renew_interval": 0}, "renew_interval"),
    ({"kind": "k", "ttl": 10, "renew_interval": -1}, "renew_interval"),
    ({"kind": "k", "ttl": 10, "renew_interval": "3"}, "renew_interval"),
    ({"kind": "k", "ttl": 10, "renew_interval": math.nan}, "renew_interval"),
    ({"kind": "k", "ttl": 10, "renew_interval": 10}, "renew_interval"),
    ({"kind": "k", "ttl": 10, "renew_interval": 30}, "renew_interval"),
    # trusted for 10 - min(10 * 0.1, 2) = 9 s only: renewing every 9.5 s would always be late
    ({"kind": "k", "ttl": 10, "renew_interval": 9.5}, "renew_interval"),
    ({"kind": "k", "quarantine_seconds": 0}, "quarantine_seconds"),
    ({"kind": "k", "quarantine_seconds": -5}, "quarantine_seconds"),
    ({"kind": "k", "quarantine_seconds": math.inf}, "quarantine_seconds"),
    ({"kind": "k", "holder": ""}, "holder"),
    ({"kind": "k", "holder": 5}, "holder"),
    ({"kind": "k", "holder": "x" * 256}, "holder"),
    ({"kind": "k", "using": "nope"}, "using"),
    ({"kind": "k", "name": ""}, "name"),
]


@pytest.mark.parametrize(
    ("kwargs", "argument"), BAD_ARGUMENTS, ids=[f"{a}-{i}" for i, (_, a) in enumerate(BAD_ARGUMENTS)]
)
def test_bad_constructor_argument_is_a_value_error_naming_it(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        Bare(**kwargs)


BAD_CLASS_ATTRIBUTES = [
    ({"kind": ""}, "kind"),
    ({"kind": "k", "ttl": "60"}, "ttl"),
    ({"kind": "k", "ttl": 10, "renew_interval": 20}, "renew_interval"),
    ({"kind": "k", "quarantine_seconds": -1}, "quarantine_seconds"),
]


@pytest.mark.parametrize(("attributes", "argument"), BAD_CLASS_ATTRIBUTES)
def test_bad_class_attribute_is_a_value_error_naming_it(attributes: dict[str, Any], argument: str) -> None:
    subclass = type("Configured", (Bare,), attributes)
    with pytest.raises(ValueError, match=argument):
        subclass()


def test_defaults_come_from_settings_and_the_constructor_overrides_class_attributes(settings: Any) -> None:
    settings.RESOURCE_LEASE = {"TTL": 12.0, "QUARANTINE_SECONDS": 99.0}
    holder = Bare(kind="k")
    assert (holder.ttl, holder.renew_interval, holder.quarantine_seconds) == (12.0, 4.0, 99.0)
    holder = Holder(ttl=3, renew_interval=1, quarantine_seconds=5, holder="me")
    assert (holder.kind, holder.ttl, holder.renew_interval, holder.quarantine_seconds, holder.holder) == (
        "h",
        3.0,
        1.0,
        5.0,
        "me",
    )
    assert holder.daemon
    assert f":{os.getpid()}:" in Holder().holder


def test_the_base_class_is_abstract() -> None:
    with pytest.raises(TypeError, match="is_valid"):
        ResourceHolder(kind="k")  # type: ignore[abstract]


BAD_CALLS: list[tuple[Callable[[Holder], Any], str]] = [
    (lambda h: h.acquire(timeout=-1), "timeout"),
    (lambda h: h.acquire(timeout="1"), "timeout"),
    (lambda h: h.acquire(timeout=math.nan), "timeout"),
    (lambda h: h.fix(reason=""), "reason"),
    (lambda h: h.fix(reason=5), "reason"),
    (lambda h: h.fix(timeout=-1), "timeout"),
]


def test_bad_call_arguments_are_refused_and_nothing_is_written(make_pool: Any, holders: Any) -> None:
    rows = make_pool("h", 2)
    holder = holders()
    for call, argument in BAD_CALLS:  # one pool for the whole table: a flush per case is slow
        with pytest.raises(ValueError, match=argument):
            call(holder)
    assert holder.lease is None
    assert [(r.fence, r.holder) for r in Resource.objects.order_by("name")] == [(r.fence, r.holder) for r in rows]
