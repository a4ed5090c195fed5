"""A caller of a pool with targets or sessions, for tests/test_targets.py and tests/test_sessions.py.

    python -m tests.procs.target_worker wait --kind K (--target T | --session S) --timeout S [--hold H] [--deaf]
        [--no-session-retry]
    python -m tests.procs.target_worker cycle --kind K --target T --seconds S --cooldown C [--no-cooldown]

``wait``: prints ``{"event": "ready"}``, then waits in line once for a resource of K not
cooling down for T (or the one bound to the session S); prints ``granted`` (the resource, the
grant's database clock, how long it waited, whether the session was rebound) or ``refused``,
holds H seconds and releases. ``--deaf``: no wake-up reaches the waiter and it looks at its
line no sooner than ``LINE_POLL_MAX`` (``project.bench.liveness_contender.cut_wakeups``, the
liveness matrix's negative control); ``--no-session-retry``: a session's waiter never tries its
bound resource of its own (``lease.SESSION_RETRY`` 0: a negative control). ``cycle``: until S seconds have
passed, acquires a resource for T (waiting up to 10 s), reads the database's clock, and
releases it with a cooldown of C seconds (``--no-cooldown``: the negative control, releases
it plainly); then prints one ``history`` event: per grant, the resource, the grant's database
clock and the clock read before its release (epoch seconds).

With ``RESOURCE_LEASE_TEST_BLIND_COOLS=1`` in its environment, its grant statements count every
waiter ahead, whatever rows those may take (``blind``: a negative control).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from tests.procs import setup


def blind(dialect: Any, patch: Any = None) -> None:
    """Make ``dialect``'s grants in the line form count every waiter ahead of them, whatever
    its target (its WAITER_COOLS test always false): the negative control of a waiter that
    holds up the rows it may not take. ``patch(mapping, key, value)``: how to set a statement
    (a test's ``monkeypatch.setitem``, undone after it); by default, set for good."""
    from resource_lease.db.statements import WAITER_COOLS, render

    cools = render({"WAITER_COOLS": WAITER_COOLS}, dialect.pieces())["WAITER_COOLS"]
    blinded = 0
    setitem = patch or dict.__setitem__
    for (in_line, _, _), statements in dialect.forms.items():
        for name, sql in list(statements.items()):
            if in_line and cools in sql:
                setitem(statements, name, sql.replace(cools, "(1 = 0)"))
                blinded += 1
    for key, sql in list(dialect.line.leaving.items()):  # PostgreSQL: a waiter's grants that leave its place
        if cools in sql:
            setitem(dialect.line.leaving, key, sql.replace(cools, "(1 = 0)"))
    assert blinded, "no statement tests a waiter's cooldowns"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("wait", "cycle"))
    parser.add_argument("--kind", required=True)
    parser.add_argument("--target")
    parser.add_argument("--session")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--cooldown", type=float, default=0.3)
    parser.add_argument("--no-cooldown", action="store_true")
    parser.add_argument("--deaf", action="store_true")
    parser.add_argument("--no-session-retry", action="store_true")
    args = parser.parse_args()
    setup()
    from resource_lease import NoResourceAvailable, acquire
    from resource_lease.pool import database_now

    database_now()  # connected
    if os.environ.get("RESOURCE_LEASE_TEST_BLIND_COOLS") == "1":
        from resource_lease.db.connections import lease_connection

        blind(lease_connection("default").dialect)
    if args.deaf:
        from project.bench.liveness_contender import cut_wakeups

        cut_wakeups()
    if args.no_session_retry:
        from resource_lease import lease as lease_module

        lease_module.SESSION_RETRY = 0.0
    print(json.dumps({"event": "ready"}), flush=True)
    if args.mode == "wait":
        started = time.monotonic()
        try:
            lease = acquire(args.kind, target=args.target, session=args.session, ttl=30, timeout=args.timeout)
        except NoResourceAvailable:
            print(json.dumps({"event": "refused", "waited": time.monotonic() - started}), flush=True)
            return
        print(
            json.dumps(
                {
                    "event": "granted",
                    "resource": lease.resource.name,
                    "acquired_at": lease.resource.acquired_at.timestamp(),
                    "waited": time.monotonic() - started,
                    "rebound": lease.rebound,
                }
            ),
            flush=True,
        )
        time.sleep(args.hold)
        lease.release()
        return
    history = []
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        lease = acquire(args.kind, target=args.target, ttl=30, timeout=10)
        at = lease.resource.acquired_at.timestamp()
        before_release = database_now().timestamp()
        history.append([lease.resource.name, at, before_release])
        lease.release() if args.no_cooldown else lease.release(cooldown=args.cooldown)
    print(json.dumps({"event": "history", "grants": history}), flush=True)


if __name__ == "__main__":
    main()
