"""Fork many children from a busy parent; each child uses the library at once.

    python -m tests.procs.fork_storm --children N [--at-once K] [--deadline S]
        [--grants G] [--ttl T] [--poll P] [--until-hung] [--no-gate]

The parent keeps its background threads busy with the database (docs/pitfalls.md#fork):

- ``G`` semaphore grants of ``ttl`` ``T`` seconds, renewed by the keeper (every ``T/3``);
- a ``Config.watch`` polled every ``P`` seconds by the keeper, whose callback (on a callback
  thread) reads the config again; a thread of the parent changes a key every few polls;
- a waiter in line: a thread waits (``timeout=None``) for a lock the parent holds, so its
  place is renewed by the keeper;
- the audit trail on, written every 50 ms by the audit writer (the grants, releases and
  config changes give it something to write).

Then it forks ``N`` children, ``K`` alive at once, each as soon as a slot is free. A child
takes and releases one slot of another semaphore with ``timeout=2`` and exits with
``os._exit`` (0: it did; 3: the library raised, which is an answer, not a hang). A child that
has not exited ``S`` seconds after its fork is killed with SIGKILL and counted as hung (it
hangs for ever: a lock held at the fork by a thread that the child does not have).

``--until-hung``: stop forking once a hung child is found (a negative control's run).
``--no-gate``: the fork gate disabled (``resource_lease.forking.fork_gate.disable()``), a
negative control. ``--start-method fork|forkserver|spawn``: ``N`` children of
``multiprocessing``, one after another, instead. ``FORK_STORM_GDB=1``: each hung child's C
stack (gdb) on stderr before it is killed.

Prints one JSON line: ``{"total", "hung", "raised", "ok", "errors"}``, and with ``os.fork``
``"hung_children"`` (their numbers in fork order) and ``"found_after"`` (children forked when
the first hung one was found). A child's error (exit code 3) is on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any


def child_main() -> int:
    from resource_lease import semaphore

    try:
        with semaphore("fork-storm-child", 64, ttl=10, timeout=2, auto_renew=False):
            pass
    except Exception as exc:  # noqa: BLE001  (an answer, not a hang: reported by the exit code)
        sys.stderr.write(f"child {os.getpid()}: {type(exc).__name__}: {exc}\n")
        return 3
    return 0


def mp_child() -> None:
    """A child of ``multiprocessing`` (``--start-method``): set up Django unless inherited."""
    from django.apps import apps

    if not apps.ready:
        from tests.procs import setup

        setup()
    sys.exit(child_main())


def by_multiprocessing(method: str, children: int, deadline: float) -> dict[str, Any]:
    """Start ``children`` children one after another with ``multiprocessing``'s ``method``."""
    import multiprocessing

    context = multiprocessing.get_context(method)
    hung = raised = ok = 0
    errors: list[str] = []
    for _ in range(children):
        child = context.Process(target=mp_child)
        child.start()
        child.join(deadline)
        if child.is_alive():
            child.kill()
            child.join()
            hung += 1
        elif child.exitcode == 0:
            ok += 1
        elif child.exitcode == 3:
            raised += 1
        else:
            errors.append(f"child {child.pid}: exit code {child.exitcode}")
    return {"total": children, "hung": hung, "raised": raised, "ok": ok, "errors": errors}


