"""The waiting benchmark's task, as it runs inside one worker process (``workers.TASKS``).

P workers share one lock (or a pool of S): each asks (waiting as long as it takes, up to the
window's end), holds for ``hold`` seconds, releases and asks again at once. Every acquisition
is recorded on the host's monotonic clock (shared by every process), so the parent can tell
utilisation, fairness, the worst wait and the hand-off gap (release to the next grant).

The contenders, each waiting its own way:

- ``engine``: ``lock(name, timeout=...)`` / ``acquire(kind, timeout=...)``: the line of
  waiters (resource_lease.line);
- ``before``: the same calls, run by workers whose ``resource_lease`` is an older checkout
  (``lease_bench --before PATH``): only the public API is used here, so any version runs;
- ``zookeeper``: kazoo's ``Lock`` / ``Semaphore`` recipes on a local ZooKeeper;
- ``redis-lock``: python-redis-lock's ``Lock`` (woken by BLPOP when the holder releases);
- ``redis-py``: redis-py's ``Lock`` (polls every 0.1 s).
"""

from __future__ import annotations

import time
from typing import Any

from project.bench.workers import Task, _sleep_until

#: Seconds python-redis-lock and redis-py keep a lock without renewal (never reached here).
PEER_EXPIRE = 60

#: Seconds a worker waits for its acquisition before the window (``WaitTask.prepare``).
WARM_UP_TIMEOUT = 30.0


class Waits:
    """One contender's acquire and release, with a timeout (None when it ran out)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def acquire(self, timeout: float) -> Any:
        raise NotImplementedError

    def release(self, handle: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class EngineWaits(Waits):
    def __init__(self, spec: dict[str, Any]) -> None:
        from resource_lease.db.connections import lease_connection

        self.spec = spec
        lease_connection("default").cursor().close()  # connected before the start
        self.listening = _listen_before_the_start("default")

    def acquire(self, timeout: float) -> Any:
        from resource_lease import acquire, lock
        from resource_lease.exceptions import NoResourceAvailable

        ttl = float(self.spec["ttl"])
        try:
            if self.spec["what"] == "lock":
                return lock(self.spec["name"], ttl=ttl, timeout=timeout, auto_renew=False)
            return acquire(self.spec["kind"], ttl=ttl, timeout=timeout)
        except NoResourceAvailable:  # LockHeld too
            return None

    def release(self, handle: Any) -> None:
        handle.release()

    def close(self) -> None:
        from resource_lease.db.connections import close_connections

        if self.listening:
            from resource_lease.line.wakeups import unlisten

            unlisten("default")
        close_connections()


def _listen_before_the_start(alias: str) -> bool:
    """Where releases wake waiters (PostgreSQL), have this process's LISTEN in force before the
    window starts, as a peer's client connects its session first (kazoo's ``start``): else the
    first wait of every process in the window pays for a new connection and polls until its
    LISTEN is up. True if this process now listens (``unlisten`` at the end)."""
    try:
        from resource_lease.line.wakeups import listen, pushed
    except ImportError:  # an engine from before the line
        return False
    listen(alias)
    deadline = time.monotonic() + 10
    while not pushed(alias) and time.monotonic() < deadline:
        time.sleep(0.005)
    return True


class ZooKeeperWaits(Waits):
    def __init__(self, spec: dict[str, Any]) -> None:
        from kazoo.client import KazooClient

        self.client = KazooClient(hosts=spec["zookeeper"], timeout=10)
        self.client.start(timeout=10)
        path = f"/resource-lease-bench/{spec['run_id']}/{spec['case']}"
        if spec["what"] == "lock":
            self.recipe = self.client.Lock(path)
        else:
            self.recipe = self.client.Semaphore(path, max_leases=int(spec["slots"]))

    def acquire(self, timeout: float) -> Any:
        from kazoo.exceptions import LockTimeout

        try:
            return self.recipe if self.recipe.acquire(timeout=max(timeout, 0.001)) else None
        except LockTimeout:
            return None

    def release(self, handle: Any) -> None:
        handle.release()

    def close(self) -> None:
        self.client.stop()
        self.client.close()


class RedisLockWaits(Waits):
    """python-redis-lock: a waiter blocks in BLPOP on a list the releaser pushes to."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import redis
        import redis_lock

        self.conn = redis.Redis.from_url(spec["redis_url"])
        self.lock = redis_lock.Lock(self.conn, f"resource-lease-bench:{spec['run_id']}:{spec['case']}", PEER_EXPIRE)

    def acquire(self, timeout: float) -> Any:
        # Whole seconds only (0 would mean "for ever"): a worker may wait past the window.
        return self.lock if self.lock.acquire(blocking=True, timeout=max(1, int(timeout))) else None

    def release(self, handle: Any) -> None:
        handle.release()

    def close(self) -> None:
        self.conn.close()


