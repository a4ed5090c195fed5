"""Notifications on the database: ``notify(topic, payload)`` and ``watch(topic, callback)``.

A topic is one row: a version raised by one on every ``notify`` (one upsert, so a new topic
is created once however many processes notify it at once) and the last payload. A watcher
remembers the last version it delivered and polls that one row; whenever the version moved
on, it calls back with the row's current payload and version. So changes that come close
together, or while the callback runs, are coalesced into one call, but the latest is never
missed: there is no "event" to lose, only a version to catch up with (the ZooKeeper watch of
the seed fired once and had to be set again, losing what happened in between). On PostgreSQL
the bump also sends a NOTIFY, which wakes the watcher at once; polling stays the fallback.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections, transaction

from resource_lease.conf import lease_settings
from resource_lease.db import dialect_class
from resource_lease.db.connections import close_connections, run_repeatable
from resource_lease.db.topics import Listener, channel, listener, statements
from resource_lease.exceptions import LeaseError
from resource_lease.validation import check_alias, check_callable, check_name, check_seconds

logger = logging.getLogger("resource_lease")

#: Default seconds between two reads of a watched row.
POLL = 1.0


def encode_json(value: Any, name: str) -> str:
    """``value`` as JSON text every vendor stores; ValueError naming ``name`` if it cannot be."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be JSON-serialisable (no NaN or infinity), got {value!r}: {exc}") from exc
    if "\\u0000" in text:
        raise ValueError(f"{name} must not contain NUL characters, got {value!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} must be valid Unicode text (no lone surrogates), got {value!r}") from exc
    return text


def decode_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def resolve_alias(using: str | None) -> str:
    return check_alias(str(lease_settings.DATABASE) if using is None else using)


def refuse_in_single_writer_transaction(alias: str, what: str) -> None:
    """SQLite has one writer: a write on the engine's connection would wait for the caller's
    own open transaction, so refuse instead of hanging for the busy timeout
    (docs/pitfalls.md#sqlite)."""
    if transaction.get_connection(alias).in_atomic_block and dialect_class(connections[alias].vendor).single_writer:
        raise LeaseError(
            f"{what} inside an open transaction on {alias!r}: this database has a single writer, so it would "
            "wait for your own transaction's lock. Call it outside atomic() (or in transaction.on_commit)."
        )


def notify(topic: str, payload: Any = None, *, using: str | None = None) -> int:
    """Raise the version of ``topic`` (created on first use) and store ``payload``.

    Returns the topic's new version: each call gets its own, and versions only go up.
    ``payload`` is any JSON-serialisable value. The change is committed at once, on the
    engine's own connection, whatever transaction the caller has open. A call whose answer
    was lost with the connection is sent again, so the version may move by two; a watcher
    sees the latest either way (docs/pitfalls.md#unknown-outcome).
    """
    topic = check_name(topic, "topic")
    text = encode_json(payload, "payload")
    alias = resolve_alias(using)
    refuse_in_single_writer_transaction(alias, "notify()")
    wake = channel("topic", topic)
    return run_repeatable(
        alias, lambda dialect, cursor: statements(dialect).notify(cursor, topic, text, wake), what=f"notify({topic!r})"
    )


def topic_state(topic: str, *, using: str | None = None) -> tuple[int, Any]:
    """``(version, payload)`` of ``topic`` now: ``(0, None)`` if it was never notified."""
    topic = check_name(topic, "topic")
    alias = resolve_alias(using)
    row = run_repeatable(
        alias, lambda dialect, cursor: statements(dialect).read_topic(cursor, topic), what=f"read topic {topic!r}"
    )
    return (0, None) if row is None else (row[0], decode_json(row[1]))


