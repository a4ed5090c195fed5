"""The main job's one-server periodic job: several servers, one leads, it dies, another goes on.

    python manage.py demo_leader [--servers 3] [--ticks 5] [--ttl 2] [--json]

Starts ``--servers`` processes (``demo_leader --server``), each calling the same
``@leader_only`` job every second, as APScheduler or cron would on every server. The job
"processes" the next batch of records and returns ``{"processed", "runs", "last_tick"}``,
which the next run, wherever it runs, is handed as ``**state``. Once the leader has run a
few ticks it is SIGKILLed; another server takes over within ttl + 1 s, starting from the
state the dead one left. The summary says who led, when the take-over happened, what state
the new leader started from, and proves that no tick ran twice and no run's state was lost.
Runs on the embedded SQLite file (or DATABASE_URL).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

BATCH = 10  # records a run "processes"


def positive(value: str) -> float:
    number = float(value)
    if not 0 < number < float("inf"):
        raise ValueError(value)
    return number


def positive_int(value: str) -> int:
    number = int(value)
    if number < 2:
        raise ValueError(value)
    return number


def wait(predicate: Any, what: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise CommandError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)
    return value


def serve(name: str, ttl: float, seconds: float, events: Path) -> None:
    """One server: call the leader_only job on every tick (each wall-clock second)."""
    from resource_lease import LeaseLost, leader_only

    out = open(events, "a", buffering=1)  # noqa: SIM115 - closed at exit

    def log(**event: Any) -> None:
        out.write(json.dumps({"pid": os.getpid(), "at": time.time(), **event}) + "\n")

    @leader_only(name, ttl=ttl, otherwise=lambda record: ("otherwise", record))
    def report(tick: int, processed: int = 0, runs: int = 0, last_tick: int | None = None) -> dict[str, Any]:
        log(event="ran", tick=tick, given={"processed": processed, "runs": runs, "last_tick": last_tick})
        time.sleep(0.05)  # the work
        return {"processed": processed + BATCH, "runs": runs + 1, "last_tick": tick}

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        tick = int(time.time()) + 1
        time.sleep(max(0.0, tick + random.uniform(0, 0.3) - time.time()))  # schedulers fire a little apart
        try:
            result = report(tick)
        except LeaseLost:
            log(event="lost", tick=tick)
            continue
        if isinstance(result, tuple):
            log(event="otherwise", tick=tick, leader=result[1]["leader"])
        else:
            log(event="stored", tick=tick, state=result)


class Command(BaseCommand):
    help = "Several servers run one leader_only job each second; the leader is killed; another goes on."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--servers", type=positive_int, default=3, help="processes (at least 2)")
        parser.add_argument("--ticks", type=positive_int, default=5, help="ticks the new leader runs before the end")
        parser.add_argument("--seconds", type=positive, default=600.0, help="(internal) how long a server runs")
        parser.add_argument("--ttl", type=positive, default=2.0, help="the job's leadership ttl")
        parser.add_argument("--json", action="store_true", help="print the summary as JSON")
        parser.add_argument("--server", action="store_true", help="(internal) run one server")
        parser.add_argument("--name", default="", help="(internal) the job's name")
        parser.add_argument("--events", default="", help="(internal) the server's event file")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["server"]:
            serve(options["name"], options["ttl"], options["seconds"], Path(options["events"]))
            return
        call_command("migrate", verbosity=0)
        summary = self.run_demo(options["servers"], options["ticks"], options["ttl"])
        if options["json"]:
            self.stdout.write(json.dumps(summary, indent=2, default=str))
        else:
            self.print_summary(summary)
        if not summary["ok"]:
            raise CommandError("the one-server job misbehaved: see the summary")

    def run_demo(self, servers: int, ticks: int, ttl: float) -> dict[str, Any]:
        from resource_lease import Election
        from resource_lease.models import Resource

        name = f"demo-report-{uuid.uuid4().hex[:8]}"
        directory = Path(settings.VAR_DIR) / "demo-leader" / name
        directory.mkdir(parents=True)
        manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "demo_leader", "--server"]
        procs = {}
        for i in range(servers):
            args = ["--name", name, "--ttl", str(ttl), "--events", str(directory / f"{i}")]
            proc = subprocess.Popen([*manage, *args], text=True)
            procs[proc.pid] = proc
        observer = Election(name, holder="demo-observer")
        try:
            leader = wait(lambda: (h := observer.leader()) and observer.state.get("runs", 0) >= 3 and h, "a leader")
            victim = int(leader.rsplit(":", 1)[1])
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            killed_at = time.time()
            row = Resource.objects.get(kind="@election", name=name)
            left = dict(row.data)
            wait(lambda: observer.state.get("runs", 0) >= left["runs"] + ticks, "the new leader's runs")
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.terminate()
                proc.wait()
        final = Resource.objects.get(kind="@election", name=name)
        events = [json.loads(line) for path in sorted(directory.iterdir()) for line in path.read_text().splitlines()]
        return self.judge(events, victim, killed_at, left, row, final, servers, ttl)

    def judge(
        self,
        events: list[dict[str, Any]],
        victim: int,
        killed_at: float,
        left: dict[str, Any],
        row: Any,
        final: Any,
        servers: int,
        ttl: float,
    ) -> dict[str, Any]:
        ran = sorted((e for e in events if e["event"] == "ran"), key=lambda e: e["at"])
        per_tick = Counter(e["tick"] for e in ran)
        twice = sorted(t for t, n in per_tick.items() if n > 1)
        successor = [e for e in ran if e["pid"] != victim and e["at"] > killed_at]
        first = successor[0] if successor else None
        stored = {(e["pid"], e["tick"]) for e in events if e["event"] == "stored"}
        # A run the kill cut short (it started, it never stored): its tick is simply not done.
        cut = [
            e
            for e in ran
            if e["pid"] == victim and (victim, e["tick"]) not in stored and e["tick"] != left["last_tick"]
        ]
        took_over_db = (final.acquired_at - row.busy_before).total_seconds() if final.fence > row.fence else None
        summary = {
            "servers": servers,
            "ttl": ttl,
            "leader_killed": victim,
            "runs_by_killed_leader": len([e for e in ran if e["pid"] == victim]),
            "state_left_by_killed_leader": left,
            "new_leader": first["pid"] if first else None,
            "state_new_leader_started_from": first["given"] if first else None,
            "first_run_after_kill_s": round(first["at"] - killed_at, 2) if first else None,
            "granted_after_expiry_s": round(took_over_db, 3) if took_over_db is not None else None,
            "ticks": len(per_tick),
            "ticks_run_twice": twice,
            "otherwise_calls": len([e for e in events if e["event"] == "otherwise"]),
            "final_state": final.data,
            "runs_cut_short_by_the_kill": len(cut),
        }
        summary["ok"] = bool(
            first
            and not twice
            and first["given"] == left  # exactly where the dead one left it
            and final.data["runs"] == len(ran) - len(cut)
            and final.data["processed"] == BATCH * final.data["runs"]
            and summary["first_run_after_kill_s"] <= ttl + 1 + 1.5
        )
        return summary

    def print_summary(self, s: dict[str, Any]) -> None:
        w = self.stdout.write
        w(f"\n== one-server periodic job (@leader_only, ttl {s['ttl']:g}s) on {s['servers']} servers, every second")
        w(f"leader {s['leader_killed']} ran {s['runs_by_killed_leader']} ticks, then was SIGKILLed")
        w(f"  it left the state {s['state_left_by_killed_leader']}")
        w(
            f"server {s['new_leader']} took over: first run {s['first_run_after_kill_s']}s after the kill"
            f" (granted {s['granted_after_expiry_s']}s after the dead leader's lease expired, database clock)"
        )
        w(f"  and started from     {s['state_new_leader_started_from']}")
        w(
            f"{s['ticks']} ticks ran, ticks run twice: {len(s['ticks_run_twice'])}"
            f"{' ' + str(s['ticks_run_twice']) if s['ticks_run_twice'] else ''};"
            f" the others were told who leads {s['otherwise_calls']} times (otherwise)"
        )
        cut = (
            f" ({s['runs_cut_short_by_the_kill']} run cut short by the kill)" if s["runs_cut_short_by_the_kill"] else ""
        )
        w(f"final state {s['final_state']}: every finished run counted once{cut}")
        w("OK: one server at a time, and the state went on where the dead leader left it" if s["ok"] else "FAILED")