class RedisPyWaits(Waits):
    """redis-py's Lock: a waiter polls every 0.1 s (its default ``sleep``)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import redis

        self.conn = redis.Redis.from_url(spec["redis_url"])
        self.name = f"resource-lease-bench:{spec['run_id']}:{spec['case']}:py"

    def acquire(self, timeout: float) -> Any:
        lock = self.conn.lock(self.name, timeout=PEER_EXPIRE, sleep=0.1, blocking_timeout=max(timeout, 0.001))
        return lock if lock.acquire() else None

    def release(self, handle: Any) -> None:
        handle.release()

    def close(self) -> None:
        self.conn.close()


WAITS: dict[str, type[Waits]] = {
    "engine": EngineWaits,
    "before": EngineWaits,
    "zookeeper": ZooKeeperWaits,
    "redis-lock": RedisLockWaits,
    "redis-py": RedisPyWaits,
}


class WaitTask(Task):
    """Ask, hold, release, ask again, until the window's end; every acquisition recorded."""

    def prepare(self) -> dict[str, Any]:
        self.waits = WAITS[self.spec["contender"]](self.spec)
        # One acquisition before the window, as the cycle scenario warms up: the window then
        # measures processes that ask again (the steady state), not every process's first call
        # (statements not yet planned, renewal thread not started) all at the same instant.
        handle = self.waits.acquire(WARM_UP_TIMEOUT)
        if handle is not None:
            self.waits.release(handle)
        return {}

    def run(self, start: float, stop: float) -> dict[str, Any]:
        from project.bench.counting import engine_counter

        hold = float(self.spec["hold"])
        acquisitions: list[tuple[float, float, float]] = []
        pending = None
        waiting_statements = 0
        _sleep_until(start)
        stats0 = _line_stats()
        while True:
            asked = time.monotonic()
            if asked >= stop:
                break
            before, _ = engine_counter.snapshot()
            handle = self.waits.acquire(stop - asked)
            granted = time.monotonic()
            waiting_statements += engine_counter.snapshot()[0] - before
            if handle is None:
                pending = asked  # still waiting when the window ended
                break
            time.sleep(hold)
            released = time.monotonic()  # before the release is sent: inside the real holding
            self.waits.release(handle)
            acquisitions.append((asked, granted, released))
            if granted >= stop:
                break
        stats1 = _line_stats()
        return {
            "acquisitions": acquisitions,
            "pending": pending,
            "waiting_statements": waiting_statements,
            "line": {key: stats1[key] - stats0.get(key, 0) for key in stats1},
        }

    def cleanup(self) -> None:
        waits = getattr(self, "waits", None)
        if waits is not None:
            waits.close()


def _line_stats() -> dict[str, int]:
    """The line's counters in this process (resource_lease.line.stats), if this version has them."""
    try:
        from resource_lease.line import stats
    except ImportError:  # an engine from before the line
        return {}
    return stats.as_dict()
