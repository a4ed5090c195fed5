"""The lease engine on a 3-node MariaDB Galera cluster (scripts/galera), with real processes.

Runs on the MariaDB backend only (skipped elsewhere, saying why). The cluster is booted once
per session by the same script a user runs; with RESOURCE_LEASE_REQUIRE_GALERA=1 (CI) a
cluster that does not boot fails the run instead of skipping. Each worker process gets its
own DATABASE_URL listing the three nodes in its own order, so clients are spread over the
nodes and fail over when theirs dies. RESOURCE_LEASE_GALERA_SECONDS makes the timed
scenarios run that long (the figures in docs/galera.md); CI runs them for a few seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests import ledger
from tests.ledger import check

pytestmark = pytest.mark.galera

REPO = Path(__file__).resolve().parent.parent
GALERA = REPO / "scripts" / "galera"
PORTS = (3311, 3312, 3313)  # scripts/galera's default RESOURCE_LEASE_GALERA_PORT onwards


def long_seconds(short: float) -> float:
    raw = os.environ.get("RESOURCE_LEASE_GALERA_SECONDS", "").strip()
    return max(short, float(raw)) if raw else short


def galera(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RESOURCE_LEASE_GALERA_PORT": str(PORTS[0])}
    return subprocess.run([str(GALERA), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


@dataclass
class Cluster:
    name: str  # the database the tests use on the cluster

    def url(self, *nodes: int) -> str:
        """A DATABASE_URL listing ``nodes`` (0-based) in that order."""
        hosts = ",".join(f"127.0.0.1:{PORTS[n]}" for n in nodes)
        return f"mysql://root@{hosts}/{self.name}"

    def all_from(self, first: int) -> str:
        """Every node, starting at ``first``."""
        return self.url(*[(first + i) % 3 for i in range(3)])

    def env(self, url: str, other: str | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("RESOURCE_LEASE_TEST_DB_NAME", None)
        env.update(
            DJANGO_SETTINGS_MODULE="tests.galera_settings",
            DATABASE_URL=url,
            PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        if other:
            env["RESOURCE_LEASE_GALERA_OTHER_URL"] = other
        return env

    def query(self, node: int, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run ``sql`` on one node (causal: it first catches up with the cluster)."""
        import MySQLdb

        db = MySQLdb.connect(host="127.0.0.1", port=PORTS[node], user="root", database=self.name, connect_timeout=5)
        try:
            cursor = db.cursor()
            cursor.execute("SET SESSION wsrep_sync_wait = 7")
            cursor.execute(sql, params)
            return list(cursor.fetchall())
        finally:
            db.close()

    def status_sum(self, name: str) -> int:
        """A wsrep status counter summed over the nodes that answer."""
        import MySQLdb

        total = 0
        for port in PORTS:
            try:
                db = MySQLdb.connect(host="127.0.0.1", port=port, user="root", connect_timeout=2)
            except MySQLdb.Error:
                continue
            try:
                cursor = db.cursor()
                cursor.execute("SHOW GLOBAL STATUS LIKE %s", (name,))
                rows = cursor.fetchall()
                total += int(rows[0][1]) if rows else 0
            finally:
                db.close()
        return total


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if connection.vendor != "mysql":
        pytest.skip(f"the Galera tests run on the MariaDB backend only (this run is {connection.vendor})")
    required = os.environ.get("RESOURCE_LEASE_REQUIRE_GALERA") == "1"
    was_up = galera("status").returncode == 0
    started = time.monotonic()
    up = galera("up")
    if up.returncode != 0:
        message = f"the Galera cluster did not boot (scripts/galera up): {(up.stderr or up.stdout)[-3000:]}"
        if required:
            pytest.fail(message)
        pytest.skip(message)
    print(f"galera: cluster up in {time.monotonic() - started:.1f}s ({up.stdout.strip()})")
    import MySQLdb

    name = f"rl_galera_{os.getpid()}"
    db = MySQLdb.connect(host="127.0.0.1", port=PORTS[0], user="root")
    db.cursor().execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    db.close()
    the_cluster = Cluster(name)
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"],
        cwd=REPO,
        env=the_cluster.env(the_cluster.all_from(0)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert migrate.returncode == 0, migrate.stderr
    try:
        yield the_cluster
    finally:
        galera("up")  # a scenario that killed a node leaves the cluster whole for the next
        db = MySQLdb.connect(host="127.0.0.1", port=PORTS[0], user="root")
        db.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        db.close()
        if not was_up:
            galera("down")


@dataclass
class Worker:
    proc: subprocess.Popen[str]
    log: Path  # its stderr (the engine's warnings: failovers, lost leases)

    def events(self, timeout: float) -> list[dict[str, Any]]:
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, f"worker failed ({self.proc.returncode}):\n{out}\n{self.log.read_text()}"
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture
def start(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Worker]]:
    """``start(mode, *args, url=..., other=...)``: a galera_worker process; killed at the end."""
    procs: list[subprocess.Popen[str]] = []
    logs = tmp_path_factory.mktemp("worker-logs")

    def run(mode: str, *args: Any, url: str, other: str | None = None) -> Worker:
        log = logs / f"{mode}-{len(procs)}.log"
        with open(log, "w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.procs.galera_worker", mode, *map(str, args)],
                env=cluster.env(url, other),
                cwd=REPO,
                text=True,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        procs.append(proc)
        return Worker(proc, log)

    yield run
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def setup_pool(start: Callable[..., Worker], cluster: Cluster, kind: str, n: int) -> None:
    start("setup", "--kind", kind, "--resources", n, url=cluster.all_from(0)).events(timeout=60)


