"""seed_proxies, inspect_pool, prune_lease_events and prune_cooldowns, as an operator runs them."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db.models import F
from django.utils import timezone

from resource_lease import Lease, acquire
from resource_lease.models import LeaseEvent, Resource
from resource_lease.pool import quarantine
from tests.conftest import REPO, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

GOOD = """\
# a proxy list: blank lines and comments are fine

10.0.0.1:8080
HTTP://Proxy.Example.COM:3128/     # trailing comment
socks5://alice:s3cret@192.0.2.7:1080
https://bob@gw.example:443
[2001:DB8::1]:3128
"""


def expire_unreleased(lease: Lease) -> None:
    """The lease runs out unreleased: its expiry set back to its grant (the database's clock).
    Not a 0.2 s ttl and a sleep: on a loaded machine such a grant may answer too late to be
    trusted, and acquire() hands nothing out (docs/pitfalls.md#late-answers)."""
    Resource.objects.filter(pk=lease.resource.pk).update(busy_before=F("acquired_at"))


def run(*args: Any, stdin: str | None = None, **options: Any) -> str:
    out = io.StringIO()
    if stdin is not None:
        options["stdin"] = io.StringIO(stdin)
    call_command(*args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def write(tmp_path: Path, text: str, name: str = "proxies.txt") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def urls(kind: str = "proxy") -> dict[str, str]:
    return dict(Resource.objects.filter(kind=kind).values_list("name", "data__url"))


# -- seed_proxies ------------------------------------------------------------------------


def test_seed_stores_normalised_urls_named_user_host_port(tmp_path: Path) -> None:
    out = run("seed_proxies", write(tmp_path, GOOD))

    assert urls() == {
        "10.0.0.1:8080": "http://10.0.0.1:8080",
        "proxy.example.com:3128": "http://proxy.example.com:3128",
        "alice@192.0.2.7:1080": "socks5://alice:s3cret@192.0.2.7:1080",
        "bob@gw.example:443": "https://bob@gw.example:443",
        "[2001:db8::1]:3128": "http://[2001:db8::1]:3128",
    }
    assert "5 added, 0 updated, 0 unchanged" in out
    assert "s3cret" not in out


def test_seed_twice_adds_no_duplicates(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD + "10.0.0.1:8080\n")  # a repeated line is skipped, not an error
    first = run("seed_proxies", path)
    second = run("seed_proxies", path)

    assert Resource.objects.count() == 5
    assert "1 duplicate line skipped" in first
    assert "0 added, 0 updated, 5 unchanged" in second


def test_seed_updates_a_changed_url_and_keeps_the_rest_of_the_payload(tmp_path: Path) -> None:
    run("seed_proxies", write(tmp_path, "socks5://alice:old@192.0.2.7:1080\n10.0.0.1:80\n"))
    Resource.objects.filter(name="alice@192.0.2.7:1080").update(data={"url": "x", "region": "eu"})
    lease = acquire("proxy", ttl=60)  # a leased proxy is updated too, its lease untouched

    out = run("seed_proxies", write(tmp_path, "socks5://alice:new@192.0.2.7:1080\nhttps://10.0.0.1:80\n"))

    assert "0 added, 2 updated, 0 unchanged" in out
    assert Resource.objects.get(name="alice@192.0.2.7:1080").data == {
        "url": "socks5://alice:new@192.0.2.7:1080",
        "region": "eu",
    }
    assert Resource.objects.get(name="10.0.0.1:80").data == {"url": "https://10.0.0.1:80"}
    assert lease.is_held() and Resource.objects.get(pk=lease.resource.pk).fence == lease.fence


def test_a_bad_line_is_reported_by_number_and_nothing_is_written(tmp_path: Path) -> None:
    text = "10.0.0.1:8080\nno-port-here\n\nftp://10.0.0.2:21\nsocks5://u:p@10.0.0.3:99999\n10.0.0.4:80\n"

    with pytest.raises(CommandError) as error:
        run("seed_proxies", write(tmp_path, text))

    message = str(error.value)
    assert "3 bad lines, nothing was written" in message
    assert "line 2: missing port" in message
    assert "line 4: unsupported scheme 'ftp'" in message
    assert "line 5: bad port" in message
    assert "line 1:" not in message and "line 6:" not in message
    assert "u:p@" not in message  # the password is masked in the report
    assert Resource.objects.count() == 0


def test_conflicting_urls_for_one_proxy_are_a_bad_line(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match=r"line 3: alice@h:1 is already on line 1 with another URL"):
        run("seed_proxies", write(tmp_path, "http://alice:a@h:1\n# x\nsocks5://alice:b@h:1\n"))
    assert Resource.objects.count() == 0


def test_not_utf8_is_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"10.0.0.1:80\nh\xe9:80\n")
    with pytest.raises(CommandError, match=r"line 2: not UTF-8"):
        run("seed_proxies", str(path))
    assert Resource.objects.count() == 0


def test_bad_arguments_are_command_errors(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match=r"cannot read .*missing\.txt"):
        run("seed_proxies", str(tmp_path / "missing.txt"))
    with pytest.raises(CommandError, match=r"--kind.*non-empty"):
        run("seed_proxies", write(tmp_path, GOOD), "--kind", " ")
    with pytest.raises(CommandError, match=r"--database"):
        run("seed_proxies", write(tmp_path, GOOD), "--database", "nope")
    assert Resource.objects.count() == 0


def test_seed_reads_stdin_with_a_dash() -> None:
    out = run("seed_proxies", "-", "--kind", "socks", stdin="10.0.0.9:1080\n")
    assert urls("socks") == {"10.0.0.9:1080": "http://10.0.0.9:1080"}
    assert "standard input" in out


def test_seed_reads_a_real_pipe() -> None:
    proc = subprocess.run(
        [sys.executable, "manage.py", "seed_proxies", "-", "--json"],
        input=b"10.0.0.1:80\nsocks5://u:p@10.0.0.2:1080\n",
        env=worker_env(),
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout)["added"] == 2
    assert proc.stderr == b""  # no progress indicator when not on a terminal
    assert set(urls()) == {"10.0.0.1:80", "u@10.0.0.2:1080"}


def test_progress_is_shown_on_a_terminal_only(tmp_path: Path) -> None:
    path = write(tmp_path, "".join(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:8080\n" for i in range(20_000)))
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "seed_proxies", path],
        env=worker_env(),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=secondary,
    )
    os.close(secondary)
    terminal = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([primary], [], [], 1)
        if ready:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            terminal += chunk
        elif proc.poll() is not None:
            break
    stdout = proc.communicate(timeout=60)[0].decode()
    os.close(primary)

    assert proc.returncode == 0
    assert b"reading: 5,000 lines" in terminal
    assert b"writing: 20,000/20,000" in terminal
    assert "20000 added" in stdout
    assert Resource.objects.count() == 20_000


def test_replace_removes_what_is_not_listed_but_never_a_leased_resource(tmp_path: Path) -> None:
    run("seed_proxies", write(tmp_path, "10.0.0.1:80\n10.0.0.2:80\n10.0.0.3:80\n"))
    lease = acquire("proxy", ttl=60, holder="crawler-7")
    kept = lease.resource.name

    out = run("seed_proxies", write(tmp_path, "10.0.0.9:80\n"), "--replace")

    assert set(urls()) == {"10.0.0.9:80", kept}
    assert "1 added, 0 updated, 0 unchanged, 2 removed (not in the list)" in out
    assert "Kept 1 not in the list because it is leased right now" in out
    assert f"{kept}  (held by crawler-7)" in out
    assert lease.is_held()

    assert lease.release()
    out = run("seed_proxies", write(tmp_path, "10.0.0.9:80\n"), "--replace")
    assert set(urls()) == {"10.0.0.9:80"}
    assert "1 removed" in out


def test_replace_removes_a_quarantined_or_expired_resource(tmp_path: Path) -> None:
    run("seed_proxies", write(tmp_path, "10.0.0.1:80\n10.0.0.2:80\n"))
    quarantine(Resource.objects.filter(name="10.0.0.1:80"), reason="dead", seconds=600)
    expire_unreleased(acquire("proxy", ttl=60, holder="gone"))

    out = run("seed_proxies", write(tmp_path, "10.0.0.3:80\n"), "--replace", "--json")

    assert json.loads(out)["removed"] == 2
    assert set(urls()) == {"10.0.0.3:80"}


def test_replace_with_an_empty_list_is_refused(tmp_path: Path) -> None:
    run("seed_proxies", write(tmp_path, GOOD))
    with pytest.raises(CommandError, match=r"has no proxies: --replace would remove every resource"):
        run("seed_proxies", write(tmp_path, "# nothing\n"), "--replace")
    assert Resource.objects.count() == 5


def test_dry_run_writes_nothing_and_says_what_would_change(tmp_path: Path) -> None:
    run("seed_proxies", write(tmp_path, "10.0.0.1:80\n10.0.0.2:80\n"))
    lease = acquire("proxy", ttl=60, holder="worker-1")  # one of those two
    run("seed_proxies", write(tmp_path, "socks5://u:a@10.0.0.3:80\n"))
    before = list(Resource.objects.order_by("pk").values())

    out = run("seed_proxies", write(tmp_path, "socks5://u:b@10.0.0.3:80\n10.0.0.4:80\n"), "--replace", "--dry-run")

    assert list(Resource.objects.order_by("pk").values()) == before
    assert out.startswith("Dry run:")
    assert "1 would be added, 1 would be updated, 0 unchanged, 1 would be removed (not in the list)" in out
    assert f"{lease.resource.name}  (held by worker-1)" in out


def test_seed_json_summary() -> None:
    out = run("seed_proxies", "-", "--json", stdin="10.0.0.1:80\n10.0.0.1:80\n10.0.0.2:80\n")
    assert json.loads(out) == {
        "kind": "proxy",
        "dry_run": False,
        "proxies": 2,
        "duplicate_lines": 1,
        "added": 2,
        "updated": 0,
        "unchanged": 0,
        "removed": 0,
        "kept": [],
    }


def test_sample_list_in_the_repository_loads() -> None:
    path = REPO / "resource_lease" / "samples" / "sample_proxies.txt"
    listed = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]

    summary = json.loads(run("seed_proxies", str(path), "--json"))

    assert summary["added"] == len(listed) == Resource.objects.filter(kind="proxy").count()


# -- inspect_pool ------------------------------------------------------------------------


def test_inspect_pool_json_shows_each_state_by_the_database_clock(make_pool: Any) -> None:
    make_pool("proxy", 4)
    make_pool("gpu", 1)
    Resource.objects.filter(name="proxy-0").update(data={"url": "socks5://u:secret@10.0.0.1:1080"})
    Resource.objects.filter(kind="proxy", name="proxy-3").update(enabled=False)
    lease = acquire("proxy", ttl=60, holder="worker-9")
    other = Resource.objects.filter(kind="proxy", enabled=True).exclude(pk=lease.resource.pk).first()
    quarantine([other], reason="slow", seconds=600)

    out = run("inspect_pool", "--json")
    report = json.loads(out)

    assert report["counts"]["proxy"] == {
        "free": 1,
        "held": 1,
        "expired": 0,
        "quarantined": 1,
        "disabled": 1,
        "total": 4,
    }
    assert report["counts"]["gpu"]["free"] == 1
    rows = {(r["kind"], r["name"]): r for r in report["resources"]}
    held = rows[("proxy", lease.resource.name)]
    assert held["state"] == "held"
    assert held["holder"] == "worker-9"
    assert held["fence"] == lease.fence
    assert 50 < held["time_left"] <= 60
    quarantined = next(r for r in report["resources"] if r["state"] == "quarantined")
    assert quarantined["quarantine_reason"] == "slow"
    assert 590 < quarantined["quarantine_left"] <= 600
    assert quarantined["holder"] is None
    assert rows[("proxy", "proxy-0")]["url"] == "socks5://u:***@10.0.0.1:1080"
    assert "secret" not in out


def test_inspect_pool_table_and_counts(make_pool: Any, settings: Any) -> None:
    # The expired row must stay expired: worker-2 takes a never-used row, the least recently
    # used, which is what acquire() takes only with probing off (else a random free row).
    settings.RESOURCE_LEASE = {"PROBE_REFRESH": 0}
    make_pool("proxy", 3)
    expire_unreleased(acquire("proxy", ttl=60, holder="vanished"))
    lease = acquire("proxy", ttl=120, holder="worker-2")

    out = run("inspect_pool", "--kind", "proxy")

    header, *lines = out.splitlines()
    assert header.split()[:5] == ["KIND", "NAME", "STATE", "HOLDER", "FENCE"]
    row = next(line for line in lines if lease.resource.name in line)
    assert "held" in row and "worker-2" in row and ("1m 5" in row or "2m 00s" in row)
    assert any("expired" in line and "vanished" in line for line in lines)
    assert "proxy: 3 total: 1 free, 1 held, 1 expired, 0 quarantined, 0 disabled" in out


def test_inspect_pool_state_filter_keeps_full_counts(make_pool: Any) -> None:
    make_pool("proxy", 3)
    acquire("proxy", ttl=60)
    report = json.loads(run("inspect_pool", "--state", "held", "--json"))
    assert [r["state"] for r in report["resources"]] == ["held"]
    assert report["counts"]["proxy"]["total"] == 3


def test_inspect_pool_bad_input(make_pool: Any) -> None:
    make_pool("proxy", 1)
    with pytest.raises(CommandError, match=r"no resources of kind 'nope' \(kinds: proxy\)"):
        run("inspect_pool", "--kind", "nope")
    with pytest.raises(CommandError, match=r"--state"):
        run("inspect_pool", "--state", "sleepy")


def test_inspect_pool_on_an_empty_pool() -> None:
    assert "The pool is empty" in run("inspect_pool")
    assert json.loads(run("inspect_pool", "--json"))["resources"] == []


# -- prune_lease_events ------------------------------------------------------------------


def _event(age_days: float) -> LeaseEvent:
    return LeaseEvent(at=timezone.now() - dt.timedelta(days=age_days), event="granted", kind="proxy", name="p")


def test_prune_deletes_events_older_than_the_retention() -> None:
    LeaseEvent.objects.bulk_create([_event(40), _event(31), _event(29), _event(0)])

    assert "2 lease events are older than 30 days" in run("prune_lease_events", "--dry-run")
    assert LeaseEvent.objects.count() == 4
    assert "Deleted 2 lease events older than 30 days" in run("prune_lease_events")
    assert LeaseEvent.objects.count() == 2
    assert "Deleted 1 lease events older than 1 days" in run("prune_lease_events", "--days", "1")
    assert LeaseEvent.objects.count() == 1


def test_prune_rejects_a_bad_age() -> None:
    for bad in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(CommandError, match=r"--days"):
            run("prune_lease_events", "--days", bad)
        with pytest.raises(CommandError, match=r"--days"):
            run("prune_cooldowns", "--days", bad)


# -- prune_cooldowns ---------------------------------------------------------------------


def test_prune_cooldowns_deletes_those_that_ended_long_ago_and_refuses_a_window_it_would_cut() -> None:
    from resource_lease import pool_policy
    from resource_lease.models import Cooldown
    from resource_lease.pool import database_now

    now = database_now()
    proxy = Resource.objects.create(kind="proxy", name="p1")
    Cooldown.objects.bulk_create(
        Cooldown(resource=proxy, target=f"site-{i}.example", until=now + dt.timedelta(days=offset), recent=[])
        for i, offset in enumerate((-10, -8, -1, 1 / 24))
    )
    assert "Dry run: 2 cooldowns ended more than 7 days ago" in run("prune_cooldowns", "--dry-run")
    assert Cooldown.objects.count() == 4
    assert "Deleted 2 cooldowns that ended more than 7 days ago" in run("prune_cooldowns")
    assert sorted(Cooldown.objects.values_list("target", flat=True)) == ["site-2.example", "site-3.example"]
    # A policy whose target_rate window is longer than --days: its grant times still count.
    pool_policy("proxy", target_rate=(10, 2 * 86400))
    with pytest.raises(CommandError, match=r"target_rate window of kind 'proxy' \(172800 s\)"):
        run("prune_cooldowns", "--days", "0.5")
    assert Cooldown.objects.count() == 2  # nothing deleted
    assert "Deleted 0 cooldowns that ended more than 2 days ago" in run("prune_cooldowns", "--days", "2")
    assert Cooldown.objects.count() == 2  # site-2 ended a day ago
