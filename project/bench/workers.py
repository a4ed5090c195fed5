"""Worker processes: the child's entry point and the parent's handle on a set of them.

A worker is a real process, ``python -m project.bench.workers``, set up with Django on the
database under test (``DATABASE_URL``). It reads one JSON task per line on stdin and answers
on stdout in two steps, so that every worker of a measurement starts at the same instant:

1. it prepares (connects, warms up, takes its leases) and answers ``{"state": "ready"}``;
2. the parent sends ``{"start": t0, "stop": t1}`` (``time.monotonic()`` values, which every
   process of the machine shares), the worker runs from t0 to t1 and answers
   ``{"state": "done", "result": {...}}``.

Any failure answers ``{"state": "error", "error": traceback}``. stdout carries only the
protocol; anything printed goes to stderr, which the parent sends to a log file.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

BASE_DIR = Path(__file__).resolve().parent.parent.parent


class WorkerError(RuntimeError):
    """A worker failed, hung or died."""


# -- the child ----------------------------------------------------------------------------


class Channel:
    """The child's end of the protocol."""

    def __init__(self, inp: IO[str], out: IO[str]) -> None:
        self.inp = inp
        self.out = out

    def send(self, message: dict[str, Any]) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def receive(self) -> dict[str, Any] | None:
        line = self.inp.readline()
        return json.loads(line) if line else None


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _us(seconds: float) -> int:
    # Latencies travel as whole microseconds: compact JSON, more precision than we need.
    return round(seconds * 1_000_000)


class Task:
    """One task in a worker: ``prepare`` before the start signal, ``run`` in the window."""

    def __init__(self, spec: dict[str, Any], channel: Channel) -> None:
        self.spec = spec
        self.channel = channel

    def prepare(self) -> dict[str, Any]:
        return {}

    def run(self, start: float, stop: float) -> dict[str, Any]:
        raise NotImplementedError

    def cleanup(self) -> None:
        pass


class CycleTask(Task):
    """Acquire and release as fast as possible with one contender."""

    def prepare(self) -> dict[str, Any]:
        from project.bench.baselines import make_contender

        self.contender = make_contender(self.spec["contender"], **self.spec["options"])
        for _ in range(int(self.spec.get("warmup", 2))):  # connect, fill caches
            self.contender.release(self.contender.acquire())
        return {}

    def run(self, start: float, stop: float) -> dict[str, Any]:
        contender = self.contender
        contender.lost = 0
        contender.deadline = stop + 30
        latencies: list[int] = []
        clock = time.perf_counter
        cycles = 0
        _sleep_until(start)
        statements0, errors0 = contender.counter.snapshot()
        cpu0 = time.process_time()
        begun = time.monotonic()
        while time.monotonic() < stop:
            t0 = clock()
            handle = contender.acquire()
            latencies.append(_us(clock() - t0))
            contender.release(handle)
            cycles += 1
        elapsed = time.monotonic() - begun
        cpu = time.process_time() - cpu0
        statements1, errors1 = contender.counter.snapshot()
        return {
            "cycles": cycles,
            "elapsed": elapsed,
            "cpu": cpu,
            "latencies_us": latencies,
            "lost": contender.lost + (errors1 - errors0),
            "statements": statements1 - statements0,
            "errors": errors1 - errors0,
        }

    def cleanup(self) -> None:
        contender = getattr(self, "contender", None)
        if contender is not None:
            # Closed when the next task arrives, not now: the parent reads the server's CPU
            # once every worker has said "done", and a backend that has exited by then cannot
            # be read (the window's server CPU read 0 on PostgreSQL, one backend per worker).
            _closing.append(contender)


#: Contenders of finished cycle windows, closed when the worker is given its next task.
_closing: list[Any] = []


def _close_finished() -> None:
    while _closing:
        _closing.pop().close()


