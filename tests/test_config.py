"""Config: typed keys stored in the database, seen by every process, editable in the admin.

- values keep the type of their default (an int is taken for a float, a bool never for a
  number, a str never for an int: ValueError and nothing written; an unknown key: KeyError);
- a change made in one process is seen by another process's watch and reads within poll;
- an operator's edit in the admin is validated the same way and seen by a watcher;
- ``inspect_topics --json`` lists topics and configs.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
import time
from collections.abc import Callable
from html import unescape
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from resource_lease import Config, notify
from resource_lease.models import ConfigEntry
from tests.faults.harness import Child
from tests.notify_helpers import notify_child
from tests.procs.notify_proc import DEFAULTS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def start(spawn_worker: Callable[..., subprocess.Popen[str]]) -> Callable[..., Child]:
    return notify_child(spawn_worker)


def _entry(namespace: str, key: str) -> ConfigEntry:
    return ConfigEntry.objects.get(namespace=namespace, key=key)


# -- types ---------------------------------------------------------------------------------


def test_values_keep_the_type_of_their_default() -> None:
    params = Config("talent_rec", defaults={"max_rec": 1000, "min_title_sim": 0.55, "on": True, "label": "x"})
    assert params["max_rec"] == 1000 and params["min_title_sim"] == 0.55
    params.set("max_rec", 800)
    params.set("min_title_sim", 1)  # an int is taken for a float key, stored as a float
    params.set("on", False)
    params.set("label", "y")
    assert params["max_rec"] == 800
    assert params["min_title_sim"] == 1.0 and type(params["min_title_sim"]) is float
    assert params["on"] is False and params["label"] == "y"
    assert _entry("talent_rec", "min_title_sim").value == 1.0
    fresh = Config("talent_rec", defaults={"max_rec": 1000, "min_title_sim": 0.55, "on": True, "label": "x"})
    assert fresh.as_dict() == {"label": "y", "max_rec": 800, "min_title_sim": 1.0, "on": False}
    assert type(fresh["min_title_sim"]) is float


WRONG_TYPES: list[tuple[str, Any]] = [
    ("max_rec", "x"),
    ("max_rec", "800"),
    ("max_rec", 800.0),
    ("max_rec", True),
    ("max_rec", None),
    ("min_title_sim", True),
    ("min_title_sim", "0.5"),
    ("min_title_sim", float("nan")),
    ("min_title_sim", float("inf")),
    ("on", 1),
    ("on", "true"),
    ("label", 3),
    ("label", "nul\x00"),
    ("items", {"a": 1}),
    ("items", [object()]),
    ("opts", [1]),
]


def test_a_value_of_another_type_is_a_value_error_naming_the_key_and_nothing_is_written() -> None:
    params = Config(
        "typed",
        defaults={"max_rec": 1000, "min_title_sim": 0.55, "on": True, "label": "x", "items": [1], "opts": {"a": 1}},
    )
    before = list(ConfigEntry.objects.order_by("key").values_list("key", "value", "version"))
    for key, value in WRONG_TYPES:
        with pytest.raises(ValueError, match=re.escape(repr(key))):
            params.set(key, value)
    assert list(ConfigEntry.objects.order_by("key").values_list("key", "value", "version")) == before
    assert all(value is None and version == 0 for _, value, version in before)


def test_a_key_with_no_default_is_a_key_error() -> None:
    params = Config("keys", defaults={"max_rec": 1000})
    with pytest.raises(KeyError, match="nope"):
        params.set("nope", 1)
    with pytest.raises(KeyError, match="nope"):
        params["nope"]
    assert list(ConfigEntry.objects.values_list("key", flat=True)) == ["max_rec"]


BAD_CONSTRUCTION: list[tuple[Callable[[], Any], str]] = [
    (lambda: Config("", defaults={"a": 1}), "namespace"),
    (lambda: Config("n" * 201, defaults={"a": 1}), "namespace"),
    (lambda: Config("a\x00b", defaults={"a": 1}), "namespace"),
    (lambda: Config("ns", defaults=[("a", 1)]), "defaults"),  # type: ignore[arg-type]
    (lambda: Config("ns", defaults={"a": None}), "defaults"),
    (lambda: Config("ns", defaults={"a": (1, 2)}), "defaults"),
    (lambda: Config("ns", defaults={"a": float("nan")}), "defaults"),
    (lambda: Config("ns", defaults={"": 1}), "defaults key"),
    (lambda: Config("ns", defaults={"k" * 201: 1}), "defaults key"),
    (lambda: Config("ns", defaults={"a": 1}, poll=0), "poll"),
    (lambda: Config("ns", defaults={"a": 1}, poll="1"), "poll"),  # type: ignore[arg-type]
    (lambda: Config("ns", defaults={"a": 1}, using="nope"), "using"),
]


def test_bad_construction_is_refused_naming_the_argument_and_nothing_is_written() -> None:
    for make, argument in BAD_CONSTRUCTION:
        with pytest.raises(ValueError, match=argument):
            make()
    assert not ConfigEntry.objects.exists()


def test_constructing_records_each_keys_type_and_default_for_the_admin() -> None:
    Config("declared", defaults={"max_rec": 1000, "sim": 0.5, "on": True, "label": "x", "ids": [1, 2], "m": {"a": 1}})
    rows = {e.key: (e.type, e.default, e.value, e.version) for e in ConfigEntry.objects.filter(namespace="declared")}
    assert rows == {
        "max_rec": ("int", 1000, None, 0),
        "sim": ("float", 0.5, None, 0),
        "on": ("bool", True, None, 0),
        "label": ("str", "x", None, 0),
        "ids": ("list", [1, 2], None, 0),
        "m": ("dict", {"a": 1}, None, 0),
    }


def test_keys_and_namespaces_compare_exactly() -> None:
    a = Config("Rec", defaults={"Max": 1, "max": 2, "max ": 3})
    b = Config("rec", defaults={"Max": 10})
    a.set("Max", 5)
    assert (a["Max"], a["max"], a["max "], b["Max"]) == (5, 2, 3, 10)
    assert ConfigEntry.objects.count() == 4


def test_a_stored_value_that_does_not_fit_is_logged_and_the_default_used(caplog: pytest.LogCaptureFixture) -> None:
    old = Config("drift", defaults={"max_rec": "a string once"})
    Config.retype("drift", "max_rec", 1000)  # the explicit change of type
    old.set("max_rec", "many")  # a process still running the old code
    with caplog.at_level(logging.ERROR, logger="resource_lease"):
        params = Config("drift", defaults={"max_rec": 1000})
    assert params["max_rec"] == 1000
    assert any("does not fit" in r.getMessage() for r in caplog.records)
    assert _entry("drift", "max_rec").type == "int"


def test_the_first_declaration_s_type_holds_and_a_conflicting_one_is_refused() -> None:
    """A rolling deploy: old and new code build their Config in turn; the key's type (and so
    the admin's validation) must not flip with whichever process came last."""
    Config("flip", defaults={"max_rec": 1000})
    message = (
        r"defaults\['max_rec'\] is a float, but config 'flip' key 'max_rec' was declared an int first"
        r".*Config.retype\('flip', 'max_rec', <new default>\)"
    )
    for _ in range(2):
        with pytest.raises(ValueError, match=message):
            Config("flip", defaults={"max_rec": 0.5, "added": 1})
        assert _entry("flip", "max_rec").type == "int"
        assert not ConfigEntry.objects.filter(key="added").exists(), "nothing written"
        Config("flip", defaults={"max_rec": 1000})
    # The same type with another default: the default shown by the admin follows the code.
    Config("flip", defaults={"max_rec": 2000})
    assert (_entry("flip", "max_rec").type, _entry("flip", "max_rec").default) == ("int", 2000)


