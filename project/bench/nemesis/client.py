"""A nemesis client: uses one primitive again and again and writes down what it trusted.

    python -m project.bench.nemesis.client --primitive lock --dir D --name c3 --object N ...

Set up with Django on ``DATABASE_URL`` (project.settings). Until the file ``D/stop`` exists
it runs its primitive's loop (a dispenser client puts new items until ``D/drain`` exists) and appends one line per fact to
``D/history-<name>-<pid>``, line-buffered so that a SIGKILL loses at most the line being
written (the checker ignores a torn last line). Times are CLOCK_MONOTONIC nanoseconds, which
every process of the machine shares (libfaketime moves only the wall clock).

The lines (``checker.py`` reads them):

- ``unit ROW FENCE T0 T1 [SEMAPHORE]``: the client trusted its grant of ROW under FENCE from T0
  to T1 (a semaphore's slots are its rows).
  T0 is taken after the grant was received and before a ``check()``; T1 before a second
  ``check()`` that passed, so the interval lies inside the grant's validity by the local
  deadline (a client stopped past its ttl fails that check and records nothing).
- ``wait T0 T1 OUTCOME TIMEOUT``: one wait for a grant (granted, timeout, lost, error).
- ``save ROW FENCE UNITS T``: an election's hand-over state saved (``{"units": UNITS}``);
  ``unsaved ROW FENCE UNITS T``: a save whose answer was lost with the connection (it may
  have been written).
- ``round BARRIER ROUND FENCE COHORT T0 T1``: a barrier member inside round ROUND with that cohort.
- ``claim KEY FENCE T`` and ``done KEY FENCE COUNT T``: dispenser items claimed and marked
  done (COUNT: what ``done`` said it marked, 0 or 1); ``put PREFIX N T``: items
  ``PREFIX:0`` .. ``PREFIX:N-1`` put, the put acknowledged; ``unknown KEY FENCE T``: a
  ``done`` whose answer was lost with the connection (it may have been marked).
- ``view OK|MISSING T``: a group member that trusted its membership read ``view()``.
- ``loss T TEXT``: a LeaseError (loud: a lost lease, an unreachable database, a refusal).
- ``error T TEXT``: any other exception (the contract: every error is a LeaseError).

``--patch MODULE`` imports MODULE first: the test suite's broken variants (negative controls).
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


class History:
    """The client's history file."""

    def __init__(self, directory: Path, name: str) -> None:
        self.file: IO[str] = open(directory / f"history-{name}-{os.getpid()}", "a", buffering=1)  # noqa: SIM115

    def write(self, *fields: object) -> None:
        self.file.write(" ".join(str(f) for f in fields) + "\n")


def now() -> int:
    return time.monotonic_ns()