def counts(workers: list[Worker], timeout: float) -> dict[str, int]:
    total: dict[str, int] = {}
    for worker in workers:
        for event in worker.events(timeout):
            if event["ev"] == "db_error":
                print(f"galera worker {event}")  # which error, in the test's output
            if event["ev"] == "counts":
                for key, value in event.items():
                    if key not in ("ev", "t"):
                        total[key] = total.get(key, 0) + value
    return total


def grants_by_port(directory: Path) -> list[tuple[int, int]]:
    """(start_ns, port) of every grant the cycle workers made."""
    found = []
    for path in directory.glob("nodes-*"):
        for line in path.read_text().splitlines():
            start_ns, port = line.split()
            found.append((int(start_ns), int(port)))
    return found


# -- configuration (no cluster needed: every backend) ----------------------------------------


def test_a_database_url_with_several_hosts_lists_them_and_waits_for_causality() -> None:
    from resource_lease.db.galera import cluster_hosts
    from resource_lease.db.settings import database_from_url

    config = database_from_url("mysql://app:pw@db1:3307,db2,[::1]:3309/app")
    assert (config["HOST"], config["PORT"], config["NAME"], config["USER"]) == ("db1", 3307, "app", "app")
    assert config["CLUSTER_HOSTS"] == ["db1:3307", "db2:3306", "[::1]:3309"]
    assert cluster_hosts(config) == [("db1", 3307), ("db2", 3306), ("::1", 3309)]
    assert "wsrep_sync_wait = 7" in config["OPTIONS"]["init_command"]
    single = database_from_url("mysql://app:pw@db1:3307/app")
    assert "CLUSTER_HOSTS" not in single and "wsrep_sync_wait" not in single["OPTIONS"]["init_command"]
    with pytest.raises(ValueError, match="mysql"):
        database_from_url("oracle://u@h1,h2/app")


def test_cluster_hosts_accepts_the_documented_forms_and_names_a_bad_entry() -> None:
    from resource_lease.db.galera import HostRotation, cluster_hosts

    entry = {"PORT": "3310", "CLUSTER_HOSTS": ["a", "b:3311", ("c", 3312), "[fe80::1]:3313"]}
    hosts = cluster_hosts(entry)
    assert hosts == [("a", 3310), ("b", 3311), ("c", 3312), ("fe80::1", 3313)]
    assert cluster_hosts({"CLUSTER_HOSTS": "x:1,y:2"}) == [("x", 1), ("y", 2)]
    for bad in (["a:0"], ["a:99999"], [":3306"], [42]):
        with pytest.raises(ValueError, match="CLUSTER_HOSTS"):
            cluster_hosts({"CLUSTER_HOSTS": bad})
    rotation = HostRotation(hosts[:3])
    assert rotation.order()[0] == ("a", 3310)
    rotation.skip()
    assert rotation.order() == [("b", 3311), ("c", 3312), ("a", 3310)]


# -- exclusion -----------------------------------------------------------------------------


