"""A group member driven through stdin, reporting as JSON lines on stdout.

    python -m tests.procs.group_member --group G --member M [--ttl S] [--poll S] [--salted-hash]

Joins, watches (each change printed as ``{"event": "watch", "members": [...]}``), prints
``{"event": "joined"}``, then obeys one command per line:

- ``view N KEYS``: wait until the group has N members, then print members, index and the keys
  of range(KEYS) this member owns (one read);
- ``leave``: leave and exit.

``--salted-hash`` is the negative control: ownership by Python's hash(), salted per process.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from tests.procs import setup

_out = threading.Lock()


def say(**fields: object) -> None:
    with _out:  # the watch thread prints too: one whole line at a time
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", required=True)
    parser.add_argument("--member", required=True)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--poll", type=float, default=0.3)
    parser.add_argument("--salted-hash", action="store_true")
    args = parser.parse_args()
    setup()
    from resource_lease import Group, MemberTaken

    group = Group(args.group, ttl=args.ttl, member=args.member, data={"pid": args.member})
    try:
        group.join()
    except MemberTaken as exc:
        say(event="taken", error=str(exc), member=exc.member, holder=exc.holder)
        raise SystemExit(3) from None
    group.watch(lambda members: say(event="watch", members=members, at=time.time()), poll=args.poll)
    say(event="joined", member=args.member)
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "view":
            want, keys = int(rest[0]), range(int(rest[1]))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                members, index = group.view()
                if len(members) == want and index >= 0:
                    break
                time.sleep(0.1)
            if args.salted_hash:
                owned = [k for k in keys if max(members, key=lambda m, k=k: hash((m, k))) == args.member]
            else:
                owned = group.owned(keys)
            say(event="view", members=members, index=index, owned=owned, data=group.members(with_data=True))
        elif command == "leave":
            say(event="left", was_member=group.leave())
            return


if __name__ == "__main__":
    main()
