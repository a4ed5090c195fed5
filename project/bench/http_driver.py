"""A driver process of the ``http`` scenario (project/bench/http_bench.py): THREADS threads
that lease and release as fast as they can for DURATION seconds once GO exists, then print
``{"cycles": n, "errors": n}``; or, in a hand-off mode, two threads that pass one resource
back and forth ROUNDS times and print the release-to-grant gaps.

    python -m project.bench.http_driver MODE --threads N --duration S --go FILE [--url URL --kind K]

MODE: ``http`` (the API, ``LeaseClient``), ``python`` (``acquire()`` on the database),
``etcd`` (etcd's JSON gateway: ``/v3/lock/lock`` and ``unlock`` under one lease per thread),
``handoff-http``, ``handoff-python``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _etcd(url: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        return json.loads(response.read())


def _cycle_functions(args: argparse.Namespace) -> Callable[[int], Callable[[], None]]:
    if args.mode == "http":
        from resource_lease.client.lease_client import LeaseClient

        def http_cycle(_index: int) -> Callable[[], None]:
            client = LeaseClient(args.url, os.environ["RESOURCE_LEASE_TOKEN"])

            def cycle() -> None:
                lease = client.acquire(args.kind, ttl=60, wait=30)
                client.release(lease["id"])

            return cycle

        return http_cycle
    if args.mode == "python":
        from resource_lease.lease import acquire

        def python_cycle(_index: int) -> Callable[[], None]:
            def cycle() -> None:
                acquire(args.kind, ttl=60, timeout=30).release()

            return cycle

        return python_cycle

    def etcd_cycle(index: int) -> Callable[[], None]:
        lease = _etcd(args.url, "/v3/lease/grant", {"TTL": 60})["ID"]
        name = base64.b64encode(f"{args.kind}-{index % args.pool}".encode()).decode()

        def cycle() -> None:
            key = _etcd(args.url, "/v3/lock/lock", {"name": name, "lease": lease})["key"]
            _etcd(args.url, "/v3/lock/unlock", {"key": key})

        return cycle

    return etcd_cycle


def _cycles(args: argparse.Namespace) -> dict[str, Any]:
    make = _cycle_functions(args)
    cycles = [make(i) for i in range(args.threads)]
    counts = [0] * args.threads
    errors = [0] * args.threads
    messages: list[str] = []
    sys.stderr.write("ready\n")
    sys.stderr.flush()
    while not Path(args.go).exists():
        time.sleep(0.01)
    end = time.monotonic() + args.duration

    def run(i: int) -> None:
        while time.monotonic() < end:
            try:
                cycles[i]()
                counts[i] += 1
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors[i] += 1
                if len(messages) < 3:
                    messages.append(repr(exc)[:200])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"cycles": sum(counts), "errors": sum(errors), "messages": messages}


def _handoff(args: argparse.Namespace) -> dict[str, Any]:
    """Two threads pass one resource back and forth: the holder releases once the other has
    been waiting ``--settle`` seconds; the gap is from the release call to the waiter's grant."""
    if args.mode == "handoff-http":
        from resource_lease.client.lease_client import LeaseClient

        client = LeaseClient(args.url, os.environ["RESOURCE_LEASE_TOKEN"])

        def take() -> Any:
            return client.acquire(args.kind, ttl=60, wait=60)

        def give(lease: Any) -> None:
            client.release(lease["id"])
    else:
        from resource_lease.lease import acquire

        def take() -> Any:
            return acquire(args.kind, ttl=60, timeout=60)

        def give(lease: Any) -> None:
            lease.release()

    sys.stderr.write("ready\n")
    sys.stderr.flush()
    gaps: list[float] = []
    held = take()
    for _ in range(args.rounds):
        got: list[tuple[Any, float]] = []
        waiter = threading.Thread(target=lambda into=got: into.append((take(), time.perf_counter())))
        waiter.start()
        time.sleep(args.settle)
        released_at = time.perf_counter()
        give(held)
        waiter.join()
        held, granted_at = got[0]
        gaps.append((granted_at - released_at) * 1000)
    give(held)
    return {"gaps_ms": gaps}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["http", "python", "etcd", "handoff-http", "handoff-python"])
    parser.add_argument("--url", default="")
    parser.add_argument("--kind", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--go", default="")
    parser.add_argument("--pool", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--settle", type=float, default=0.1)
    args = parser.parse_args()
    if args.mode in ("python", "handoff-python"):
        import django

        django.setup()
    result = _handoff(args) if args.mode.startswith("handoff") else _cycles(args)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