class ScarceTask(Task):
    """Scarcity: acquire (waiting as long as needed), hold, release, again, until the stop."""

    def run(self, start: float, stop: float) -> dict[str, Any]:
        from project.bench.counting import engine_counter
        from resource_lease.exceptions import NoResourceAvailable
        from resource_lease.lease import acquire

        kind, ttl, hold = self.spec["kind"], float(self.spec["ttl"]), float(self.spec["hold"])
        waits: list[int] = []
        held = 0.0
        acquire_statements = 0
        _sleep_until(start)
        total0, _ = engine_counter.snapshot()
        while True:
            t0 = time.monotonic()
            if t0 >= stop:
                break
            before, _ = engine_counter.snapshot()
            try:
                lease = acquire(kind, ttl=ttl, timeout=stop - t0)
            except NoResourceAvailable:
                acquire_statements += engine_counter.snapshot()[0] - before
                break
            granted = time.monotonic()
            acquire_statements += engine_counter.snapshot()[0] - before
            waits.append(_us(granted - t0))
            time.sleep(hold)
            # Counted up to the release being sent: the interval then lies inside the real
            # holding, so no two workers' intervals on one resource overlap (utilisation <= 1).
            held += min(time.monotonic(), stop) - max(granted, start)
            lease.release()
        total1, _ = engine_counter.snapshot()
        return {
            "grants": len(waits),
            "waits_us": waits,
            "held": held,
            "acquire_statements": acquire_statements,
            "statements": total1 - total0,
            "elapsed": time.monotonic() - start,
        }

    def cleanup(self) -> None:
        from resource_lease.db.connections import close_connections

        close_connections()


class HoldTask(Task):
    """Crash recovery, the victim: take one lease, renew it in the background, wait to die."""

    def prepare(self) -> dict[str, Any]:
        from resource_lease.lease import acquire

        self.lease = acquire(self.spec["kind"], ttl=float(self.spec["ttl"]), timeout=10, auto_renew=True)
        return {"pk": self.lease.resource.pk, "fence": self.lease.fence}

    def run(self, start: float, stop: float) -> dict[str, Any]:
        time.sleep(3600)  # until SIGKILL
        raise AssertionError("a holder was not killed")


class GrabTask(Task):
    """Crash recovery, the successor: wait for a resource; hold it until told to let go."""

    def prepare(self) -> dict[str, Any]:
        from resource_lease.exceptions import NoResourceAvailable
        from resource_lease.lease import acquire

        self.lease: Any = None
        try:
            acquire(self.spec["kind"], ttl=1, timeout=0)  # connect; every resource is held
        except NoResourceAvailable:
            pass
        return {}

    def run(self, start: float, stop: float) -> dict[str, Any]:
        from resource_lease.lease import acquire

        _sleep_until(start)
        self.lease = acquire(self.spec["kind"], ttl=60, timeout=max(0.0, stop - time.monotonic()))
        return {
            "granted_at": time.monotonic(),
            "pk": self.lease.resource.pk,
            "took_over": self.lease.resource.took_over,
        }

    def cleanup(self) -> None:
        from resource_lease.db.connections import close_connections

        if self.lease is not None:
            self.channel.receive()  # hold it until every successor has reported
            self.lease.release()
        close_connections()


class RenewTask(Task):
    """Renewal load: hold many auto-renewed leases and time each background renewal.

    The leases are taken evenly over one renew interval, so their renewals come at a steady
    rate (as for leases taken over time), not in one burst.
    """

    #: (lease id, start, seconds) of each renewal, appended by the renewal thread.
    renewals: list[tuple[int, float, float]] = []

    def prepare(self) -> dict[str, Any]:
        from resource_lease.conf import lease_settings
        from resource_lease.lease import Lease, acquire

        if not getattr(Lease.renew, "_timed", False):
            renew = Lease.renew

            def timed(lease: Lease, ttl: float | None = None) -> Any:
                # Only renewals that succeeded: one refused before any statement (its local
                # deadline passed while the machine was loaded) is a lost lease, not a renewal
                # (19 "renewals" for 12 statements, once in CI).
                t0 = time.monotonic()
                expiry = renew(lease, ttl)
                RenewTask.renewals.append((id(lease), t0, time.monotonic() - t0))
                return expiry

            timed._timed = True  # type: ignore[attr-defined]
            Lease.renew = timed  # type: ignore[method-assign,assignment]
        ttl = float(self.spec["ttl"])
        n = int(self.spec["leases"])
        interval = ttl * float(lease_settings.RENEW_FRACTION)
        began = time.monotonic()
        self.leases = []
        for i in range(n):
            _sleep_until(began + interval * i / n)
            self.leases.append(acquire(self.spec["kind"], ttl=ttl, timeout=10, auto_renew=True))
        return {"held": len(self.leases), "interval": interval}

    def run(self, start: float, stop: float) -> dict[str, Any]:
        from project.bench.counting import engine_counter
        from resource_lease.conf import lease_settings

        interval = float(self.spec["ttl"]) * float(lease_settings.RENEW_FRACTION)
        _sleep_until(start)
        statements0, errors0 = engine_counter.snapshot()
        RenewTask.renewals.clear()
        _sleep_until(stop)
        statements1, errors1 = engine_counter.snapshot()
        # The renewals that began and ended inside the window: their statements are between
        # the two snapshots. (One that began before the window and ended after the clear above
        # was counted without its statement: 47 statements for 48 renewals, once in CI.)
        done = [r for r in RenewTask.renewals if start <= r[1] and r[1] + r[2] <= stop]
        # How late each renewal started: the renewal thread plans the next one an interval
        # after the previous one ended.
        lateness = []
        previous: dict[int, tuple[float, float]] = {}
        for lease, t0, took in sorted(done, key=lambda r: r[1]):
            if lease in previous:
                p0, ptook = previous[lease]
                lateness.append(_us(max(0.0, t0 - (p0 + ptook + interval))))
            previous[lease] = (t0, took)
        return {
            "renewals": len(done),
            "at": [round(t0 - start, 4) for _, t0, _ in done],
            "latencies_us": [_us(took) for _, _, took in done],
            "lateness_us": lateness,
            "statements": statements1 - statements0,
            "errors": errors1 - errors0,
            "lost": sum(lease.lost for lease in self.leases),
            "elapsed": stop - start,
        }

    def cleanup(self) -> None:
        for lease in getattr(self, "leases", []):
            lease.release()
        RenewTask.renewals.clear()


