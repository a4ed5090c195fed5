"""A worker for the probe test: acquire() (which probes sampled free ids by primary key),
run the unsafe critical section, record it in the ledger, release; at the end print how
many probes it sent and how many of them granted, as JSON.

    python -m tests.procs.probe_race --kind K --dir D --seconds S [--hold H] [--trusting]

``--trusting`` is the negative control: a probe that trusts the sample and grants the
sampled id without re-checking that it is free (the cache used for the decision).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from tests.procs import setup


def trust_the_sample() -> None:
    from resource_lease.db.connections import lease_connection
    from resource_lease.db.grants import LeaseStatements
    from resource_lease.db.line import Ask

    def trusting_grant(self: LeaseStatements, cursor: Any, ask: Ask, *, sampled: Any, token: str, **_: Any) -> Any:
        # The grant without its free condition, written on the spot: the vendor's RETURNING
        # form (on MySQL the UPDATE and the read of its row, docs/pitfalls.md#no-returning).
        d = self.d
        p = d.placeholder
        update = f"UPDATE {d.table} SET {d.grant_set} WHERE id = {p} AND kind = {p}"
        where = f"id = {p} AND grant_token = {p}"
        sql = d.returning_template.format(update=update, returning=d.columns, read_back=where, table=d.table)
        params = (ask.holder, token, d.ttl_param(10.0), 0.0, sampled[0], ask.kind)
        return d.returning_row(cursor, sql, params, read_params=(sampled[0], token))

    type(lease_connection().dialect.leases).grant_sampled = trusting_grant  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--hold", type=float, default=0.002)
    parser.add_argument("--trusting", action="store_true")
    args = parser.parse_args()
    setup()
    if args.trusting:
        trust_the_sample()

    from resource_lease import NoResourceAvailable, acquire
    from resource_lease.db.connections import lease_connection
    from tests.ledger import work_and_record

    worker = str(os.getpid())
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        try:
            lease = acquire(args.kind, ttl=10.0, timeout=1.0)
        except NoResourceAvailable:
            continue
        work_and_record(args.dir, worker, lease.resource.pk, lease.fence, args.hold)
        lease.release()  # the trusting variant's releases may be refused: its grants overlap
    picker = lease_connection().picker
    print(json.dumps({"probes": picker.probes, "hits": picker.probe_hits}), flush=True)


if __name__ == "__main__":
    main()
