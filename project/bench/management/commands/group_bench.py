"""``manage.py group_bench [--observers 4] [--kills 5] [--ttl 3] [--poll 1]``

Figures for groups on the database DATABASE_URL names (prints them; judges nothing):

- drop-out: a member is SIGKILLed; how long until each other member's ``watch`` reports it gone
  (p50 / max over every observer and kill), against ttl + poll;
- heartbeat cost: statements a member sends per second while joined (its renewals), and with a
  ``watch`` polling too, counted on the engine's connections of a member process.

Each member is this command again with ``--member NAME``.
"""

from __future__ import annotations

import json
import queue
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from project.arguments import positive
from resource_lease import Group


def say(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def count_statements() -> list[int]:
    """Count every execute() on the engine's own connections of this process."""
    from resource_lease.db import connections as lease_connections

    counter = [0]
    original = lease_connections.LeaseConnection.new_cursor

    class Counting:
        def __init__(self, cursor: Any) -> None:
            self._cursor = cursor

        def execute(self, *args: Any, **kwargs: Any) -> Any:
            counter[0] += 1
            return self._cursor.execute(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._cursor, name)

    def new_cursor(self: Any) -> Any:
        return Counting(original(self))

    lease_connections.LeaseConnection.new_cursor = new_cursor  # type: ignore[method-assign]
    return counter


class Command(BaseCommand):
    help = "Measure how fast a killed group member leaves the others' views, and what a heartbeat costs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--observers", type=int, default=4)
        parser.add_argument("--kills", type=int, default=5)
        parser.add_argument("--ttl", type=positive, default=3.0)
        parser.add_argument("--poll", type=positive, default=1.0)
        parser.add_argument("--window", type=positive, default=12.0, help="seconds of the heartbeat count")
        parser.add_argument("--member", help="(internal) run as this member")
        parser.add_argument("--group", help="(internal)")
        parser.add_argument("--mode", choices=("observe", "victim", "cost"), default="observe", help="(internal)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["member"]:
            self.member(options)
        else:
            self.coordinate(options)

    def member(self, options: dict[str, Any]) -> None:
        mode, ttl, poll = options["mode"], options["ttl"], options["poll"]
        counter = count_statements()
        group = Group(options["group"], ttl=ttl, member=options["member"]).join()
        if mode == "cost":
            start = counter[0]
            time.sleep(options["window"])
            joined = (counter[0] - start) / options["window"]
            group.watch(lambda members: None, poll=poll)
            start = counter[0]
            time.sleep(options["window"])
            watching = (counter[0] - start) / options["window"]
            say(event="cost", joined=joined, watching=watching)
            group.leave()
            return
        if mode == "observe":
            group.watch(lambda members: say(event="watch", members=members, at=time.time()), poll=poll)
        say(event="joined")
        sys.stdin.readline()  # until told (or killed)
        group.leave()

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "group_bench", *args],
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def coordinate(self, options: dict[str, Any]) -> None:
        ttl, poll, kills = options["ttl"], options["poll"], options["kills"]
        group = f"bench-{secrets.token_hex(3)}"
        common = ["--group", group, "--ttl", str(ttl), "--poll", str(poll)]
        vendor = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        self.stdout.write(f"Database: {vendor}; group {group}; ttl {ttl:g}s, poll {poll:g}s")

        lines: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()

        def read(i: int, proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("{"):
                    lines.put((i, json.loads(line)))

        observers = [self.spawn("--member", f"o-{i}", *common) for i in range(options["observers"])]
        for i, proc in enumerate(observers):
            threading.Thread(target=read, args=(i, proc), daemon=True).start()
        cost = self.spawn("--member", "cost", "--mode", "cost", "--window", str(options["window"]), *common)

        def wait_until(check: Any, timeout: float = 120.0) -> dict[int, float]:
            """Per observer, the first watch report (its wall time) for which ``check`` holds."""
            seen: dict[int, float] = {}
            deadline = time.monotonic() + timeout
            while len(seen) < len(observers):
                try:
                    i, event = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise CommandError("observers did not report in time") from None
                if event["event"] == "watch" and i not in seen and check(event["members"]):
                    seen[i] = event["at"]
            return seen

        delays: list[float] = []
        for k in range(kills):
            name = f"victim-{k}"
            victim = self.spawn("--member", name, "--mode", "victim", *common)
            wait_until(lambda members, name=name: name in members)
            time.sleep(
                ttl / 3 + 0.2
            )  # renewing; the kill lands anywhere in the renew cycle (expiry 2/3 ttl to ttl later)
            killed_at = time.time()
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            seen = wait_until(lambda members, name=name: name not in members, timeout=ttl + poll + 60)
            delays += [at - killed_at for at in seen.values()]
            self.stdout.write(f"  kill {k + 1}: gone from every view after {max(seen.values()) - killed_at:.2f}s")
        for proc in observers:
            assert proc.stdin is not None
            proc.stdin.write("\n")
            proc.stdin.flush()
        out, _ = cost.communicate(timeout=options["window"] * 2 + 120)
        costs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        for proc in observers:
            proc.wait(timeout=60)

        delays.sort()
        self.stdout.write(
            f"drop-out of a SIGKILLed member from the other members' views ({len(delays)} observations,"
            f" {kills} kills): p50 {statistics.median(delays):.2f}s, max {delays[-1]:.2f}s"
            f" (ttl {ttl:g}s + poll {poll:g}s = {ttl + poll:g}s)"
        )
        if costs:
            c = costs[0]
            self.stdout.write(
                f"heartbeat cost per member: {c['joined']:.2f} statements/s joined"
                f" (renewal every ttl/3 = {ttl / 3:g}s: {3 / ttl:.2f}/s expected),"
                f" {c['watching']:.2f} statements/s with a watch polling every {poll:g}s"
            )