def test_exclusion_with_clients_on_every_node_and_renewals_on_another_node(
    cluster: Cluster, start: Callable[..., Worker], tmp_path: Path
) -> None:
    """6 processes, 2 per node, 3 resources: each grant is renewed and released through a
    different node than the one that granted it. No overlap, fences strictly increase, no
    renewal or release refused (each node sees the grant another node made)."""
    setup_pool(start, cluster, "race", 3)
    seconds = long_seconds(4.0)
    args = ("cycle", "--kind", "race", "--dir", tmp_path, "--seconds", seconds, "--hop")
    workers = [start(*args, url=cluster.all_from(i % 3), other=cluster.all_from((i + 1) % 3)) for i in range(6)]
    total = counts(workers, timeout=seconds + 120)
    verdict = check(tmp_path)
    ports = {port for _, port in grants_by_port(tmp_path)}
    print(f"galera exclusion: {verdict.summary()} {total} nodes that granted: {sorted(ports)}")
    assert verdict.grants >= 30, "too few grants for the check to mean anything"
    assert verdict.violations == 0, verdict.summary()
    assert ports == set(PORTS), "every node must have granted leases"
    assert total["hops"] == total["grants"], total
    assert total["renew_refused"] == 0 and total["release_refused"] == 0, total
    # A database error is loud, never unsafe (the checks above are the safety); a certification
    # conflict that outlasted its retries on a loaded machine (CI met one in 619 grants) may
    # surface as one. More than one in a hundred says something is wrong.
    assert total["db_errors"] <= total["grants"] // 100, total


def test_negative_control_get_lock_on_different_nodes_hands_one_lock_twice(
    cluster: Cluster, start: Callable[..., Worker], tmp_path: Path
) -> None:
    """GET_LOCK() locks live in one server's memory and are not replicated: the same ledger
    check must catch two holders of one named lock on two nodes, else it proves nothing."""
    seconds = long_seconds(3.0)
    args = ("cycle", "--kind", "getlock", "--dir", tmp_path, "--seconds", seconds, "--get-lock", "--hold", 0.005)
    workers = [start(*args, url=cluster.url(i % 3)) for i in range(6)]
    counts(workers, timeout=seconds + 60)
    verdict = check(tmp_path)
    print(f"galera negative control (GET_LOCK): {verdict.summary()}")
    assert verdict.grants >= 30
    assert verdict.overlaps or verdict.lost_updates, "the checker did not notice a lock handed out twice"