TASKS: dict[str, type[Task]] = {
    "cycle": CycleTask,
    "scarce": ScarceTask,
    "hold": HoldTask,
    "grab": GrabTask,
    "renew": RenewTask,
}


def _profiled(task: Task, start: float, stop: float, path: str) -> dict[str, Any]:
    import cProfile

    profiler = cProfile.Profile()
    try:
        return profiler.runcall(task.run, start, stop)
    finally:
        profiler.dump_stats(path)


def main() -> None:
    # stdout is the protocol: keep a private handle on it and send stray prints to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr
    channel = Channel(sys.stdin, out)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    engine = os.environ.get(ENGINE_ENV)
    if engine:
        # Ahead of the working directory, which ``python -m`` puts first on sys.path: on
        # PYTHONPATH alone, the checkout's own resource_lease would be the one imported.
        sys.path.insert(0, engine)
    import django

    django.setup()
    if engine:
        import resource_lease

        where = Path(resource_lease.__file__).resolve().parent
        if where != (Path(engine) / "resource_lease").resolve():
            raise WorkerError(f"asked to benchmark the resource_lease in {engine}, imported {where}")
    from django.db import connection

    from project.bench.counting import count_engine_statements, django_statement_counter
    from project.bench.wait_task import WaitTask

    TASKS["wait"] = WaitTask  # registered here: wait_task builds on this module
    count_engine_statements()
    connection.execute_wrappers.append(django_statement_counter)
    channel.send({"state": "started", "pid": os.getpid()})

    while (spec := channel.receive()) is not None:
        _close_finished()
        task: Task | None = None
        try:
            task = TASKS[spec["task"]](spec, channel)
            channel.send({"state": "ready", **task.prepare()})
            go = channel.receive()
            if go is None:
                break
            if "start" in go:
                profile = spec.get("profile")
                if profile:
                    result = _profiled(task, go["start"], go["stop"], profile)
                else:
                    result = task.run(go["start"], go["stop"])
                channel.send({"state": "done", "result": result})
        except Exception:  # noqa: BLE001 - whatever it is, the parent must hear of it
            channel.send({"state": "error", "error": traceback.format_exc()})
        finally:
            if task is not None:
                try:
                    task.cleanup()
                except Exception:  # noqa: BLE001 - reported to the parent like any failure
                    traceback.print_exc()
                    channel.send({"state": "error", "error": traceback.format_exc()})


# -- the parent ---------------------------------------------------------------------------


#: The directory (``engine_shim``) whose resource_lease a worker imports instead of this checkout's.
ENGINE_ENV = "LEASE_BENCH_ENGINE"


def engine_shim(engine_path: str) -> Path:
    """A directory whose only entry is ``resource_lease``, linked to the one in
    ``engine_path`` (a checkout of another version): put first on sys.path by the worker
    (``ENGINE_ENV``), the workers import that engine and this project (the benchmark) alike."""
    source = Path(engine_path).resolve() / "resource_lease"
    if not (source / "__init__.py").exists():
        raise WorkerError(f"{engine_path} has no resource_lease package to benchmark")
    shim = Path(os.environ.get("TMPDIR", "/tmp")) / f"lease-bench-engine-{abs(hash(str(source)))}"
    shim.mkdir(exist_ok=True)
    link = shim / "resource_lease"
    if not link.is_symlink():
        link.symlink_to(source)
    return shim