def test_retype_is_the_explicit_change_of_a_key_s_type() -> None:
    params = Config("retyped", defaults={"max_rec": 1000, "label": "a"})
    params.set("max_rec", 800)
    params.set("label", "b")
    Config.retype("retyped", "max_rec", 0.5)  # 800 fits a float: kept
    entry = _entry("retyped", "max_rec")
    assert (entry.type, entry.default, entry.value) == ("float", 0.5, 800)
    version = _entry("retyped", "label").version
    Config.retype("retyped", "label", 3)  # "b" is no int: removed, a change watchers see
    entry = _entry("retyped", "label")
    assert (entry.type, entry.default, entry.value, entry.version) == ("int", 3, None, version + 1)
    assert Config("retyped", defaults={"max_rec": 0.5, "label": 3}).as_dict() == {"max_rec": 800.0, "label": 3}
    with pytest.raises(ValueError, match="is an int, but config 'retyped' key 'max_rec' was declared a float"):
        Config("retyped", defaults={"max_rec": 1000})
    with pytest.raises(KeyError, match="no declared key 'nope'"):
        Config.retype("retyped", "nope", 1)
    with pytest.raises(ValueError, match="default must be a bool"):
        Config.retype("retyped", "label", object())


def test_reset_goes_back_to_the_default_and_watchers_see_it() -> None:
    params = Config("resets", defaults={"max_rec": 1000}, poll=0.1)
    seen: list[tuple[str, Any, Any]] = []
    got = threading.Event()

    def on_change(key: str, old: Any, new: Any) -> None:
        seen.append((key, old, new))
        got.set()

    w = params.watch(on_change)
    try:
        params.set("max_rec", 5)
        assert got.wait(20)
        got.clear()
        params.reset("max_rec")
        assert got.wait(20)
    finally:
        w.stop()
    assert seen == [("max_rec", 1000, 5), ("max_rec", 5, 1000)]
    assert params["max_rec"] == 1000 and _entry("resets", "max_rec").value is None


