"""Processes racing on one shared counter or one config key, reporting JSON lines on stdout.

    python -m tests.procs.counter_race add --name N --count K --go FILE [--naive]
    python -m tests.procs.counter_race cas --namespace NS --count K --go FILE [--naive]
    python -m tests.procs.counter_race once --name N

``once`` (through tests/faults' cutting proxy) does one ``counter(N).add()`` and one
``Config(N).compare_and_set("n", 0, 1)`` and prints what each answered or raised.

Each prints ``ready``, waits for FILE to exist, then works as fast as it can. ``add`` adds 1
to the counter K times and prints each ``added`` value (``--naive``: the negative control,
a counter that reads the value, then writes value + 1 in another statement). ``cas``
increments the config key ``hits`` K times, each by a compare-and-set of the value it read,
retried until it succeeds, and prints each ``cas`` value it stored (``--naive``: the negative
control, a read then a ``set`` of value + 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tests.procs import setup


def emit(ev: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"ev": ev, "pid": os.getpid(), **fields}) + "\n")
    sys.stdout.flush()


def wait_for_go(go: str) -> None:
    emit("ready")
    path = Path(go)
    while not path.exists():
        time.sleep(0.001)


def naive_add(name: str) -> int:
    """The negative control: read the value, then write value + 1 in another statement."""
    from django.utils import timezone

    from resource_lease.models import Counter

    row = Counter.objects.filter(name=name).first()
    time.sleep(0.002)  # what a slow network or a busy server does between the two
    if row is None:
        Counter.objects.create(name=name, value=1, updated_at=timezone.now())
        return 1
    Counter.objects.filter(pk=row.pk).update(value=row.value + 1, updated_at=timezone.now())
    return row.value + 1


def add(args: argparse.Namespace) -> None:
    from django.db import DatabaseError

    from resource_lease import LeaseError, counter

    hits = counter(args.name)
    wait_for_go(args.go)
    for _ in range(args.count):
        try:
            value = naive_add(args.name) if args.naive else hits.add()
        except (DatabaseError, LeaseError) as exc:  # the naive counter's duplicate insert
            emit("error", error=f"{type(exc).__name__}: {exc}")
            continue
        emit("added", value=value)


def cas(args: argparse.Namespace) -> None:
    from resource_lease import Config

    params = Config(args.namespace, defaults={"hits": 0}, poll=0.001)
    wait_for_go(args.go)
    retries = 0
    for _ in range(args.count):
        while True:
            current = params["hits"]
            if args.naive:
                time.sleep(0.002)
                params.set("hits", current + 1)
                break
            if params.compare_and_set("hits", current, current + 1):
                break
            retries += 1
        emit("cas", value=current + 1)
    emit("done", retries=retries)


def once(args: argparse.Namespace) -> None:
    from resource_lease import Config, LeaseError, counter

    for what, call in (
        ("add", lambda: counter(args.name).add()),
        ("cas", lambda: Config(args.name, defaults={"n": 0}).compare_and_set("n", 0, 1)),
    ):
        try:
            emit(what, answer=call())
        except LeaseError as exc:
            emit(what, error=type(exc).__name__, message=str(exc))


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("add", "cas"):
        p = sub.add_parser(name)
        p.add_argument("--name" if name == "add" else "--namespace", required=True)
        p.add_argument("--count", type=int, required=True)
        p.add_argument("--go", required=True)
        p.add_argument("--naive", action="store_true")
    p = sub.add_parser("once")
    p.add_argument("--name", required=True)
    args = parser.parse_args()
    setup()
    {"add": add, "cas": cas, "once": once}[args.cmd](args)


if __name__ == "__main__":
    main()
