"""A Celery prefork worker whose main process is busy with the library when it forks its pool
children, each of which takes a lease right after the fork (tests/test_celery.py).

    celery -A project worker -I tests.procs.celery_tasks,tests.procs.celery_fork -P prefork
        --max-tasks-per-child 1 ...

With ``RESOURCE_LEASE_TEST_FORK_DIR`` set:

- the main process, at ``worker_init`` (before the pool starts), keeps its keeper busy as
  tests/procs/fork_storm.py's parent does: short-ttl auto-renewed semaphore grants, a
  fast-polling ``Config.watch``, a waiter in line;
- each pool child, at ``worker_process_init`` (right after the fork, before it takes a
  task), writes ``forked-<pid>``, takes and releases one slot of a semaphore with
  ``timeout=2``, and writes ``done-<pid>`` (``ok`` or the error). A child that hangs has the
  first file and never the second.

``RESOURCE_LEASE_TEST_NO_FORK_GATE=1``: the fork gate disabled in the main process (a
negative control). The task ``fork_probe`` returns the pid of the child that ran it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from celery import signals

from project.celery import app

_DIR = os.environ.get("RESOURCE_LEASE_TEST_FORK_DIR", "")
_kept: list[Any] = []

if _DIR:
    # A child's lease takes longer than billiard's default 4 s to report "up" on a loaded
    # machine; a child that hangs is found by its missing done file, not killed early.
    app.conf.worker_proc_alive_timeout = 60.0


def _write(name: str, text: str) -> None:
    path = Path(_DIR) / name
    partial = path.with_name(f".partial-{name}")
    partial.write_text(text)
    os.replace(partial, path)


@signals.worker_init.connect
def _busy_main_process(**kwargs: Any) -> None:
    if not _DIR:
        return
    from django.apps import apps

    if not apps.ready:
        import django

        django.setup()
    from resource_lease import Config, lock, semaphore

    if os.environ.get("RESOURCE_LEASE_TEST_NO_FORK_GATE"):
        from resource_lease.forking import fork_gate

        fork_gate.disable()
    for _ in range(10):
        _kept.append(semaphore("celery-fork-busy", 10, ttl=0.6, timeout=30))
    config = Config("celery-fork", {"n": 0})
    _kept.append(config.watch(lambda key, old, new: None, poll=0.05))
    _kept.append(lock("celery-fork-line", ttl=2.4, timeout=30))

    def waiter() -> None:
        try:
            with lock("celery-fork-line", ttl=2.4, timeout=None):
                pass
        except Exception:  # noqa: BLE001  (the process is ending)
            pass

    threading.Thread(target=waiter, name="celery-fork-waiter", daemon=True).start()


@signals.worker_process_init.connect
def _lease_right_after_fork(**kwargs: Any) -> None:
    if not _DIR:
        return
    pid = os.getpid()
    _write(f"forked-{pid}", "")
    from resource_lease import semaphore

    try:
        with semaphore("celery-fork-child", 64, ttl=10, timeout=2, auto_renew=False):
            pass
        outcome = "ok"
    except Exception as exc:  # noqa: BLE001  (the outcome is the evidence)
        outcome = f"{type(exc).__name__}: {exc}"
    _write(f"done-{pid}", outcome)


@app.task(name="fork_probe")
def fork_probe() -> int:
    return os.getpid()