def test_named_row_created_and_granted_once_by_racers_on_every_node(
    cluster: Cluster, start: Callable[..., Worker], tmp_path: Path
) -> None:
    """The coordination rows (named locks, elections) on Galera: 6 processes on 3 nodes use a
    brand-new name at the same instant. Two nodes inserting the row at once conflict at
    certification; the engine retries, so exactly one is granted (fence 1) and the others
    are refused, none sees an error."""
    go, name = tmp_path / "go", f"galera-{time.time()}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.procs.named_race", "--kind", "@lock", "--name", name, "--go", str(go)],
            env=cluster.env(cluster.all_from(i % 3)),
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
        )
        for i in range(6)
    ]
    try:
        for proc in procs:  # every racer has imported Django and connected: start them together
            assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        go.touch()
        answers = [proc.communicate(timeout=120)[0].strip() for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert all(proc.returncode == 0 for proc in procs), answers
    assert sorted(answers) == ["GRANTED 1"] + ["REFUSED"] * 5, answers


# -- system checks -------------------------------------------------------------------------


def manage_check(cluster: Cluster, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--database", "default"],
        cwd=REPO,
        env=cluster.env(url),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_system_check_passes_the_cluster_and_warns_without_causal_reads(cluster: Cluster) -> None:
    """The URL listing the nodes gets causal reads on the alias's own connections: no
    warning. One node alone does not: W031 says so. A real, healthy cluster otherwise passes
    (primary component, ROW, clocks in step)."""
    listed = manage_check(cluster, cluster.all_from(0))
    assert listed.returncode == 0 and "resource_lease." not in listed.stdout + listed.stderr, listed
    single = manage_check(cluster, cluster.url(1))
    assert "resource_lease.W031" in single.stdout + single.stderr, single
    assert "resource_lease.W03" not in (single.stdout + single.stderr).replace("resource_lease.W031", ""), single


# -- a database server dies ----------------------------------------------------------------


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_node_killed_or_paused_under_holders_then_rejoins(
    cluster: Cluster, start: Callable[..., Worker], tmp_path: Path, fault: str
) -> None:
    """SIGKILL (or SIGSTOP past the ttl) node 2's mariadbd while two holders leased through it
    and 6 cyclers (2 per first node) race on the rest. Killed: the holder that lists every
    node keeps its lease (its renewals move to another node at once). Paused: its renewal
    hangs on the stopped node until the read timeout, so it may lose its lease, loudly, at
    its local deadline. Either way the holder that knows only node 2 loses it at its local
    deadline and its resource is granted again after the ttl, to someone else; cyclers whose
    node died or hung go on through another node; the two others keep quorum. Nothing is
    granted twice, even after SIGCONT (the ledger includes the holders), and node 2 rejoins
    and has every grant the others made while it was away."""
    # Longer than the cluster's stall while it evicts the dead node (about 2 s with
    # scripts/galera's failure detection settings; 5 s or more with Galera's defaults).
    ttl = 6.0
    setup_pool(start, cluster, "kill", 4)
    # A paused node's clients wait out the read timeout (LOCK_WAIT_TIMEOUT + 5 s) first.
    seconds = long_seconds(16.0 if fault == "kill" else 22.0)
    hold_args = ("hold", "--kind", "kill", "--dir", tmp_path, "--ttl", ttl, "--seconds", 600)
    survivor = start(*hold_args, url=cluster.all_from(1))
    single = start(*hold_args, url=cluster.url(1))
    acquired = {}
    for name, holder in (("survivor", survivor), ("single", single)):
        assert holder.proc.stdout is not None
        event = json.loads(holder.proc.stdout.readline())
        assert event["ev"] == "acquired" and event["port"] == PORTS[1], event
        acquired[name] = event
    cycle_args = ("cycle", "--kind", "kill", "--dir", tmp_path, "--seconds", seconds, "--ttl", ttl)
    cyclers = [start(*cycle_args, url=cluster.all_from(i % 3)) for i in range(6)]
    # Kill only once every cycler is granting (a loaded machine starts them slowly).
    _wait_for(
        "every cycler's first grant",
        lambda: sum(1 for p in tmp_path.glob("nodes-*") if p.stat().st_size) == len(cyclers),
    )
    time.sleep(1.0)
    killed_at = time.monotonic_ns()
    kill = galera(fault, "2")
    assert kill.returncode == 0, kill.stderr
    try:
        # Paused past the ttl. A killed node stays down while it restarts (8-10 s, longer than
        # the ttl): the single-host holder's resource comes back meanwhile either way.
        time.sleep(ttl + 3.0 if fault == "pause" else 1.0)
    finally:
        if fault == "pause":
            galera("resume", "2")
    rejoin_started = time.monotonic()
    if fault == "kill":
        rejoin = galera("start", "2")
        assert rejoin.returncode == 0, rejoin.stderr
    else:  # resumed: it finds itself outside the primary component and rejoins by itself
        _wait_for("node 2 to rejoin after SIGCONT", lambda: galera("status").returncode == 0, timeout=120)
    rejoin_seconds = time.monotonic() - rejoin_started

    slow: list[dict[str, Any]] = []
    total: dict[str, int] = {}
    (tmp_path / "stop").touch()  # the holders release now
    for cycler in cyclers:
        for event in cycler.events(timeout=seconds + 120):
            if event["ev"] == "db_error":
                print(f"galera worker {event}")  # which error, in the test's output
            if event["ev"] == "counts":
                for key, value in event.items():
                    if key not in ("ev", "t"):
                        total[key] = total.get(key, 0) + value
            elif event["ev"] in ("slow", "db_error"):
                slow.append(event)
    killed_at_s = killed_at / 1e9
    for event in slow:
        print(
            f"  cycler {event['ev']} {event.get('during')} at kill{event.get('began', event['t']) - killed_at_s:+.2f}s: {event}"
        )
    survivor_events = survivor.events(timeout=60)
    single_events = single.events(timeout=60)
    verdict = check(tmp_path)
    grants = grants_by_port(tmp_path)
    moved = [t for t, port in grants if t > killed_at and port != PORTS[1]]
    after_kill = sorted(t for t, _ in grants if t > killed_at)
    single_pk = acquired["single"]["pk"]
    regrant = [g.start for g in ledger.read(tmp_path) if g.resource == single_pk and g.start > killed_at]

    # Per cycler, its first grant after the kill: the last of them is when every client
    # (those of the dead node included, through another node) was leasing again.
    back = []
    for path in tmp_path.glob("nodes-*"):
        starts = [int(line.split()[0]) for line in path.read_text().splitlines()]
        later = [t for t in starts if t > killed_at]
        if later:
            back.append((min(later) - killed_at) / 1e9)
    figures = {
        "grants": verdict.grants,
        "every_cycler_granting_again_s": max(back) if len(back) == len(cyclers) else None,
        "db_errors": total.get("db_errors", 0),
        "first_grant_after_kill_s": (after_kill[0] - killed_at) / 1e9 if after_kill else None,
        "single_host_resource_back_after_s": (min(regrant) - killed_at) / 1e9 if regrant else None,
        "rejoin_s": round(rejoin_seconds, 1),
    }
    done = [e for e in survivor_events if e["ev"] == "done"]
    figures["listing_holder_kept_its_lease"] = bool(done and done[0]["held"])
    print(f"galera node {fault}: {verdict.summary()} {figures}")
    assert verdict.violations == 0, verdict.summary()
    assert len(done) == 1, (survivor_events, figures)
    # The holder listing every node moves its renewals to another node and keeps its lease
    # (the usual outcome) or, when a renewal waited behind a row lock the dead node's in-flight
    # transaction left (up to LOCK_WAIT_TIMEOUT) on top of the eviction stall, loses it loudly:
    # with this test's short ttl either can happen; never is it both trusted and granted to
    # another (the ledger above).
    kept = done[0]["held"] and done[0]["released"]
    assert kept or any(e["ev"] == "lost" for e in survivor_events), (survivor_events, figures)
    print(f"galera node {fault}: the holder listing every node {'kept' if kept else 'lost (loudly)'} its lease")
    assert any(e["ev"] == "lost" for e in single_events), (single_events, figures)
    assert regrant, f"the resource of the holder whose only node died never came back: {figures}"
    assert moved, f"no grant was made after the kill: {figures}"
    assert len(back) == len(cyclers), f"a cycler never granted again after the kill: {back} {figures}"
    # Node 2 caught up: it has the same rows (holders, fences) as node 1.
    rows = "SELECT id, fence, holder, grant_token FROM resource_lease_resource ORDER BY id"
    on_node_2, on_node_1 = cluster.query(1, rows), cluster.query(0, rows)
    assert on_node_2 == on_node_1, f"node 2 did not catch up: {on_node_2} != {on_node_1}"


def _wait_for(what: str, condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_node_outside_the_primary_component(cluster: Cluster, start: Callable[..., Worker], tmp_path: Path) -> None:
    """Node 3 cut off from the others (gmcast.isolate: a network partition of one node) is
    outside the primary component and answers 1047. A client listing every node, node 3
    first, leases through another node; a client that knows only node 3 gets errors, loudly,
    and no grant. The system check names the node (W030). Then node 3 rejoins."""
    import MySQLdb

    def set_isolate(value: int) -> None:
        db = MySQLdb.connect(host="127.0.0.1", port=PORTS[2], user="root", connect_timeout=5)
        try:
            db.cursor().execute(f"SET GLOBAL wsrep_provider_options = 'gmcast.isolate={value}'")
        finally:
            db.close()

    def node3_status() -> str:
        db = MySQLdb.connect(host="127.0.0.1", port=PORTS[2], user="root", connect_timeout=5)
        try:
            cursor = db.cursor()
            cursor.execute("SHOW STATUS LIKE 'wsrep_local_state_comment'")
            state = cursor.fetchone()[1]
            cursor.execute("SHOW STATUS LIKE 'wsrep_cluster_status'")
            return f"{cursor.fetchone()[1]} {state}"
        finally:
            db.close()

    setup_pool(start, cluster, "iso", 2)
    set_isolate(1)
    try:
        _wait_for("node 3 to leave the primary component", lambda: node3_status().startswith("non-Primary"))
        listed = start("cycle", "--kind", "iso", "--dir", tmp_path, "--seconds", 2, url=cluster.all_from(2))
        alone = start("cycle", "--kind", "iso", "--dir", tmp_path, "--seconds", 2, url=cluster.url(2))
        listed_counts, alone_counts = counts([listed], timeout=120), counts([alone], timeout=120)
        check_output = manage_check(cluster, cluster.all_from(0))
    finally:
        set_isolate(0)
    _wait_for("node 3 to rejoin", lambda: node3_status() == "Primary Synced")
    ports = {port for _, port in grants_by_port(tmp_path)}
    print(f"galera isolated node: listed {listed_counts}, alone {alone_counts}, granted on {sorted(ports)}")
    assert listed_counts["grants"] > 0 and listed_counts["db_errors"] == 0, listed_counts
    assert PORTS[2] not in ports
    assert alone_counts["grants"] == 0 and alone_counts["db_errors"] > 0, alone_counts
    assert "resource_lease.W030" in check_output.stdout + check_output.stderr, check_output
    assert check(tmp_path).violations == 0


LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")


def test_a_node_clock_ahead_is_reported_and_ends_leases_early(
    cluster: Cluster, start: Callable[..., Worker], tmp_path: Path
) -> None:
    """The clock assumption, shown to matter: node 3 restarted with its clock 20 s ahead
    (libfaketime). The system check reports the skew (W036). And a lease granted through
    node 1 for 10 s is taken through node 3 a moment later, because by node 3's clock it has
    expired: the ledger sees two holders. This is why nodes must be in NTP sync well within
    the safety margin; the engine cannot detect it per statement."""
    if not LIBFAKETIME.exists():
        pytest.skip(f"{LIBFAKETIME} not found (apt-get install faketime)")
    assert galera("kill", "3").returncode == 0
    try:
        skewed = subprocess.run(
            [str(GALERA), "start", "3"],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=REPO,
            env={**os.environ, "RESOURCE_LEASE_GALERA_FAKETIME": "+20s"},
        )
        assert skewed.returncode == 0, skewed.stderr
        checked = manage_check(cluster, cluster.all_from(0))
        assert "resource_lease.W036" in checked.stdout + checked.stderr, checked

        setup_pool(start, cluster, "skew", 1)
        holder = start("hold", "--kind", "skew", "--dir", tmp_path, "--ttl", 10, "--seconds", 600, url=cluster.url(0))
        assert holder.proc.stdout is not None
        assert json.loads(holder.proc.stdout.readline())["ev"] == "acquired"
        taker = start("cycle", "--kind", "skew", "--dir", tmp_path, "--seconds", 2, url=cluster.url(2))
        taken = counts([taker], timeout=120)
        (tmp_path / "stop").touch()
        holder.events(timeout=60)
        verdict = check(tmp_path)
        print(f"galera node clock +20s: {verdict.summary()} taker {taken}")
        assert taken["grants"] > 0 and verdict.overlaps, "a node 20 s ahead did not end a 10 s lease early"
    finally:
        galera("kill", "3")
        restored = galera("start", "3")
    assert restored.returncode == 0, restored.stderr


# -- figures -------------------------------------------------------------------------------


def test_throughput_one_node_vs_spread_over_three(
    cluster: Cluster, start: Callable[..., Worker], tmp_path: Path
) -> None:
    """Figures, not assertions on speed: acquire/release cycles per second of 8 processes on 8
    resources, all through node 1, then spread over the three nodes (same run), and the
    certification conflicts per 1,000 grants (write sets the cluster rejected or aborted,
    which the engine retried). Both runs are also exclusion checks. Long mode only: process
    start-up dominates a few seconds' run, and CI's exclusion checks are the tests above."""
    if not os.environ.get("RESOURCE_LEASE_GALERA_SECONDS"):
        pytest.skip("figures only: set RESOURCE_LEASE_GALERA_SECONDS (e.g. 20) to measure")
    seconds = long_seconds(3.0)
    figures = {}
    for label, first_nodes in (("one node", [0] * 8), ("three nodes", [i % 3 for i in range(8)])):
        kind = "bench-" + label.split()[0]
        directory = tmp_path / kind
        directory.mkdir()
        setup_pool(start, cluster, kind, 8)
        conflicts_before = cluster.status_sum("wsrep_local_cert_failures") + cluster.status_sum("wsrep_local_bf_aborts")
        args = ("cycle", "--kind", kind, "--dir", directory, "--seconds", seconds, "--hold", 0)
        workers = [start(*args, url=cluster.all_from(first)) for first in first_nodes]
        total = counts(workers, timeout=seconds + 120)
        conflicts = (
            cluster.status_sum("wsrep_local_cert_failures")
            + cluster.status_sum("wsrep_local_bf_aborts")
            - conflicts_before
        )
        verdict = check(directory)
        assert verdict.violations == 0, f"{label}: {verdict.summary()}"
        assert total["grants"] > 0
        figures[label] = {
            "cycles_per_s": round(total["grants"] / seconds),
            "conflicts_per_1000_grants": round(1000 * conflicts / total["grants"], 1),
            "db_errors": total["db_errors"],
        }
    print(f"galera throughput, 8 processes, {seconds:g}s each: {figures}")


# -- what fenced() relies on ---------------------------------------------------------------


def _race_fenced_commit_with_grant(cluster: Cluster, *, lock_row: bool, rounds: int) -> tuple[int, int, int]:
    """A transaction on node 1 reads the lease row (FOR UPDATE, as ``Lease.fenced()`` does, or
    a plain read: the broken variant) and writes elsewhere; a grant on node 2 updates the row
    while it commits. Returns (aborted, committed, committed but ordered after the grant)."""
    import threading

    import MySQLdb

    def connect(node: int) -> Any:
        db = MySQLdb.connect(host="127.0.0.1", port=PORTS[node], user="root", database=cluster.name)
        db.cursor().execute("SET SESSION wsrep_sync_wait = 7")
        return db

    setup = connect(0)
    cursor = setup.cursor()
    cursor.execute("CREATE TABLE IF NOT EXISTS fenced_race (id INT PRIMARY KEY, v INT)")
    cursor.execute("CREATE TABLE IF NOT EXISTS fenced_writes (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
    cursor.execute("REPLACE INTO fenced_race VALUES (1, 0)")
    setup.commit()
    setup.close()
    a, b = connect(0), connect(1)
    ca, cb = a.cursor(), b.cursor()
    aborted = committed = after = 0
    for i in range(rounds):
        ca.execute("BEGIN")
        ca.execute("SELECT v FROM fenced_race WHERE id = 1" + (" FOR UPDATE" if lock_row else ""))
        ca.fetchall()
        ca.execute("INSERT INTO fenced_writes (v) VALUES (1)")
        seqno: dict[str, int | None] = {}

        def commit_a(seqno: dict[str, int | None] = seqno) -> None:
            try:
                a.commit()
            except MySQLdb.OperationalError:  # 1213: aborted by the grant's write set
                seqno["a"] = None
                return
            ca.execute("SELECT WSREP_LAST_WRITTEN_GTID()")
            seqno["a"] = int(str(ca.fetchone()[0]).rsplit("-", 1)[-1].strip("'"))

        def grant_b(seqno: dict[str, int | None] = seqno) -> None:
            cb.execute("UPDATE fenced_race SET v = v + 1 WHERE id = 1")
            b.commit()
            cb.execute("SELECT WSREP_LAST_WRITTEN_GTID()")
            seqno["b"] = int(str(cb.fetchone()[0]).rsplit("-", 1)[-1].strip("'"))

        grant = threading.Thread(target=grant_b)
        grant.start()
        time.sleep(0.0005 * (i % 8))  # the grant lands before, during and after the commit
        commit_a()
        grant.join()
        if seqno["a"] is None:
            aborted += 1
            a.rollback()
            continue
        committed += 1
        after += seqno["a"] > (seqno["b"] or 0)
    a.close()
    b.close()
    return aborted, committed, after


def test_a_fenced_transaction_never_commits_after_a_grant_made_on_another_node(cluster: Cluster) -> None:
    """``Lease.fenced()`` locks the lease row in the caller's transaction. On Galera that lock
    is local to one node, yet a grant another node certifies either aborts the transaction
    (the applier's brute-force abort, a deadlock error) or is ordered after its commit:
    never a fenced write committed after the new grant. Negative control: the same race
    without the row lock commits writes ordered after the grant, and the check sees it."""
    rounds = int(long_seconds(2.0) * 40)
    aborted, committed, after = _race_fenced_commit_with_grant(cluster, lock_row=True, rounds=rounds)
    print(f"galera fenced race (FOR UPDATE): aborted={aborted} committed={committed} after_grant={after}")
    assert after == 0
    assert aborted > 0 and committed > 0, "the race never hit one side: it proves nothing"
    _, unlocked_committed, unlocked_after = _race_fenced_commit_with_grant(cluster, lock_row=False, rounds=rounds)
    print(f"galera fenced race, negative control (no lock): committed={unlocked_committed} after={unlocked_after}")
    assert unlocked_after > 0, "the check did not notice writes committed after the grant"