class Watch:
    """A background thread that calls ``check()`` every ``poll`` seconds, or at once when
    the database wakes it (PostgreSQL NOTIFY on ``wake_channel``), until ``stop()``.

    ``check`` reads the database and makes the callbacks. Database errors are logged (the
    first of a run loudly, with its traceback) and the thread goes on polling: once the
    database answers again, the next ``check`` catches up.
    """

    def __init__(self, *, name: str, alias: str, poll: float, wake_channel: str, check: Callable[[], None]) -> None:
        self.name = name
        self.alias = alias
        self.poll = poll
        self._wake_channel = wake_channel
        self._check = check
        self._stopping = threading.Event()
        self._listener: Listener | None = None
        self._listen_retry_at = 0.0
        self._listen_failing = False
        #: Set once the thread has ended (stopped, or failed).
        self.stopped = threading.Event()
        #: Database errors met so far (the thread goes on after each).
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name=f"resource-lease-watch:{name}"[:60], daemon=True)

    def __repr__(self) -> str:
        state = "stopped" if self.stopped.is_set() else "running"
        return f"<Watch {self.name!r} poll={self.poll:g}s {state}>"

    def start(self) -> Watch:
        self._thread.start()
        return self

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Stop watching: no callback starts after this returns (unless called from a
        callback, which then returns first). Joins the thread, which closes its connections."""
        self._stopping.set()
        if threading.current_thread() is not self._thread and self._thread.ident is not None:
            self._thread.join(timeout)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        failing = False
        try:
            while not self._stopping.is_set():
                self._ensure_listener()
                try:
                    self._check()
                except Exception as exc:
                    self.errors += 1
                    if not failing:
                        logger.error(
                            "watch %r: cannot read the database, retrying every %gs",
                            self.name,
                            self.poll,
                            exc_info=True,
                        )
                    else:
                        logger.debug("watch %r: still failing: %s", self.name, exc)
                    failing = True
                else:
                    if failing:
                        logger.warning("watch %r: the database answers again; caught up", self.name)
                    failing = False
                self._wait()
        finally:
            self._close_listener()
            close_connections()
            self.stopped.set()

    def _ensure_listener(self) -> None:
        if self._listener is not None or time.monotonic() < self._listen_retry_at:
            return
        self._listen_retry_at = time.monotonic() + self.poll
        try:
            # LISTEN before the read that follows: a change committed after that read wakes us.
            self._listener = listener(self.alias, self._wake_channel)
        except Exception as exc:
            if not self._listen_failing:
                logger.warning("watch %r: cannot LISTEN, polling every %gs", self.name, self.poll, exc_info=True)
            else:
                logger.debug("watch %r: still cannot LISTEN: %s", self.name, exc)
            self._listen_failing = True
        else:
            self._listen_failing = False

    def _wait(self) -> None:
        if self._listener is None:
            self._stopping.wait(self.poll)
            return
        try:
            self._listener.wait(self.poll, self._stopping)
        except Exception:
            logger.warning(
                "watch %r: lost the LISTEN connection; polling, listening again soon", self.name, exc_info=True
            )
            self._close_listener()

    def _close_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            except Exception:  # already broken
                logger.debug("closing a listener failed", exc_info=True)
            self._listener = None

    def listener_pid(self) -> int | None:
        """The LISTEN connection's server process id (PostgreSQL), for tests and operators."""
        current = self._listener
        return None if current is None else current.backend_pid()


def check_poll(poll: Any) -> float:
    return check_seconds(poll, "poll")


def watch(topic: str, callback: Callable[[Any, int], Any], *, poll: float = POLL, using: str | None = None) -> Watch:
    """Call ``callback(payload, version)`` from one background thread for every change of
    ``topic`` after this call: versions increase, the latest is always delivered, and
    changes close together (or during a call) may be coalesced into one call. Calls never
    overlap. A callback that raises is logged and the watch goes on. ``stop()`` ends it.
    """
    topic = check_name(topic, "topic")
    if check_callable(callback, "callback") is None:
        raise ValueError("callback must be callable, got None")
    poll = check_poll(poll)
    alias = resolve_alias(using)
    last = topic_state(topic, using=alias)[0]  # changes after this point are delivered
    warned: list[int] = []

    def check() -> None:
        nonlocal last
        row = run_repeatable(
            alias, lambda dialect, cursor: statements(dialect).read_topic(cursor, topic), what=f"watch {topic!r}"
        )
        version = 0 if row is None else row[0]
        if version < last and not warned:
            warned.append(version)
            logger.warning(
                "watch %r: the topic's version went down (%d < %d): was its row deleted?", topic, version, last
            )
        if version <= last:
            return
        last = version
        try:
            callback(decode_json(row[1] if row else None), version)
        except Exception:
            logger.exception("watch %r: the callback failed at version %d; watching on", topic, version)

    return Watch(name=topic, alias=alias, poll=poll, wake_channel=channel("topic", topic), check=check).start()


__all__ = ["Watch", "notify", "topic_state", "watch"]
