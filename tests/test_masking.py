"""Masked passwords: what ``proxy_urls.unmask_url`` puts back, and what the commands print."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command

from resource_lease.display import mask_payload, unmask_payload
from resource_lease.models import Resource
from resource_lease.proxy_urls import mask_url, unmask_url

STORED = [
    "socks5://alice:s3cret@192.0.2.7:1080",
    "http://alice:p%40ss%2Fword@gw.example:7000",  # percent-encoded, as seed_proxies keeps it
    "http://alice:p@ss/word@gw.example:7000",  # unencoded '@' and '/': masked whole all the same
    "http://alice:***@gw.example:7000",  # a password that happens to be the placeholder
    "http://:only-a-password@10.0.0.1:80",
    "user:pw@gw.example:7000",  # no scheme
    "http://u:pw@[2001:db8::1]:3128",
]


@pytest.mark.parametrize("stored", STORED)
def test_a_masked_url_sent_back_unchanged_is_the_stored_one(stored: str) -> None:
    masked = mask_url(stored)
    assert "***" in masked
    assert unmask_url(masked, stored) == stored


def test_the_mask_keeps_the_password_across_a_new_scheme_only() -> None:
    stored = "socks5://alice:s3cret@192.0.2.7:1080"
    assert unmask_url("http://alice:***@192.0.2.7:1080", stored) == "http://alice:s3cret@192.0.2.7:1080"
    for elsewhere in (
        "socks5://alice:***@192.0.2.8:1080",
        "socks5://alice:***@192.0.2.7:1081",
        "socks5://bob:***@192.0.2.7:1080",
        "socks5://:***@192.0.2.7:1080",
        "socks5://alice:***@192.0.2.7:1080/",
    ):
        with pytest.raises(ValueError, match=r"user, host or port changed \(stored: alice@192\.0\.2\.7:1080"):
            unmask_url(elsewhere, stored)


@pytest.mark.parametrize("stored", [None, 42, "http://10.0.0.1:80", "http://alice@10.0.0.1:80"])
def test_the_mask_with_no_stored_password_is_refused(stored: Any) -> None:
    with pytest.raises(ValueError, match=r"type the password"):
        unmask_url("http://alice:***@10.0.0.1:80", stored)


@pytest.mark.parametrize("sent", ["http://alice:new@10.0.0.1:80", "http://10.0.0.1:80", "", None, 7])
def test_anything_without_the_placeholder_is_taken_as_sent(sent: Any) -> None:
    assert unmask_url(sent, "http://alice:old@10.0.0.1:80") == sent


def test_payloads() -> None:
    stored = {"url": "http://alice:old@10.0.0.1:80", "region": "eu"}
    assert mask_payload(stored) == {"url": "http://alice:***@10.0.0.1:80", "region": "eu"}
    assert stored["url"] == "http://alice:old@10.0.0.1:80"  # a copy: the stored payload is left alone
    for nothing_to_mask in ({"url": "http://10.0.0.1:80"}, {"url": 5}, {"host": "a:b@c"}, [1], "x", None):
        assert mask_payload(nothing_to_mask) == nothing_to_mask
    assert unmask_payload({"url": "http://alice:***@10.0.0.1:80", "region": "us"}, stored) == {
        "url": "http://alice:old@10.0.0.1:80",
        "region": "us",
    }
    assert unmask_payload({"region": "us"}, stored) == {"region": "us"}
    assert unmask_payload([1, 2], stored) == [1, 2]
    with pytest.raises(ValueError, match=r"no stored URL"):
        unmask_payload({"url": "http://alice:***@10.0.0.1:80"}, {"region": "eu"})


@pytest.mark.django_db(transaction=True)
def test_inspect_pool_prints_no_password_in_the_table_nor_in_json(make_pool: Any) -> None:
    make_pool("proxy", 2)
    Resource.objects.filter(name="proxy-0").update(data={"url": "socks5://u:Tr0ub4dor-3@10.0.0.1:1080"})
    for args in ((), ("--json",)):
        out = io.StringIO()
        call_command("inspect_pool", *args, stdout=out)
        assert "Tr0ub4dor-3" not in out.getvalue()
        assert "socks5://u:***@10.0.0.1:1080" in out.getvalue()
    report = json.loads(out.getvalue())
    assert {r["name"]: r["url"] for r in report["resources"]}["proxy-0"] == "socks5://u:***@10.0.0.1:1080"
