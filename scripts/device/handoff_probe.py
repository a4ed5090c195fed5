"""Where a hand-off's time goes, and a waited grant's CPU: probes for scripts/device/gap.sh.

    python scripts/device/handoff_probe.py cycle SECONDS HOLD LOG [LOCK]
        one process taking LOCK (``lock()``, timeout 60) again and again, holding it HOLD
        seconds; with two such processes every release hands the lock to the other. Each
        event goes to LOG as ``pid WORD ns`` (CLOCK_MONOTONIC, shared by the machine's
        processes): REL0 / REL1 around ``release()``, SEL when the LISTEN thread's select()
        returned, NOTE when it read notifications, WAKE when a waiter was woken, GOT when
        ``lock()`` returned. Prints the process's CPU per grant.
    python scripts/device/handoff_probe.py summary LOG
        for each release, the p50 from REL0 to the other process's SEL, NOTE, WAKE and GOT.

Run with DJANGO_SETTINGS_MODULE=project.settings and DATABASE_URL set, from the repository
root (PYTHONPATH=.). The patches only record times; they change nothing the engine does.
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import time
from pathlib import Path


def cycle(seconds: float, hold: float, log_path: str, name: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    import psycopg

    from resource_lease import lock
    from resource_lease.db import listen
    from resource_lease.line import wakeups

    out = open(log_path, "a", buffering=1)  # noqa: SIM115 (open until the process ends)

    def log(word: str) -> None:
        out.write(f"{os.getpid()} {word} {time.monotonic_ns()}\n")

    notifies = psycopg.Connection.notifies

    def noted(self: psycopg.Connection, *args: object, **kwargs: object) -> object:
        found = list(notifies(self, *args, **kwargs))  # type: ignore[arg-type]
        if found:
            log("NOTE")
        return iter(found)

    wake = wakeups.Waker.wake

    def woken(self: wakeups.Waker, *args: object, **kwargs: object) -> object:
        log("WAKE")
        return wake(self, *args, **kwargs)  # type: ignore[arg-type]

    select = listen.select.select

    def selected(*args: object) -> object:
        ready = select(*args)  # type: ignore[arg-type]
        if ready[0]:
            log("SEL")
        return ready

    psycopg.Connection.notifies = noted  # type: ignore[method-assign,assignment]
    wakeups.Waker.wake = woken  # type: ignore[method-assign]
    listen.select.select = selected  # type: ignore[assignment]
    started, cpu, grants = time.monotonic(), time.process_time(), 0
    while time.monotonic() - started < seconds:
        held = lock(name, ttl=30, timeout=60)
        log("GOT")
        time.sleep(hold)
        log("REL0")
        held.release()
        log("REL1")
        grants += 1
    per_grant = (time.process_time() - cpu) / max(grants, 1) * 1e3
    print(f"pid {os.getpid()}: {grants} grants, {per_grant:.2f} ms CPU per grant")


def summary(log_path: str) -> None:
    events = sorted((int(t), pid, word) for pid, word, t in (line.split() for line in Path(log_path).open()))
    after: dict[str, list[float]] = collections.defaultdict(list)
    releases, began = [], {}
    for i, (t, pid, word) in enumerate(events):
        if word == "REL1" and pid in began:
            releases.append((t - began.pop(pid)) / 1e6)
        if word != "REL0":
            continue
        began[pid] = t
        marks: dict[str, int] = {}
        for t2, other, word2 in events[i + 1 :]:
            if other == pid:
                if word2 == "REL1":
                    marks.setdefault("REL1", t2)
                continue
            if word2 in ("SEL", "NOTE", "WAKE"):
                marks.setdefault(word2, t2)
            if word2 in ("GOT", "REL0"):
                if word2 == "GOT":
                    marks["GOT"] = t2
                break
        if "GOT" in marks:
            for mark, at in marks.items():
                after[mark].append((at - t) / 1e6)
    print(f"{log_path}: release() p50 {statistics.median(releases):.3f} ms ({len(releases)} releases)")
    for mark in ("REL1", "SEL", "NOTE", "WAKE", "GOT"):
        if after[mark]:
            gaps = sorted(after[mark])
            print(
                f"  REL0 -> {mark}: p50 {statistics.median(gaps):.3f} ms, p10 {gaps[len(gaps) // 10]:.3f} ({len(gaps)})"
            )


if __name__ == "__main__":
    if sys.argv[1] == "cycle":
        cycle(float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else "probe-lock")
    else:
        summary(sys.argv[2])
