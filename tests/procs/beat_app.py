"""The Celery app that tests/test_beat.py runs ``celery beat`` with (several at once).

    celery -A tests.procs.beat_app beat -S resource_lease.contrib.beat:LeaderScheduler

Its schedule: ``tests.beat.tick`` every second and ``tests.beat.slow`` every BEAT_TEST_SLOW
seconds, sent to the queue BEAT_TEST_QUEUE on BEAT_TEST_BROKER_URL; the election's name and
ttl come from BEAT_TEST_ELECTION and BEAT_TEST_TTL. Nothing consumes the tasks but the
test, which counts the messages. ``ForgetfulScheduler`` is the negative control: a leader
that starts from its own in-memory schedule instead of the stored one.
"""

from __future__ import annotations

import faulthandler
import os
import signal
from typing import Any

from celery import Celery

from resource_lease.contrib.beat import LeaderScheduler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
# SIGUSR1 writes every thread's stack to the beat's log: the test asks for it when a beat
# does not exit after SIGTERM (once in a rehearsal, with no clue in the log).
faulthandler.register(signal.SIGUSR1, all_threads=True)

app = Celery("rl-beat-test", broker=os.environ.get("BEAT_TEST_BROKER_URL", "memory://"))
app.conf.update(
    task_default_queue=os.environ.get("BEAT_TEST_QUEUE", "rl-beat-test"),
    beat_schedule={
        "tick": {"task": "tests.beat.tick", "schedule": 1.0},
        "slow": {"task": "tests.beat.slow", "schedule": float(os.environ.get("BEAT_TEST_SLOW", "5"))},
    },
    beat_leader_name=os.environ.get("BEAT_TEST_ELECTION", "beat-test"),
    beat_leader_ttl=float(os.environ.get("BEAT_TEST_TTL", "2")),
    beat_max_loop_interval=1,
    broker_connection_retry_on_startup=True,
)


class ForgetfulScheduler(LeaderScheduler):
    """Leads like LeaderScheduler but ignores the stored schedule when it takes over."""

    def _load(self, state: dict[str, Any]) -> None:
        self._heap = None
