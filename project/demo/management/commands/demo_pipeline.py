"""A nightly recommender pipeline, once written by hand on ZooKeeper, on the database alone.

    python manage.py demo_pipeline [--workers 4] [--users 1000] [--ttl 4]

N worker processes join the group "recommender", pass a first DoubleBarrier, each computes
its share of the users by the frozen cohort (``user % size == index``), leave it (which waits
until every share is computed), pass a second barrier, and the cohort's index 0 (the leader)
"rebuilds the index" from every worker's results, records the completion (a fenced write of
a state row) and notifies the topic ``recs:index-built``, the daily "task A is done,
start task B" signal, which the coordinator watches. One worker is SIGKILLed after joining, before the first
barrier, and a replacement joins. The summary proves every user was computed exactly once.

Each worker is this command again with ``--worker NAME``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from project.arguments import positive, positive_int
from resource_lease import DoubleBarrier, Group, named, notify, watch

GROUP = "recommender"
STATE_KIND = named.row_kind("pipeline")
#: The signal that task A (the index) is done and task B may start.
TOPIC = "recs:index-built"


def say(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class Command(BaseCommand):
    help = "The nightly recommender pipeline: a group, two barriers, a share per worker, one rebuild."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workers", type=positive_int, default=4)
        parser.add_argument("--users", type=positive_int, default=1000)
        parser.add_argument("--ttl", type=positive, default=4.0)
        parser.add_argument("--worker", help="(internal) run as the worker with this member name")
        parser.add_argument("--run", help="(internal) the run's id")
        parser.add_argument("--stall", action="store_true", help="(internal) join, then wait to be killed")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["worker"]:
            self.work(options)
        else:
            self.coordinate(options)

    # -- one worker --------------------------------------------------------------------

    def work(self, options: dict[str, Any]) -> None:
        member, run, ttl = options["worker"], options["run"], options["ttl"]
        size, users = options["workers"], options["users"]
        results = Path(settings.BASE_DIR) / "var" / "demo_pipeline" / run
        group = Group(GROUP, ttl=ttl, member=member, data={"pid": os.getpid(), "run": run}).join()
        say(event="joined", member=member, pid=os.getpid(), members=group.members())
        if options["stall"]:
            while True:  # the victim: a member that hangs before the barrier, then is killed
                time.sleep(60)

        computing = DoubleBarrier("recs:compute", size, ttl=ttl, member=member)
        cohort = computing.enter(timeout=300)
        index, n = computing.index, computing.size
        mine = [user for user in range(users) if user % n == index]
        # For contrast, the ZooKeeper version's way: n and index from this worker's own live view of the
        # group at this moment (not used for the work).
        view, seed_index = group.view()
        seed = [user for user in range(users) if user % len(view) == seed_index]
        time.sleep(0.001 * len(mine))  # the recommendations being computed
        (results / f"{member}.json").write_text(json.dumps({"member": member, "users": mine}))
        say(
            event="computed",
            member=member,
            round=computing.round,
            cohort=cohort,
            index=index,
            size=n,
            users=mine,
            seed_view=view,
            seed_users=seed,
        )
        computing.leave(timeout=300)  # returns when every share of the cohort is computed

        rebuild = DoubleBarrier("recs:rebuild", size, ttl=ttl, member=member)
        rebuild.enter(timeout=300)
        if rebuild.index == 0:
            self.rebuild_index(member, run, ttl, results)
        rebuild.leave(timeout=300)
        group.leave()
        say(event="done", member=member, leader=rebuild.index == 0)

    def rebuild_index(self, member: str, run: str, ttl: float, results: Path) -> None:
        """The leader's job: merge every worker's results into the index, then record the
        completion on the run's state row (a fenced write: only under a live grant)."""
        lease = None
        while lease is None:  # at most one rebuild at a time, even if two thought they led
            lease = named.try_grant("default", STATE_KIND, run, holder=member, ttl=max(ttl, 30.0))
            if lease is None:
                time.sleep(0.2)
        try:
            per_user: Counter[int] = Counter()
            files = sorted(results.glob("w-*.json"))
            for path in files:
                per_user.update(json.loads(path.read_text())["users"])
            (results / "index.json").write_text(json.dumps(sorted(per_user)))
            state = {
                "index_built": True,
                "by": member,
                "result_files": len(files),
                "users_indexed": len(per_user),
                "computed_twice": sum(1 for c in per_user.values() if c > 1),
            }
            if not named.write_data(lease, state):
                raise CommandError("the rebuild's lease was lost: completion not recorded")
            version = notify(TOPIC, payload={"run": run, **state})  # task B may start
            say(event="rebuilt", member=member, version=version, **state)
        finally:
            lease.release()

    # -- the coordinator -----------------------------------------------------------------

    def manage(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "demo_pipeline", *args],
            text=True,
            stdout=subprocess.PIPE,
        )

    def coordinate(self, options: dict[str, Any]) -> None:
        workers, users, ttl = options["workers"], options["users"], options["ttl"]
        if workers < 2:
            raise CommandError("--workers must be at least 2 (one of them is killed)")
        db = settings.DATABASES["default"]
        self.stdout.write(self.style.MIGRATE_HEADING(f"Database: {db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']}"))
        call_command("migrate", verbosity=0)
        run = f"{time.strftime('%Y-%m-%d')}-{secrets.token_hex(3)}"
        (Path(settings.BASE_DIR) / "var" / "demo_pipeline" / run).mkdir(parents=True)
        common = ["--run", run, "--workers", str(workers), "--users", str(users), "--ttl", str(ttl)]
        self.stdout.write(f"Run {run}: {workers} workers, {users} users, ttl {ttl:g}s.")

        # Task B's trigger: a watch on the topic the leader notifies once the index is built.
        signals: list[dict[str, Any]] = []
        task_b = watch(
            TOPIC, lambda payload, version: signals.append({"version": version, **(payload or {})}), poll=0.5
        )

        victim = self.manage("--worker", f"w-{workers - 1}-victim", "--stall", *common)
        procs = [self.manage("--worker", f"w-{i}", *common) for i in range(workers - 1)]
        observer = Group(GROUP)
        deadline = time.monotonic() + 120
        while len([m for m in observer.members() if m.startswith("w-")]) < workers:
            if time.monotonic() > deadline:
                raise CommandError("the workers did not all join the group")
            time.sleep(0.1)
        self.stdout.write(f"Group {GROUP!r}: {', '.join(observer.members())} (all joined).")

        victim.send_signal(signal.SIGKILL)
        victim.wait()
        killed_at = time.monotonic()
        self.stdout.write(f"Killed w-{workers - 1}-victim (SIGKILL) before it reached the first barrier.")
        replacement = self.manage("--worker", f"w-{workers - 1}", *common)
        procs.append(replacement)
        self.stdout.write(f"Started the replacement w-{workers - 1}.")
        while f"w-{workers - 1}-victim" in observer.members():
            if time.monotonic() - killed_at > ttl + 30:
                raise CommandError("the killed worker never left the group")
            time.sleep(0.05)
        self.stdout.write(
            f"The killed worker left every member's view {time.monotonic() - killed_at:.2f}s after the kill"
            f" (ttl {ttl:g}s); nobody cleaned up."
        )

        reports: list[dict[str, Any]] = []
        for proc in procs:
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise CommandError(f"a worker failed with exit code {proc.returncode}")
            reports += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        deadline = time.monotonic() + 10
        while not any(s.get("run") == run for s in signals) and time.monotonic() < deadline:
            time.sleep(0.05)
        task_b.stop()
        self.summarise(reports, run, users, [s for s in signals if s.get("run") == run])

    def summarise(self, reports: list[dict[str, Any]], run: str, users: int, signals: list[dict[str, Any]]) -> None:
        computed = [r for r in reports if r["event"] == "computed"]
        per_user = Counter(u for r in computed for u in r["users"])
        twice = sorted(u for u, c in per_user.items() if c > 1)
        never = sorted(set(range(users)) - set(per_user))
        views = {(tuple(r["cohort"]), r["size"]) for r in computed}
        state_row = named.read("default", STATE_KIND, [run]).rows.get(run)
        state = state_row.data if state_row is not None else {}

        self.stdout.write(self.style.MIGRATE_HEADING("Summary"))
        for r in sorted(computed, key=lambda r: r["index"]):
            self.stdout.write(
                f"  {r['member']}: round {r['round']}, cohort index {r['index']} of {r['size']}, {len(r['users'])} users"
            )
        self.stdout.write(f"  cohort views: {len(views)} (the same frozen cohort for every worker: {len(views) == 1})")
        self.stdout.write(f"  users computed: {len(per_user)} of {users}; twice: {len(twice)}; never: {len(never)}")
        seed_per_user = Counter(u for r in computed for u in r["seed_users"])
        seed_views = {tuple(r["seed_view"]) for r in computed}
        self.stdout.write(
            f"  for contrast, the old ZooKeeper way (n and index from each worker's own live group view):"
            f" {len(seed_views)} different views, {sum(1 for c in seed_per_user.values() if c > 1)} users twice,"
            f" {len(set(range(users)) - set(seed_per_user))} never"
        )
        self.stdout.write(
            f"  index rebuilt by {state.get('by')} (cohort index 0 of the second barrier): "
            f"{state.get('users_indexed')} users from {state.get('result_files')} result files;"
            f" completion recorded: {bool(state.get('index_built'))}"
        )
        for signal_ in signals:
            self.stdout.write(
                f"  task B's watch got {TOPIC!r} version {signal_['version']}: index built by {signal_.get('by')},"
                f" {signal_.get('users_indexed')} users"
            )
        if not signals:
            self.stdout.write(f"  task B's watch got no {TOPIC!r} notification")
        self.stdout.write(self.style.MIGRATE_HEADING("Groups and barriers as an operator sees them (inspect_groups)"))
        call_command("inspect_groups", stdout=self.stdout)
        ok = len(views) == 1 and not twice and not never and state.get("users_indexed") == users and len(signals) == 1
        if not ok:
            raise CommandError(
                f"not exactly once: twice {twice[:10]}, never {never[:10]}, state {state}, notifications {signals}"
            )
        self.stdout.write(
            self.style.SUCCESS("Every user was computed exactly once; the index was rebuilt once, and task B was told.")
        )
