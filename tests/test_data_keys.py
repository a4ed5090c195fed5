"""Seeing and filtering resources by a key of their data (``DATA_KEYS``, e.g. ``region``): a
column and a filter in the admin's Resources list, ``inspect_pool --where region=eu`` and a
column there; within the admin's lookup allow-list (no other lookup on ``data``, never on
``url``)."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from resource_lease.models import Resource

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/admin/resource_lease/resource/"


@pytest.fixture
def regions(transactional_db: None) -> None:
    Resource.objects.bulk_create(
        [
            Resource(kind="proxy", name=f"crawl{i}@10.20.1.{i}:8080", data={"url": url, **extra})
            for i, (url, extra) in enumerate(
                [
                    ("http://crawl0:pw0@10.20.1.0:8080", {"region": "eu", "tier": 1}),
                    ("http://crawl1:pw1@10.20.1.1:8080", {"region": "eu", "tier": "1"}),
                    ("http://crawl2:pw2@10.20.1.2:8080", {"region": "us", "tier": 2}),
                    ("http://crawl3:pw3@10.20.1.3:8080", {}),
                ]
            )
        ]
    )


@pytest.fixture
def region_key(settings: Any) -> None:
    settings.RESOURCE_LEASE = {**settings.RESOURCE_LEASE, "DATA_KEYS": ("region",)}


def names(html: str) -> set[str]:
    html = html.replace("<wbr>", "")
    return set(re.findall(r'<th class="field-name_display"><a [^>]*>([^<]+)</a>', html))


@pytest.mark.usefixtures("regions", "region_key")
def test_the_list_shows_and_filters_by_a_configured_key(staff: Any) -> None:
    viewer: Client = staff("view_resource")
    html = viewer.get(LIST).content.decode()
    assert re.search(r'<th scope="col" class="column-data_key_0">\s*<div class="text"><span>Region</span>', html)
    assert '<td class="field-data_key_0"><span class="rl-wrap" title="eu">eu</span></td>' in html
    assert "?data.region=eu" in html and "?data.region=us" in html  # the filter's choices
    eu = viewer.get(LIST, {"data.region": "eu"})
    assert eu.status_code == 200
    assert names(eu.content.decode()) == {"crawl0@10.20.1.0:8080", "crawl1@10.20.1.1:8080"}
    assert names(viewer.get(LIST, {"data.region": "us"}).content.decode()) == {"crawl2@10.20.1.2:8080"}
    assert names(viewer.get(LIST, {"data.region": "mars"}).content.decode()) == set()
    # Still no other lookup on data: the allow-list has the filter's parameter only.
    for lookup in ("data__region", "data__region__regex", "data.url", "data__url__regex", "data.tier"):
        assert viewer.get(LIST, {lookup: "e"}).status_code == 400, lookup


@pytest.mark.usefixtures("regions")
def test_without_the_setting_there_is_no_column_nor_filter(staff: Any) -> None:
    viewer: Client = staff("view_resource")
    html = viewer.get(LIST).content.decode()
    assert "data_key_0" not in html and "data.region" not in html
    assert viewer.get(LIST, {"data.region": "eu"}).status_code == 400


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("inspect_pool", *args, stdout=out)
    return out.getvalue()


@pytest.mark.usefixtures("regions")
def test_inspect_pool_where_filters_as_acquire_compares(settings: Any) -> None:
    out = run("--where", "region=eu")
    header, *lines = out.splitlines()
    assert "REGION" in header.split() and "URL" in header.split()
    listed = [line.split()[1] for line in lines if line.startswith("proxy ")]
    assert listed == ["crawl0@10.20.1.0:8080", "crawl1@10.20.1.1:8080"]
    assert "pw0" not in out and "crawl0:***@" in out
    assert "proxy: 4 total" in out  # counts stay complete
    # Typed as acquire(where=) types it: 1 is the integer, '"1"' the string.
    report = json.loads(run("--where", "tier=1", "--json"))
    assert [(r["name"], r["data"]) for r in report["resources"]] == [
        ("crawl0@10.20.1.0:8080", {"tier": 1}),
    ]
    report = json.loads(run("--where", 'tier="1"', "--where", "region=eu", "--json"))
    assert [(r["name"], r["data"]) for r in report["resources"]] == [
        ("crawl1@10.20.1.1:8080", {"region": "eu", "tier": "1"}),
    ]


@pytest.mark.usefixtures("regions", "region_key")
def test_inspect_pool_shows_the_configured_keys(settings: Any) -> None:
    report = json.loads(run("--json"))
    assert {r["name"]: r["data"] for r in report["resources"]}["crawl3@10.20.1.3:8080"] == {"region": None}
    header = run().splitlines()[0].split()
    assert header.index("REGION") == header.index("URL") - 1


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("region", "must be KEY=VALUE"),
        ("=eu", "must be KEY=VALUE"),
        ("url=http://x", "cannot filter by 'url'"),
        ("tier=1.5", None),  # not an int: taken as the text "1.5", matches nothing
    ],
)
def test_inspect_pool_where_refuses_what_it_cannot_compare(regions: None, arg: str, says: str | None) -> None:
    if says is None:
        assert "No resource matches." in run("--where", arg)
        return
    with pytest.raises(CommandError, match=re.escape(says)):
        run("--where", arg)