def worker_env(database_url: str, *, audit: bool = False, engine_path: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url
    env["DJANGO_SETTINGS_MODULE"] = "project.settings"
    # Django's debug cursor keeps every query; the engine's raw cursors would not pay for it.
    env["DJANGO_DEBUG"] = "0"
    # The app ships with the audit trail off; the demo project turns it on.
    env["RESOURCE_LEASE_AUDIT"] = "1" if audit else "0"
    env.setdefault("RESOURCE_LEASE_LOG", "WARNING")
    env.pop("RESOURCE_LEASE_TEST_DB_NAME", None)
    env["PYTHONPATH"] = str(BASE_DIR) + os.pathsep + env.get("PYTHONPATH", "")
    if engine_path is not None:
        env[ENGINE_ENV] = str(engine_shim(engine_path))
    return env


class Worker:
    """The parent's handle on one worker process."""

    def __init__(self, database_url: str, log: IO[str], *, audit: bool = False, engine_path: str | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "project.bench.workers"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=worker_env(database_url, audit=audit, engine_path=engine_path),
            cwd=BASE_DIR,
            text=True,
            bufsize=1,
        )
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.messages.put(json.loads(line))
            except ValueError:
                self.messages.put({"state": "error", "error": f"not a protocol line: {line!r}"})
        self.messages.put(None)

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerError(f"worker {self.proc.pid} is gone: {exc}") from exc

    def expect(self, state: str, timeout: float) -> dict[str, Any]:
        try:
            message = self.messages.get(timeout=timeout)
        except queue.Empty:
            raise WorkerError(f"worker {self.proc.pid}: no {state!r} within {timeout:.0f}s") from None
        if message is None:
            raise WorkerError(f"worker {self.proc.pid} exited (code {self.proc.wait()}); see the workers' log")
        if message.get("state") != state:
            raise WorkerError(f"worker {self.proc.pid}: expected {state!r}, got:\n{message.get('error', message)}")
        return message

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


class Workers:
    """A growing set of worker processes on one database; tasks go to the first n."""

    start_timeout = 120.0

    def __init__(
        self, database_url: str, log_path: Path, *, audit: bool = False, engine_path: str | None = None
    ) -> None:
        self.database_url = database_url
        self.audit = audit
        #: Workers import the resource_lease of this checkout instead (``engine_shim``).
        self.engine_path = engine_path
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log_path, "a")  # noqa: SIM115 (closed by close())
        self.workers: list[Worker] = []

    def spawn(self, n: int) -> list[Worker]:
        """Start n new workers (in parallel) and wait until each has set Django up."""
        new = [Worker(self.database_url, self.log, audit=self.audit, engine_path=self.engine_path) for _ in range(n)]
        try:
            for worker in new:
                worker.expect("started", self.start_timeout)
        except WorkerError:
            for worker in new:
                worker.kill()
            raise
        return new

    def ensure(self, n: int) -> list[Worker]:
        if len(self.workers) < n:
            self.workers.extend(self.spawn(n - len(self.workers)))
        return self.workers[:n]

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        self.workers.clear()
        self.log.close()


def run_window(
    workers: Iterable[Worker],
    specs: Iterable[dict[str, Any]],
    duration: float,
    *,
    ready_timeout: float = 120.0,
    grace: float = 120.0,
    on_ready: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Give each worker its task, start them all at one instant, return their results;
    ``on_ready`` is called once every worker is ready, just before the start (a reading of
    the server's CPU that leaves the workers' connecting out)."""
    pairs = list(zip(workers, specs, strict=True))
    prepare(pairs, ready_timeout)
    if on_ready is not None:
        on_ready()
    start = time.monotonic() + 0.05
    go(pairs, start, start + duration)
    return [worker.expect("done", duration + grace)["result"] for worker, _ in pairs]


def prepare(pairs: list[tuple[Worker, dict[str, Any]]], timeout: float) -> list[dict[str, Any]]:
    """Send each worker its task and wait until all are ready (or abort the ready ones)."""
    for worker, spec in pairs:
        worker.send(spec)
    answers: list[dict[str, Any]] = []
    failure: WorkerError | None = None
    for worker, _ in pairs:
        try:
            answers.append(worker.expect("ready", timeout))
        except WorkerError as exc:
            failure = failure or exc
            answers.append({})
    if failure is not None:
        for (worker, _), answer in zip(pairs, answers, strict=True):
            if answer:
                worker.send({"abort": True})
        raise failure
    return answers


def go(pairs: list[tuple[Worker, dict[str, Any]]], start: float, stop: float) -> None:
    for worker, _ in pairs:
        worker.send({"start": start, "stop": stop})


if __name__ == "__main__":
    main()
