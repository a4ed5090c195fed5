"""PostgreSQL: the LISTEN thread reads the notifications of a readable connection itself
(``db.listen._drain``: libpq's ``consume_input`` and ``notifies``), and through psycopg's
``notifies()`` once after a LISTEN or UNLISTEN ran on the connection, so that a notification
psycopg kept while that command ran (its backlog) is not lost.

Real sessions, a real NOTIFY from another connection. Negative control: the same sequence
read without the backlog loses the notification, which is what the flag is for. And the
thread no longer sets its LISTENs up again at each wake-up, only after a subscription changed:
a new subscription is still in force at once, and one dropped stops reaching its callback.
"""

from __future__ import annotations

import select
import threading
import time
from typing import Any

import pytest
from django.db import connection

from resource_lease.db.connections import LeaseConnection
from resource_lease.db.listen import Hub, _Alias, _drain

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN is PostgreSQL's"),
]


def _notify(channel: str, payload: str) -> None:
    other = LeaseConnection("default")
    try:
        other.wrapper.ensure_connection()
        raw = other.wrapper.connection
        raw.autocommit = True
        raw.execute("SELECT pg_notify(%s, %s)", (channel, payload))
    finally:
        other.close()


def _listening_state(channels: set[str]) -> tuple[Hub, _Alias]:
    hub, state = Hub(), _Alias()
    hub._listen_on("default", state, channels)
    return hub, state


def _readable(state: _Alias, timeout: float = 5.0) -> None:
    fd = state.conn.wrapper.connection.fileno()
    ready, _, _ = select.select([fd], [], [], timeout)
    assert ready, "no notification reached the LISTEN connection"


def test_notifications_of_a_readable_connection_are_read_in_order() -> None:
    hub, state = _listening_state({"rl_drain_a"})
    try:
        assert state.backlog  # its LISTEN ran: the first read goes through notifies()
        assert _drain(state) == []
        assert not state.backlog
        for n in range(3):
            _notify("rl_drain_a", f"p{n}")
        deadline = time.monotonic() + 5
        notes: list[tuple[str, str]] = []
        while len(notes) < 3 and time.monotonic() < deadline:
            _readable(state)
            notes += _drain(state)
        assert notes == [("rl_drain_a", "p0"), ("rl_drain_a", "p1"), ("rl_drain_a", "p2")]
    finally:
        state.conn.close()


def _kept_while_listening(state: _Alias) -> None:
    """A NOTIFY on a channel already listened to arrives while the connection runs the LISTEN
    of another: psycopg reads it during that command and keeps it in its backlog."""
    _notify("rl_drain_a", "meanwhile")
    time.sleep(0.2)  # delivered to the socket before the next command's answer
    Hub()._listen_on("default", state, {"rl_drain_a", "rl_drain_b"})


def test_a_notification_read_while_a_listen_ran_is_not_lost() -> None:
    _hub, state = _listening_state({"rl_drain_a"})
    try:
        _drain(state)
        _kept_while_listening(state)
        assert state.backlog
        assert _drain(state) == [("rl_drain_a", "meanwhile")]
    finally:
        state.conn.close()


def test_negative_control_without_the_backlog_that_notification_is_lost() -> None:
    _hub, state = _listening_state({"rl_drain_a"})
    try:
        _drain(state)
        _kept_while_listening(state)
        state.backlog = False  # read as if nothing had been kept
        assert _drain(state) == []
    finally:
        state.conn.close()


def test_the_thread_listens_at_once_to_a_new_subscription_and_stops_for_a_dropped_one() -> None:
    hub = Hub()
    heard: dict[str, list[Any]] = {"one": [], "two": []}
    got = threading.Event()

    def hears(name: str) -> Any:
        def wake(payload: str | None) -> None:
            heard[name].append(payload)
            got.set()

        return wake

    def in_force(channel: str) -> None:
        deadline = time.monotonic() + 5
        while not hub.listening("default", channel):
            assert time.monotonic() < deadline, f"LISTEN {channel} never came into force"
            time.sleep(0.01)

    try:
        one = hub.subscribe("default", "rl_drain_one", hears("one"), payload=True)
        in_force("rl_drain_one")
        _notify("rl_drain_one", "x")
        assert got.wait(5) and heard["one"] == ["x"]
        # The thread has served wake-ups since: a subscription made now is listened to.
        two = hub.subscribe("default", "rl_drain_two", hears("two"), payload=True)
        in_force("rl_drain_two")
        got.clear()
        _notify("rl_drain_two", "y")
        assert got.wait(5) and heard["two"] == ["y"]
        hub.unsubscribe(one)
        deadline = time.monotonic() + 5
        while hub.listening("default", "rl_drain_one"):
            assert time.monotonic() < deadline, "UNLISTEN rl_drain_one never ran"
            time.sleep(0.01)
        _notify("rl_drain_one", "z")
        got.clear()
        _notify("rl_drain_two", "w")  # after z: once w is heard, z was read too
        assert got.wait(5) and heard["two"] == ["y", "w"]
        assert heard["one"] == ["x"]
        hub.unsubscribe(two)
    finally:
        hub.close()
