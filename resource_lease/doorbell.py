"""A doorbell: how a recipe that waits outside the line of waiters is woken when what it waits
for changes (a barrier's members: one more inside, a cohort formed, one left).

Whoever changes the state rings (``Doorbell.ring``: one statement, the bump of an internal
topic, ``db/topics.py``); whoever waits sleeps on the bell (``Doorbell.listening``) between
its attempts, and wakes at the ring:

- in this process at once;
- in other processes by the topic's NOTIFY on PostgreSQL (the process's LISTEN connection,
  ``db/listen.py``), and elsewhere by a short look at the topic's version every ``LOOK``
  seconds (one primary-key read), as a line's first waiter looks where nothing is pushed.

The waiter's own attempts still run at least every ``BACKOFF_MAX`` seconds (its backoff):
that is the fallback, not the way it learns of a change (tests/test_liveness.py raises it
far above its deadline, so a missed ring is a failure, not a slow pass).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from resource_lease.conf import lease_settings
from resource_lease.db.listen import hub
from resource_lease.db.operations import ops
from resource_lease.db.topics import channel
from resource_lease.forking import PerProcess
from resource_lease.validation import MAX_NAME

#: The least seconds between two looks at a bell's version where nothing is pushed.
LOOK = 0.02

Sleep = Callable[[float], None]


class _Local:
    """This process's sleepers by bell, so that a ring here wakes them at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[tuple[str, str], set[threading.Event]] = {}

    def add(self, key: tuple[str, str], event: threading.Event) -> None:
        with self._lock:
            self._events.setdefault(key, set()).add(event)

    def remove(self, key: tuple[str, str], event: threading.Event) -> None:
        with self._lock:
            events = self._events.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._events[key]

    def wake(self, key: tuple[str, str]) -> None:
        with self._lock:
            events = list(self._events.get(key, ()))
        for event in events:
            event.set()


_local = PerProcess(_Local)


def bell_topic(what: str, name: str) -> str:
    """The internal topic of the bell of ``what`` ``name`` (``@bell:barrier:<name>``): within
    a topic's MAX_NAME characters, a name too long for it stands as its digest."""
    topic = f"@bell:{what}:{name}"
    if len(topic) <= MAX_NAME:
        return topic
    return f"@bell:{what}:#{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()}"


class Doorbell:
    """The bell of the ``what`` called ``name`` (a barrier, a dispenser): an internal topic
    (``bell_topic``), which operators see among the topics."""

    def __init__(self, using: str, what: str, name: str) -> None:
        self.using = using
        self.topic = bell_topic(what, name)
        self.channel = channel("topic", self.topic)

    def __repr__(self) -> str:
        return f"<Doorbell {self.topic!r}>"

    def ring(self) -> None:
        """The state changed: wake every waiter of the bell, here and in other processes."""
        ops(self.using).notify(self.topic, "null", self.channel)
        _local().wake((self.using, self.topic))

    def wake_here(self) -> None:
        """Wake this process's sleepers on the bell, without a ring (one of them must look
        at something else: a worker asked to stop)."""
        _local().wake((self.using, self.topic))

    def _version(self) -> int:
        row = ops(self.using).read_topic(self.topic)
        return 0 if row is None else row[0]

    @contextmanager
    def listening(self) -> Iterator[Sleep]:
        """While inside, ``sleep(seconds)`` waits up to ``seconds`` for a ring (any ring since
        the block was entered, or since the last sleep that a ring ended)."""
        event = threading.Event()
        key = (self.using, self.topic)
        _local().add(key, event)
        token = hub().subscribe(self.using, self.channel, event.set)
        seen = self._version()
        # Rung between the read above and the LISTEN coming into force: told by the version,
        # read once more the first time the LISTEN is seen in force.
        confirmed = False

        def sleep(seconds: float) -> None:
            nonlocal seen, confirmed
            deadline = time.monotonic() + max(0.0, seconds)
            while True:
                if token is not None and hub().listening(self.using, self.channel):
                    if not confirmed:
                        confirmed = True
                        version = self._version()
                        if version != seen:
                            seen = version
                            return
                    if event.wait(max(0.0, deadline - time.monotonic())):
                        event.clear()
                    return
                look = max(LOOK, float(lease_settings.LINE_POLL))
                if event.wait(max(0.0, min(look, deadline - time.monotonic()))):
                    event.clear()
                    return
                version = self._version()
                if version != seen:
                    seen = version
                    return
                if time.monotonic() >= deadline:
                    return

        try:
            yield sleep
        finally:
            _local().remove(key, event)
            hub().unsubscribe(token)


__all__ = ["LOOK", "Doorbell", "bell_topic"]
