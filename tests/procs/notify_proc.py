"""Notifiers and watchers in their own processes, reporting JSON lines on stdout.

    python -m tests.procs.notify_proc race --topic T --count K --go FILE [--naive]
    python -m tests.procs.notify_proc watch --topic T --poll P [--slow S] [--naive-payload]
    python -m tests.procs.notify_proc config-watch --namespace N --poll P
    python -m tests.procs.notify_proc config-set --namespace N --key K --value JSON

``race`` prints ``ready``, waits for FILE to exist, then notifies the topic K times as fast
as it can (``--naive``: a read-then-write bump, the negative control) and prints each
``notified`` version. ``watch`` prints ``ready`` once watching, then ``got`` per callback
(version, payload, start and end on the monotonic clock every process here shares, thread);
it exits at the end of stdin. ``--naive-payload`` is the negative control of a watcher: it
polls the topic and calls back when the payload differs from the last one delivered.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.procs import setup

OUT = threading.Lock()

# The defaults of the namespace that config-watch and config-set use.
DEFAULTS: dict[str, Any] = {"max_rec": 1000, "min_title_sim": 0.55, "enabled": True, "label": "x"}


def emit(ev: str, **fields: Any) -> None:
    with OUT:
        sys.stdout.write(json.dumps({"ev": ev, "pid": os.getpid(), **fields}) + "\n")
        sys.stdout.flush()


def race(args: argparse.Namespace) -> None:
    from django.db import DatabaseError

    from resource_lease import LeaseError, notify

    emit("ready")
    go = Path(args.go)
    while not go.exists():
        time.sleep(0.001)
    for seq in range(args.count):
        payload = {"by": os.getpid(), "seq": seq}
        try:
            version = naive_notify(args.topic, payload) if args.naive else notify(args.topic, payload)
        except (DatabaseError, LeaseError) as exc:  # the naive bump's duplicate insert, for the check
            emit("error", error=f"{type(exc).__name__}: {exc}")
            continue
        emit("notified", version=version, payload=payload)


def naive_notify(topic: str, payload: Any) -> int:
    """The negative control: read the version, then write version + 1 in another statement."""
    from django.utils import timezone

    from resource_lease.models import Topic

    row = Topic.objects.filter(name=topic).first()
    time.sleep(0.002)  # what a slow network or a busy server does between the two
    if row is None:
        Topic.objects.create(name=topic, version=1, payload=payload, updated_at=timezone.now())
        return 1
    Topic.objects.filter(pk=row.pk).update(version=row.version + 1, payload=payload, updated_at=timezone.now())
    return row.version + 1


def watch(args: argparse.Namespace) -> None:
    from resource_lease import watch as start_watch

    def on_change(payload: Any, version: int) -> None:
        start = time.monotonic()
        if args.slow:
            emit("enter", version=version, payload=payload, start=start)
            time.sleep(args.slow)
        emit(
            "got",
            version=version,
            payload=payload,
            start=start,
            end=time.monotonic(),
            thread=threading.get_ident(),
        )
        if args.fail_on is not None and version % args.fail_on == 0:
            raise RuntimeError(f"the callback fails at version {version} (on purpose)")

    if args.naive_payload:
        stop = naive_payload_watch(args.topic, on_change, args.poll)
    else:
        handle = start_watch(args.topic, on_change, poll=args.poll)
        stop = handle.stop
    emit("ready")
    for _ in sys.stdin:  # until the test closes stdin
        pass
    stop()
    emit("stopped")


def naive_payload_watch(topic: str, callback: Any, poll: float) -> Any:
    """The negative control: a change is a payload that differs from the last one seen."""
    from resource_lease.recipes.notifications import topic_state

    stopping = threading.Event()
    last = topic_state(topic)[1]

    def run() -> None:
        nonlocal last
        while not stopping.wait(poll):
            version, payload = topic_state(topic)
            if payload != last:
                last = payload
                callback(payload, version)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def stop() -> None:
        stopping.set()
        thread.join()

    return stop


def config_watch(args: argparse.Namespace) -> None:
    from resource_lease import Config

    params = Config(args.namespace, defaults=DEFAULTS, poll=args.poll)

    def on_change(key: str, old: Any, new: Any) -> None:
        emit("changed", key=key, old=old, new=new, t=time.monotonic())

    handle = params.watch(on_change)
    emit("ready", values=params.as_dict())
    for line in sys.stdin:
        words = line.split()[1:]  # "<command id> get KEY"
        if words and words[0] == "get":
            emit("value", key=words[1], value=params[words[1]], t=time.monotonic())
    handle.stop()
    emit("stopped")


def config_set(args: argparse.Namespace) -> None:
    from resource_lease import Config

    params = Config(args.namespace, defaults=DEFAULTS, poll=args.poll)
    params.set(args.key, json.loads(args.value))
    emit("set", key=args.key, t=time.monotonic())


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("race")
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--go", required=True)
    p.add_argument("--naive", action="store_true")
    p = sub.add_parser("watch")
    p.add_argument("--topic", required=True)
    p.add_argument("--poll", type=float, default=1.0)
    p.add_argument("--slow", type=float, default=0.0)
    p.add_argument("--fail-on", type=int, default=None)
    p.add_argument("--naive-payload", action="store_true")
    for name in ("config-watch", "config-set"):
        p = sub.add_parser(name)
        p.add_argument("--namespace", required=True)
        p.add_argument("--poll", type=float, default=1.0)
        if name == "config-set":
            p.add_argument("--key", required=True)
            p.add_argument("--value", required=True)
    args = parser.parse_args()
    setup()
    {"race": race, "watch": watch, "config-watch": config_watch, "config-set": config_set}[args.cmd](args)


if __name__ == "__main__":
    main()
