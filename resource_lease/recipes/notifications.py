"""Notifications on the database: ``notify(topic, payload)`` and ``watch(topic, callback)``.

A topic is one row: a version raised by one on every ``notify`` (one upsert, so a new topic
is created once however many processes notify it at once) and the last payload. A watcher
remembers the last version it delivered and polls that one row; whenever the version moved
on, it calls back with the row's current payload and version. So changes that come close
together, or while the callback runs, are coalesced into one call, but the latest is never
missed: there is no "event" to lose, only a version to catch up with (the ZooKeeper watch of
a hand-written pipeline fired once and had to be set again, losing what happened in between). On PostgreSQL
the bump also sends a NOTIFY, which wakes the watcher at once; polling stays the fallback.
Each watch is a ``resource_lease.watching.Watch``, polled by the process's keeper.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from resource_lease.db.operations import ops
from resource_lease.db.topics import channel
from resource_lease.validation import (
    check_callable,
    check_name,
    check_seconds,
    encode_json,
    refuse_inside_single_writer_transaction,
    resolve_using,
)
from resource_lease.watching import Watch

logger = logging.getLogger("resource_lease")

#: Default seconds between two reads of a watched row.
POLL = 1.0


def decode_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def check_poll(poll: Any) -> float:
    return check_seconds(poll, "poll")


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
    alias = resolve_using(using)
    refuse_inside_single_writer_transaction(alias, "notify()")
    wake = channel("topic", topic)
    return ops(alias).notify(topic, text, wake)


def topic_state(topic: str, *, using: str | None = None) -> tuple[int, Any]:
    """``(version, payload)`` of ``topic`` now: ``(0, None)`` if it was never notified."""
    topic = check_name(topic, "topic")
    alias = resolve_using(using)
    row = ops(alias).read_topic(topic)
    return (0, None) if row is None else (row[0], decode_json(row[1]))


def watch(topic: str, callback: Callable[[Any, int], Any], *, poll: float = POLL, using: str | None = None) -> Watch:
    """Call ``callback(payload, version)`` for every change of ``topic`` after this call:
    versions increase, the latest is always delivered, and changes close together (or during
    a call) may be coalesced into one call. Calls never overlap and run on one thread (the
    watch's callback thread, never the keeper's). A callback that raises is logged and the
    watch goes on. ``stop()`` ends it.
    """
    topic = check_name(topic, "topic")
    if check_callable(callback, "callback") is None:
        raise ValueError("callback must be callable, got None")
    poll = check_poll(poll)
    alias = resolve_using(using)
    last = topic_state(topic, using=alias)[0]  # changes after this point are delivered
    warned: list[int] = []

    def check(emit: Callable[..., None]) -> None:
        nonlocal last
        row = ops(alias).read_topic(topic)
        version = 0 if row is None else row[0]
        if version < last and not warned:
            warned.append(version)
            logger.warning(
                "watch %r: the topic's version went down (%d < %d): was its row deleted?", topic, version, last
            )
        if version <= last:
            return
        last = version
        emit(decode_json(row[1] if row else None), version)

    return Watch(
        name=topic, using=alias, poll=poll, wake_channel=channel("topic", topic), check=check, callback=callback
    ).start()


__all__ = ["Watch", "notify", "topic_state", "watch"]