def busy_parent(args: argparse.Namespace, stop: threading.Event) -> list[Any]:
    """Start the parent's background work; what must stay referenced while it runs."""
    from resource_lease import Config, lock, semaphore

    kept: list[Any] = []
    for _ in range(args.grants):
        kept.append(semaphore("fork-storm-busy", args.grants, ttl=args.ttl, timeout=30))
    config = Config("fork-storm", {"n": 0})

    def seen(key: str, old: Any, new: Any) -> None:
        config["n"]  # a callback thread's database call

    kept.append(config.watch(seen, poll=args.poll))
    held = lock("fork-storm-line", ttl=args.ttl * 4, timeout=30)
    kept.append(held)
    queued = threading.Event()

    def waiter() -> None:
        queued.set()
        try:
            with lock("fork-storm-line", ttl=args.ttl * 4, timeout=None):
                pass
        except Exception as exc:  # noqa: BLE001
            sys.stderr.write(f"parent's waiter: {type(exc).__name__}: {exc}\n")

    def changer() -> None:
        n = 0
        while not stop.wait(args.poll * 3):
            n += 1
            try:
                config.set("n", n)
            except Exception as exc:  # noqa: BLE001
                sys.stderr.write(f"parent's changer: {type(exc).__name__}: {exc}\n")

    threading.Thread(target=waiter, name="fork-storm-waiter", daemon=True).start()
    threading.Thread(target=changer, name="fork-storm-changer", daemon=True).start()
    queued.wait(10)
    time.sleep(args.ttl)  # the waiter is in line, and some renewals have run
    return kept


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, required=True)
    parser.add_argument("--at-once", type=int, default=4)
    parser.add_argument("--deadline", type=float, default=20.0)
    parser.add_argument("--grants", type=int, default=20)
    parser.add_argument("--ttl", type=float, default=0.6)
    parser.add_argument("--poll", type=float, default=0.05)
    parser.add_argument("--until-hung", action="store_true")
    parser.add_argument("--no-gate", action="store_true")
    parser.add_argument("--start-method", choices=["os.fork", "fork", "forkserver", "spawn"], default="os.fork")
    args = parser.parse_args()

    from tests.procs import setup

    setup()
    from django.conf import settings
    from django.test.utils import override_settings

    override_settings(RESOURCE_LEASE={**settings.RESOURCE_LEASE, "AUDIT": True, "AUDIT_FLUSH_INTERVAL": 0.05}).enable()
    if args.no_gate:
        from resource_lease.forking import fork_gate

        fork_gate.disable()

    stop = threading.Event()
    kept = busy_parent(args, stop)
    if args.start_method != "os.fork":
        summary = by_multiprocessing(args.start_method, args.children, args.deadline)
        sys.stdout.write(json.dumps(summary) + "\n")
        sys.stdout.flush()
        os._exit(0)

    running: dict[int, tuple[int, float]] = {}  # pid -> (its number, its deadline; -1: killed)
    total = raised = ok = 0
    hung: list[int] = []  # the numbers (1-based, in fork order) of the children that hung
    errors: list[str] = []
    found_after: int | None = None  # children forked when the first hung one was found

    def reap() -> None:
        nonlocal raised, ok, found_after
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            number, deadline = running.pop(pid)
            if deadline < 0:
                hung.append(number)
            elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                ok += 1
            elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3:
                raised += 1
            else:
                errors.append(f"child {number} (pid {pid}): wait status {status}")
        now = time.monotonic()
        for pid, (number, deadline) in list(running.items()):
            if 0 <= deadline < now:
                if os.environ.get("FORK_STORM_GDB"):  # where it hangs, on stderr
                    subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "bt"], stdout=sys.stderr, check=False)
                os.kill(pid, signal.SIGKILL)
                running[pid] = (number, -1.0)
                if found_after is None:
                    found_after = total

    while total < args.children and not (args.until_hung and found_after is not None):
        while len(running) >= args.at_once:
            time.sleep(0.01)
            reap()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = child_main()
            finally:
                sys.stderr.flush()
                os._exit(code)
        total += 1
        running[pid] = (total, time.monotonic() + args.deadline)
        reap()
    while running:
        time.sleep(0.05)
        reap()
    stop.set()
    summary = {
        "total": total,
        "hung": len(hung),
        "raised": raised,
        "ok": ok,
        "errors": errors,
        "hung_children": sorted(hung),
        "found_after": found_after,
    }
    sys.stdout.write(json.dumps(summary) + "\n")
    sys.stdout.flush()
    for each in kept:
        if hasattr(each, "release"):
            each.release()
        elif hasattr(each, "stop"):
            each.stop()
    os._exit(0)


if __name__ == "__main__":
    main()
