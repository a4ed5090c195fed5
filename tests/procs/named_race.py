"""Race for a brand-new named row: create it on first use and try once to be granted it.

    python -m tests.procs.named_race --kind K --name N --go PATH [--plain-insert]

Prints ``READY`` once set up, waits until the file PATH exists (so every racer starts
together, however slowly each started), then prints ``GRANTED <fence>`` or ``REFUSED``; any
exception (an IntegrityError, a deadlock that surfaced) is printed as ``ERROR <repr>`` with
exit status 1. ``--plain-insert`` is the negative control: a check and a plain INSERT per
racer instead of the race-safe insert.
"""

from __future__ import annotations

import argparse
import os
import time

from tests.procs import setup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--go", required=True)
    parser.add_argument("--plain-insert", action="store_true")
    args = parser.parse_args()
    setup()
    from resource_lease import named
    from resource_lease.lease import default_holder
    from resource_lease.models import Resource

    if args.plain_insert:
        # The negative control: "create if missing" as a check and a plain INSERT, with the
        # pause a loaded client may take between the two (as the ledger's counter does).
        def plain_ensure(alias: str, kind: str, names: list[str], **kwargs: object) -> None:
            for name in names:
                if not Resource.objects.using(alias).filter(kind=kind, name=name).exists():
                    time.sleep(0.5)
                    Resource.objects.using(alias).create(kind=kind, name=name)

        named.ensure = plain_ensure  # type: ignore[assignment]
    from django.db import connection

    from resource_lease.db.connections import lease_connection

    connection.ensure_connection()  # connected before the start, so racers start together
    lease_connection("default").cursor().close()
    print("READY", flush=True)
    while not os.path.exists(args.go):
        time.sleep(0.001)
    try:
        lease = named.try_grant("default", args.kind, args.name, holder=default_holder(), ttl=30)
    except Exception as exc:  # noqa: BLE001 - the test counts whatever surfaced
        print(f"ERROR {exc!r}", flush=True)
        raise SystemExit(1) from None
    print("REFUSED" if lease is None else f"GRANTED {lease.fence}", flush=True)


if __name__ == "__main__":
    main()
