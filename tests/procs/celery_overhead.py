"""Per-task overhead of LeaseTask over a plain task, measured with one worker in one run.

    DATABASE_URL=mysql://root@127.0.0.1:3306/rl_celery \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/5 CELERY_RESULT_BACKEND=redis://127.0.0.1:6379/5 \\
    python -m tests.procs.celery_overhead --pairs 500 [--pool prefork] [--json]

Starts one ``celery worker`` (concurrency 1) with tests.procs.celery_tasks, then sends
``tests.plain_noop`` and ``tests.leased_noop`` one at a time, interleaved (the order flips
every pair so neither always goes first), after a warm-up. Two figures per task type:

- runtime: what Celery's tracer measures in the worker ("succeeded in Xs"): the body plus,
  for LeaseTask, the acquire, the registration with the renewal thread and the release;
- round trip: send to result in the client, through the broker and the result backend.

The overhead is the difference of the medians and of the p99s. Run it on a quiet machine;
it is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.procs import setup

TASKS = ("tests.plain_noop", "tests.leased_noop")
SUCCEEDED = re.compile(r"Task (tests\.\w+)\[([0-9a-f-]+)\] succeeded in ([0-9.e-]+)s")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def describe(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "median_ms": statistics.median(values) * 1e3,
        "p99_ms": quantile(values, 0.99) * 1e3,
        "mean_ms": statistics.fmean(values) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=500, help="measured (plain, leased) pairs")
    parser.add_argument("--warmup", type=int, default=30, help="pairs sent first and not counted")
    parser.add_argument("--pool", choices=("prefork", "threads", "solo"), default="prefork")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.pairs < 10 or args.warmup < 0:
        parser.error("--pairs must be >= 10 and --warmup >= 0")
    setup()

    from django.conf import settings
    from django.core.management import call_command

    from project.celery import app
    from resource_lease.models import Resource

    call_command("migrate", verbosity=0)
    for i in range(2):
        Resource.objects.get_or_create(kind="celery-bench", name=f"bench-{i}", defaults={"data": {"i": i}})

    queue = f"overhead-{uuid.uuid4().hex[:8]}"
    log_path = Path(settings.VAR_DIR) / "celery_overhead-worker.log"
    command = [sys.executable, "-m", "celery", "-A", "project", "worker", "-I", "tests.procs.celery_tasks"]
    command += ["-Q", queue, "-n", f"{queue}@%h", "-P", args.pool, "-c", "1", "-l", "info"]
    command += ["--without-mingle", "--without-gossip", "--without-heartbeat"]
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            command, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        while " ready." not in log_path.read_text():
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the worker did not start; see {log_path}")
            time.sleep(0.1)

        round_trip: dict[str, list[float]] = {name: [] for name in TASKS}
        counted: set[str] = set()
        for i in range(args.warmup + args.pairs):
            for name in TASKS if i % 2 == 0 else TASKS[::-1]:
                start = time.perf_counter()
                result = app.send_task(name, queue=queue)
                result.get(timeout=60)
                took = time.perf_counter() - start
                if i >= args.warmup:
                    round_trip[name].append(took)
                    counted.add(result.id)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)

    runtime: dict[str, list[float]] = {name: [] for name in TASKS}
    for match in SUCCEEDED.finditer(log_path.read_text()):
        name, task_id, seconds = match.groups()
        if task_id in counted:
            runtime[name].append(float(seconds))

    db = settings.DATABASES["default"]
    report = {
        "database": f"{db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']}",
        "broker": settings.CELERY_BROKER_URL,
        "pool": args.pool,
        "pairs": args.pairs,
        "runtime": {name: describe(values) for name, values in runtime.items()},
        "round_trip": {name: describe(values) for name, values in round_trip.items()},
    }
    for figure in ("runtime", "round_trip"):
        plain, leased = (report[figure][name] for name in TASKS)  # type: ignore[index]
        report[f"{figure}_overhead"] = {
            "median_ms": leased["median_ms"] - plain["median_ms"],
            "p99_ms": leased["p99_ms"] - plain["p99_ms"],
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{report['database']}, broker {report['broker']}, {args.pool} pool, {args.pairs} interleaved pairs")
    for figure in ("runtime", "round_trip"):
        for name in TASKS:
            d = report[figure][name]  # type: ignore[index]
            print(f"  {figure:10} {name:18} median {d['median_ms']:8.3f} ms   p99 {d['p99_ms']:8.3f} ms   (n={d['n']})")
        o = report[f"{figure}_overhead"]
        print(f"  {figure:10} {'overhead':18} median {o['median_ms']:8.3f} ms   p99 {o['p99_ms']:8.3f} ms")  # type: ignore[index]


if __name__ == "__main__":
    main()