class Client:
    """One primitive's loop; ``step()`` is one round of use (a grant, a leadership, a batch)."""

    def __init__(self, args: argparse.Namespace, history: History) -> None:
        self.args = args
        self.history = history
        self.ttl: float = args.ttl
        self.hold: float = args.hold
        self.wait_timeout: float = args.wait
        self.name: str = args.name
        self.object: str = args.object

    def pick(self) -> str:
        """One of the run's ``--objects`` locks, semaphores or elections, at random."""
        return f"{self.object}-{random.randrange(self.args.objects)}"

    def units(self, lease: Any, row: object, fence: int, group: str = "-") -> None:
        """Work under ``lease`` for 1 to 3 units, each recorded only if trusted throughout
        (``group``: the semaphore whose slots the rows are)."""
        for _ in range(random.randint(1, 3)):
            t0 = now()
            lease.check()
            time.sleep(self.hold)
            t1 = now()
            lease.check()
            self.history.write("unit", row, fence, t0, t1, group)

    def waited(self, take: Callable[[], Any]) -> Any:
        """Run one wait for a grant and record it; the grant or None (timed out)."""
        from resource_lease.exceptions import LeaseLost, NoResourceAvailable

        t0 = now()
        try:
            got = take()
        except NoResourceAvailable:
            self.history.write("wait", t0, now(), "timeout", self.wait_timeout)
            return None
        except LeaseLost:
            self.history.write("wait", t0, now(), "lost", self.wait_timeout)
            raise
        except Exception:
            self.history.write("wait", t0, now(), "error", self.wait_timeout)
            raise
        self.history.write("wait", t0, now(), "granted", self.wait_timeout)
        from resource_lease.line import stats

        # This client's hand-offs so far (PostgreSQL's RELEASE): handed, of which taken as
        # the release's NOTIFY described them (no read); and the places its keeper left for
        # waiters that could not (the database away as they left). Figures, not verdicts.
        self.history.write("line", stats.handed, stats.handed_unread, stats.leaves_retried)
        return got

    def step(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class LeaseClient(Client):
    def step(self) -> None:
        from resource_lease import acquire

        lease = self.waited(lambda: acquire(self.object, ttl=self.ttl, timeout=self.wait_timeout, auto_renew=True))
        if lease is not None:
            with lease:
                self.units(lease, lease.resource.pk, lease.fence)


class LockClient(Client):
    def take(self, name: str) -> Any:
        from resource_lease import lock

        return lock(name, ttl=self.ttl, timeout=self.wait_timeout)

    def step(self) -> None:
        name = self.pick()
        lease = self.waited(lambda: self.take(name))
        if lease is not None:
            with lease:
                self.units(lease, lease.resource.pk, lease.fence, name)


class SemaphoreClient(LockClient):
    def take(self, name: str) -> Any:
        from resource_lease import semaphore

        return semaphore(name, self.args.slots, ttl=self.ttl, timeout=self.wait_timeout)


class ElectionClient(Client):
    def __init__(self, args: argparse.Namespace, history: History) -> None:
        super().__init__(args, history)
        from resource_lease import Election

        holder = f"{self.name}-{os.getpid()}"
        self.elections = [Election(f"{self.object}-{i}", ttl=self.ttl, holder=holder) for i in range(args.objects)]
        self.election = self.elections[0]

    def step(self) -> None:
        from resource_lease.exceptions import LeaseDatabaseError

        self.election = random.choice(self.elections)
        lease = self.waited(lambda: self.election.campaign(timeout=self.wait_timeout))
        if lease is None:
            return
        try:
            for _ in range(random.randint(1, 3)):
                units = int(self.election.state.get("units", 0))
                t0 = now()
                lease.check()
                time.sleep(self.hold)
                t1 = now()
                lease.check()
                self.history.write("unit", lease.resource.pk, lease.fence, t0, t1)
                try:
                    self.election.save_state({"units": units + 1})
                except LeaseDatabaseError:
                    # Maybe saved: the answer lost with the connection (a switchover). The
                    # same leader may go on in the same term (its resign failed too).
                    self.history.write("unsaved", lease.resource.pk, lease.fence, units + 1, now())
                    raise
                self.history.write("save", lease.resource.pk, lease.fence, units + 1, now())
        finally:
            self.election.resign()

    def close(self) -> None:
        for election in self.elections:
            election.resign()


class GroupClient(Client):
    """Members whose names are shared by pairs of clients: at most one live process may be a
    given member at a time; a member that trusts its membership is in ``view()``."""

    def step(self) -> None:
        from resource_lease import Group
        from resource_lease.exceptions import MemberTaken

        group = Group(self.object, ttl=self.ttl, member=self.args.member)
        try:
            self.waited(lambda: group.join(timeout=self.wait_timeout))
        except MemberTaken:
            self.history.write("wait", now(), now(), "timeout", self.wait_timeout)
            return
        try:
            for _ in range(random.randint(1, 3)):
                lease = group._row.lease  # the membership's grant (its fence): what the checker judges
                if lease is None:
                    time.sleep(self.hold)  # lost; the keeper joins again
                    continue
                t0 = now()
                lease.check()
                names, index = group.view()
                time.sleep(self.hold)
                t1 = now()
                lease.check()
                self.history.write("unit", f"member:{self.args.member}", lease.fence, t0, t1)
                self.history.write("view", "OK" if index >= 0 and self.args.member in names else "MISSING", t1)
        finally:
            group.leave()
        time.sleep(random.uniform(0.05, 0.3))  # let the other client of this name have its turn


class BarrierClient(Client):
    def step(self) -> None:
        from resource_lease import DoubleBarrier
        from resource_lease.exceptions import BarrierTimeout

        barrier = DoubleBarrier(
            self.args.barrier, size=self.args.size, ttl=self.ttl, member=f"{self.name}-{os.getpid()}"
        )
        try:
            cohort = self.waited(lambda: barrier.enter(timeout=self.wait_timeout))
        except BarrierTimeout:
            self.history.write("wait", now(), now(), "timeout", self.wait_timeout)
            return
        lease = barrier._lease  # our member row's grant, renewed while inside
        assert lease is not None
        try:
            for _ in range(random.randint(1, 2)):
                t0 = now()
                lease.check()
                time.sleep(self.hold)
                t1 = now()
                lease.check()
                self.history.write("round", self.args.barrier, barrier.round, lease.fence, ",".join(cohort), t0, t1)
        finally:
            try:
                barrier.leave(timeout=self.ttl * 3 + self.wait_timeout)
            except BarrierTimeout as exc:
                self.history.write("loss", now(), f"leave: {exc}".replace("\n", " "))


class DispenserClient(Client):
    def __init__(self, args: argparse.Namespace, history: History) -> None:
        super().__init__(args, history)
        from resource_lease import Dispenser

        self.dispenser = Dispenser(self.object, ttl=self.ttl, max_attempts=1000)
        self.worker = f"{self.name}-{os.getpid()}"
        self.made = 0

    def step(self) -> None:
        from resource_lease.exceptions import LeaseDatabaseError

        t0 = now()
        items = self.dispenser.assign(self.worker, limit=5)
        self.history.write("wait", t0, now(), "granted" if items else "timeout", 0)
        if not items:
            if not (self.args.dir / "drain").exists():
                self.made += 1
                self.dispenser.put({f"{self.worker}:{self.made}:{i}": {"i": i} for i in range(20)})
                self.history.write("put", f"{self.worker}:{self.made}", 20, now())
            else:
                time.sleep(0.05)
            return
        for item in items:
            self.history.write("claim", item.key, item.fence, now())
        for item in items:
            time.sleep(self.hold)
            try:
                count = self.dispenser.done(self.worker, [item])
            except LeaseDatabaseError:
                # Maybe marked (OutcomeUnknown: the answer lost with the connection, and no
                # primary yet to read it back from; a failover's switchover).
                self.history.write("unknown", item.key, item.fence, now())
                raise
            self.history.write("done", item.key, item.fence, count, now())

    def close(self) -> None:
        self.dispenser.release(self.worker)


CLIENTS: dict[str, type[Client]] = {
    "lease": LeaseClient,
    "lock": LockClient,
    "semaphore": SemaphoreClient,
    "election": ElectionClient,
    "group": GroupClient,
    "barrier": BarrierClient,
    "dispenser": DispenserClient,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--primitive", choices=sorted(CLIENTS), required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--object", required=True, help="the kind, lock, election, group, barrier or dispenser name")
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--hold", type=float, default=0.01)
    parser.add_argument("--wait", type=float, default=2.0)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--size", type=int, default=3)
    parser.add_argument("--member", default="")
    parser.add_argument("--objects", type=int, default=1, help="how many locks, semaphores or elections")
    parser.add_argument("--barrier", default="", help="the barrier this client enters")
    parser.add_argument("--patch", default="")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    if args.patch:
        importlib.import_module(args.patch)

    from resource_lease.exceptions import LeaseError

    history = History(args.dir, args.name)
    history.write("start", os.getpid(), args.name, now())
    client: Client | None = None
    stop = args.dir / "stop"
    while not stop.exists():
        try:
            if client is None:
                client = CLIENTS[args.primitive](args, history)
            client.step()
        except LeaseError as exc:
            history.write("loss", now(), f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300])
            time.sleep(0.05)
        except Exception as exc:  # noqa: BLE001  (written down: the checker counts it)
            history.write("error", now(), f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300])
            client = None
            time.sleep(0.2)
    try:
        if client is not None:
            client.close()
    except LeaseError:
        pass
    history.write("end", now())
    sys.stdout.flush()
    os._exit(0)  # no waiting for the keeper's daemon thread at shutdown


if __name__ == "__main__":
    main()
