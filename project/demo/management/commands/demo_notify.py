"""The main job's notification part: "task A done, start task B" (formerly a ZooKeeper watch) and live parameters.

    python manage.py demo_notify [--processes 4] [--each 5] [--json]

Runs on the embedded SQLite by default (DATABASE_URL for MariaDB/PostgreSQL). This process
watches a fresh topic with a deliberately slow callback ("task B", 0.3 s) and a ``Config``;
``--processes`` child processes notify the topic ``--each`` times at once, then one child
changes a parameter. The summary checks: every notification got its own version (1..N, one
row), the watcher's versions only went up and it ended on the final version (changes during
the slow callback coalesced, none lost), the callbacks never overlapped, and the parameter
change made in another process was seen here by the watch and by reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from project.arguments import positive_int
from resource_lease import Config, notify, watch
from resource_lease.models import Topic

DEFAULTS: dict[str, Any] = {"max_rec": 1000, "min_title_sim": 0.55}


class Command(BaseCommand):
    help = "Notify a topic from several processes at once and watch it; change a live parameter from another process."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--processes", type=positive_int, default=4)
        parser.add_argument("--each", type=positive_int, default=5)
        parser.add_argument("--json", action="store_true", dest="as_json")
        # The children's side (internal).
        parser.add_argument("--child", choices=("notify", "set"), help="internal: run as a child process")
        parser.add_argument("--topic", default="")
        parser.add_argument("--namespace", default="")
        parser.add_argument("--go", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["child"] == "notify":
            self._child_notify(options["topic"], options["each"], Path(options["go"]))
            return
        if options["child"] == "set":
            Config(options["namespace"], defaults=DEFAULTS).set("max_rec", 800)
            return
        call_command("migrate", verbosity=0)
        self._main(options["processes"], options["each"], options["as_json"])

    def _child_notify(self, topic: str, each: int, go: Path) -> None:
        while not go.exists():
            time.sleep(0.001)
        versions = [notify(topic, {"task": "A", "seq": i}) for i in range(each)]
        self.stdout.write(json.dumps(versions))

    def _spawn(self, *args: str) -> subprocess.Popen[str]:
        manage = Path(settings.BASE_DIR) / "manage.py"
        return subprocess.Popen([sys.executable, str(manage), "demo_notify", *args], stdout=subprocess.PIPE, text=True)

    def _main(self, processes: int, each: int, as_json: bool) -> None:
        run = uuid.uuid4().hex[:8]
        topic, namespace = f"demo:index-built:{run}", f"demo:talent_rec:{run}"
        delivered: list[tuple[int, float, float]] = []

        def task_b(payload: Any, version: int) -> None:
            start = time.monotonic()
            time.sleep(0.3)  # task B takes a while; notifications meanwhile are not lost
            delivered.append((version, start, time.monotonic()))

        params = Config(namespace, defaults=DEFAULTS, poll=0.2)
        changes: list[tuple[str, Any, Any]] = []
        changed = threading.Event()

        def on_param(key: str, old: Any, new: Any) -> None:
            changes.append((key, old, new))
            changed.set()

        topic_watch = watch(topic, task_b, poll=0.2)
        param_watch = params.watch(on_param)
        go = Path(settings.VAR_DIR) / f"demo-notify-go-{run}"
        children = [
            self._spawn("--child", "notify", "--topic", topic, "--each", str(each), "--go", str(go))
            for _ in range(processes)
        ]
        time.sleep(1.0)  # let them start (they wait for the go file)
        go.touch()
        versions: list[int] = []
        for child in children:
            out, _ = child.communicate(timeout=120)
            versions += json.loads(out.strip().splitlines()[-1])
        go.unlink(missing_ok=True)
        total = processes * each
        deadline = time.monotonic() + 30
        while (not delivered or delivered[-1][0] < total) and time.monotonic() < deadline:
            time.sleep(0.05)
        setter = self._spawn("--child", "set", "--namespace", namespace)
        setter.wait(timeout=120)
        seen_by_watch = changed.wait(30)
        time.sleep(0.3)
        read_here = params["max_rec"]
        topic_watch.stop()
        param_watch.stop()

        got = [v for v, _, _ in delivered]
        spans = sorted((s, e) for _, s, e in delivered)
        checks = {
            "each notification got its own version 1..N": sorted(versions) == list(range(1, total + 1)),
            "one topic row, at version N": list(Topic.objects.filter(name=topic).values_list("version", flat=True))
            == [total],
            "watched versions only went up": all(b > a for a, b in zip(got, got[1:], strict=False)),
            "the watcher ended on the final version": bool(got) and got[-1] == total,
            "callbacks never overlapped": all(b[0] >= a[1] for a, b in zip(spans, spans[1:], strict=False)),
            "another process's parameter change was watched": seen_by_watch and changes == [("max_rec", 1000, 800)],
            "and read here": read_here == 800,
        }
        summary = {
            "database": settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1],
            "processes": processes,
            "notifications": total,
            "deliveries": len(got),
            "coalesced": total - len(got),
            "delivered_versions": got,
            "config_changes": changes,
            "checks": checks,
            "ok": all(checks.values()),
        }
        if as_json:
            self.stdout.write(json.dumps(summary, indent=2))
        else:
            self.stdout.write(
                f"notify: {processes} processes x {each} notifications on a new topic -> versions "
                f"{min(versions)}..{max(versions)}; a watcher with a 0.3 s callback got {len(got)} calls "
                f"({total - len(got)} coalesced), last version {got[-1] if got else None}"
            )
            self.stdout.write(f"config: another process set max_rec=800; watched {changes}, read {read_here}")
            for name, ok in checks.items():
                self.stdout.write(f"  [{'ok' if ok else 'FAILED'}] {name}")
        if not summary["ok"]:
            raise SystemExit(1)