# -- across processes ----------------------------------------------------------------------


def test_a_change_in_one_process_is_seen_by_another_process_watch_and_reads(start: Callable[..., Child]) -> None:
    watcher = start("config-watch", "--namespace", "shared", "--poll", 0.3)
    ready = watcher.wait_for("ready", timeout=60)
    assert ready["values"] == DEFAULTS
    params = Config("shared", defaults=DEFAULTS, poll=0.3)
    delays = []
    for value in (800, 600, 700):
        t0 = time.monotonic()
        params.set("max_rec", value)
        got = watcher.wait_for("changed", timeout=30, where=lambda e, v=value: e["new"] == v)
        delays.append(got["t"] - t0)
    params.set("min_title_sim", 1)
    watcher.wait_for("changed", timeout=30, where=lambda e: e["key"] == "min_title_sim")
    time.sleep(0.4)
    mark = watcher.mark()
    watcher.send("get", "max_rec")
    assert watcher.wait_for("value", since=mark)["value"] == 700
    changes = [(e["key"], e["old"], e["new"]) for e in watcher.of("changed")]
    assert changes == [
        ("max_rec", 1000, 800),
        ("max_rec", 800, 600),
        ("max_rec", 600, 700),
        ("min_title_sim", 0.55, 1.0),
    ]
    watcher.finish()
    print(f"config change seen by another process after {[round(d, 3) for d in delays]} s (poll 0.3 s)")

    # And the other way round: another process sets, this one reads within poll.
    setter = start("config-set", "--namespace", "shared", "--key", "max_rec", "--value", "123")
    assert setter.proc.wait(timeout=60) == 0
    deadline = time.monotonic() + 0.3 + 2.0  # poll, and a generous margin for a loaded machine
    while params["max_rec"] != 123:
        assert time.monotonic() < deadline, "the other process's change was not seen within poll"
        time.sleep(0.02)


# -- the admin -----------------------------------------------------------------------------


def _change_url(entry: ConfigEntry) -> str:
    return f"/admin/resource_lease/configentry/{entry.pk}/change/"


def test_an_admin_edit_is_validated_and_seen_by_a_watcher(admin_client: Client, start: Callable[..., Child]) -> None:
    Config("shared", defaults=DEFAULTS)
    watcher = start("config-watch", "--namespace", "shared", "--poll", 0.3)
    watcher.wait_for("ready", timeout=60)
    entry = _entry("shared", "max_rec")

    page = admin_client.get(_change_url(entry))
    assert page.status_code == 200 and "1000" in page.content.decode()

    bad = admin_client.post(_change_url(entry), {"value_text": "many", "_save": "Save"})
    assert bad.status_code == 200
    assert "config key &#x27;max_rec&#x27; takes an int" in bad.content.decode()
    bad = admin_client.post(_change_url(entry), {"value_text": "true", "_save": "Save"})
    assert "takes an int" in unescape(bad.content.decode())
    assert _entry("shared", "max_rec").version == 0 and _entry("shared", "max_rec").value is None

    ok = admin_client.post(_change_url(entry), {"value_text": "750", "_save": "Save"})
    assert ok.status_code == 302, ok.content.decode()[:2000]
    assert (_entry("shared", "max_rec").value, _entry("shared", "max_rec").version) == (750, 1)
    got = watcher.wait_for("changed", timeout=30, where=lambda e: e["key"] == "max_rec")
    assert (got["old"], got["new"]) == (1000, 750)

    sim = _entry("shared", "min_title_sim")
    assert admin_client.post(_change_url(sim), {"value_text": "1", "_save": "Save"}).status_code == 302
    assert _entry("shared", "min_title_sim").value == 1.0
    label = _entry("shared", "label")
    assert admin_client.post(_change_url(label), {"value_text": " spaced ", "_save": "Save"}).status_code == 302
    assert _entry("shared", "label").value == " spaced "

    back = admin_client.post(_change_url(entry), {"value_text": "", "use_default": "on", "_save": "Save"})
    assert back.status_code == 302
    got = watcher.wait_for("changed", timeout=30, where=lambda e: e["key"] == "max_rec" and e["new"] == 1000)
    assert got["old"] == 750
    watcher.wait_for("changed", timeout=30, where=lambda e: e["key"] == "label")
    watcher.finish()


def test_topics_are_read_only_in_the_admin_and_configs_cannot_be_added(admin_client: Client) -> None:
    notify("index-built", {"day": "2026-11-23"})
    notify("index-built", {"day": "2026-11-24"})
    listing = admin_client.get("/admin/resource_lease/topic/")
    assert listing.status_code == 200
    html = unescape(listing.content.decode())
    assert "index-built" in html and '"2026-11-24"' in html
    assert admin_client.get("/admin/resource_lease/topic/add/").status_code == 403
    assert admin_client.get("/admin/resource_lease/configentry/add/").status_code == 403
    Config("ns", defaults={"a": 1})
    listing = admin_client.get("/admin/resource_lease/configentry/")
    assert listing.status_code == 200 and "default" in listing.content.decode()


# -- the command ---------------------------------------------------------------------------


def test_inspect_topics_lists_topics_and_configs_as_json_and_as_a_table() -> None:
    notify("index-built", {"day": "2026-11-23"})
    params = Config("talent_rec", defaults={"max_rec": 1000, "min_title_sim": 0.55})
    params.set("max_rec", 800)
    out = StringIO()
    call_command("inspect_topics", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert [(t["name"], t["version"], t["payload"]) for t in report["topics"]] == [
        ("index-built", 1, {"day": "2026-11-23"})
    ]
    configs = {c["key"]: (c["value"], c["stored"], c["version"], c["type"]) for c in report["configs"]}
    assert configs == {"max_rec": (800, True, 1, "int"), "min_title_sim": (0.55, False, 0, "float")}
    table = StringIO()
    call_command("inspect_topics", stdout=table)
    assert "index-built" in table.getvalue() and "0.55 (default)" in table.getvalue()
