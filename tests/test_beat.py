"""LeaderScheduler: two real ``celery beat`` processes on a real broker, one sends.

Each test starts ``celery -A tests.procs.beat_app beat`` twice (tests/procs/beat_app.py: a
task every second, another every SLOW seconds, on a queue of the test's own) and counts the
messages that reach the broker with a consumer in the test process, noting when each
arrived and which beat sent it (the ``origin`` header: ``gen<pid>@<host>``).

The broker is Redis (RESOURCE_LEASE_TEST_BEAT_REDIS_URL, by default database 11, which no
other test uses); tests marked ``on_both_brokers`` also run on RabbitMQ
(RESOURCE_LEASE_TEST_AMQP_URL, a queue of their own on its default vhost), skipped with the
reason if it cannot be reached (failed if RESOURCE_LEASE_REQUIRE_RABBITMQ=1).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from resource_lease import Election
from tests.conftest import spawn, worker_env
from tests.short_mode import once_across_backends

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

REDIS_URL = os.environ.get("RESOURCE_LEASE_TEST_BEAT_REDIS_URL", "redis://127.0.0.1:6379/11")
AMQP_URL = os.environ.get("RESOURCE_LEASE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
REQUIRE_RABBITMQ = os.environ.get("RESOURCE_LEASE_REQUIRE_RABBITMQ", "") not in ("", "0")
# The leadership's ttl: 3 s rather than 2, or in CI's first minutes (six runs starting at once)
# the first leader's renewal came late now and then, another beat took over before the test
# killed the leader, and the scenario's precondition failed.
TTL = 3.0
IN_FLIGHT = 0.5  # seconds a message sent just before a kill may take to reach the consumer
SLOW = 5.0


@dataclass(frozen=True)
class Sent:
    at: float  # time.monotonic() when the test's consumer received it
    task: str
    pid: int  # of the beat that sent it


class Broker:
    """A queue of the test's own on a broker, and a consumer thread recording what arrives."""

    def __init__(self, url: str) -> None:
        from kombu import Connection, Exchange, Queue

        self.url = url
        self.queue_name = f"rl-beat-{uuid.uuid4().hex[:12]}"
        self.queue = Queue(self.queue_name, Exchange(self.queue_name, type="direct"), routing_key=self.queue_name)
        self.connection = Connection(url, connect_timeout=3)
        self.sent: list[Sent] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._consume, daemon=True)
        self._thread.start()
        assert self._ready.wait(30), "the consumer did not start"

    def _consume(self) -> None:
        def received(body: Any, message: Any) -> None:
            origin = str(message.headers.get("origin", "gen0@"))
            self.sent.append(Sent(time.monotonic(), message.headers["task"], int(origin[3:].split("@")[0])))
            message.ack()

        with self.connection.clone() as connection:
            with connection.Consumer(self.queue, callbacks=[received], accept=["json"]):
                self._ready.set()
                while not self._stop.is_set():
                    try:
                        connection.drain_events(timeout=0.2)
                    except TimeoutError:
                        continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with self.connection.clone() as connection:
            self.queue(connection.default_channel).delete()
        self.connection.release()

    def of(self, task: str) -> list[Sent]:
        return [s for s in self.sent if s.task == task]


def reachable(url: str) -> str | None:
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=2) as connection:
            connection.connect()
    except Exception as exc:  # noqa: BLE001 - refused, timed out, no such vhost
        return repr(exc)
    return None


@pytest.fixture(params=["redis"])
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    url = {"redis": REDIS_URL, "rabbitmq": AMQP_URL}[request.param]
    if request.param == "rabbitmq":
        once_across_backends("RabbitMQ's side of a beat test (the same test runs on Redis here)")
    problem = reachable(url)
    if problem is not None:
        if request.param == "rabbitmq" and REQUIRE_RABBITMQ:
            pytest.fail(f"RabbitMQ {url} cannot be used ({problem}) and RESOURCE_LEASE_REQUIRE_RABBITMQ is set")
        pytest.skip(f"{request.param} broker cannot be used ({problem})")
    broker = Broker(url)
    yield broker
    broker.close()


on_both_brokers = pytest.mark.parametrize("broker", ["redis", "rabbitmq"], indirect=True)


class Beat:
    def __init__(self, broker: Broker, directory: Path, election: str, scheduler: str, n: int) -> None:
        env = worker_env(
            BEAT_TEST_BROKER_URL=broker.url,
            BEAT_TEST_QUEUE=broker.queue_name,
            BEAT_TEST_ELECTION=election,
            BEAT_TEST_TTL=str(TTL),
            BEAT_TEST_SLOW=str(SLOW),
        )
        self.log = directory / f"beat{n}.log"
        self._out = open(self.log, "w")  # noqa: SIM115 (closed in stop)
        args = ["-A", "tests.procs.beat_app", "beat", "-S", scheduler, "-l", "info"]
        args += ["--pidfile", str(directory / f"beat{n}.pid"), "-s", str(directory / f"beat{n}-schedule")]
        self.proc = spawn("celery", *args, env=env, stdout=self._out, stderr=subprocess.STDOUT)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)  # every thread's stack into its log (beat_app)
            time.sleep(1.0)
            self.proc.kill()
            self._out.close()
            raise AssertionError(f"the beat did not exit 60 s after {sig!r}: {self.log.read_text()[-6000:]}") from None
        self._out.close()


@pytest.fixture
def beats(tmp_path: Path, broker: Broker) -> Iterator[Any]:
    started: list[Beat] = []

    def start(scheduler: str = "resource_lease.contrib.beat:LeaderScheduler") -> Beat:
        beat = Beat(broker, tmp_path, tmp_path.name, scheduler, len(started))
        started.append(beat)
        return beat

    yield start
    for beat in started:
        beat.stop(signal.SIGKILL)


def wait_until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)
    return value


def leader_pid(name: str) -> int | None:
    holder = Election(name, holder="observer").leader()
    return None if holder is None else int(holder.rsplit(":", 1)[1])


def gaps(sent: list[Sent]) -> list[float]:
    return [round(b.at - a.at, 2) for a, b in zip(sent, sent[1:], strict=False)]


def run_and_kill_the_leader(broker: Broker, beats: Any, tmp_path: Path, scheduler: str | None = None) -> float:
    """Two beats started together; once the leader has sent the slow task, SIGKILL it; watch
    the other take over. Returns the moment of the kill (time.monotonic())."""
    kwargs = {} if scheduler is None else {"scheduler": scheduler}
    started = {beat.proc.pid: beat for beat in (beats(**kwargs), beats(**kwargs))}
    leader = wait_until(lambda: leader_pid(tmp_path.name), 60, "a beat to lead")
    wait_until(lambda: broker.of("tests.beat.slow"), 60, "the leader to send the slow task")
    assert leader_pid(tmp_path.name) == leader
    started.pop(leader).stop(signal.SIGKILL)
    killed = time.monotonic()
    (other,) = started.values()
    wait_until(lambda: [s for s in broker.sent if s.pid == other.proc.pid], 30, "the other beat to send")
    time.sleep(SLOW + 1.5)  # the other's first slow send falls due SLOW after the dead one's
    other.stop()
    time.sleep(0.5)  # the consumer drains the last messages
    return killed


def test_a_standby_beat_logs_that_it_stands_by_and_who_leads(broker: Broker, beats: Any, tmp_path: Path) -> None:
    first, second = beats(), beats()
    leader = wait_until(lambda: leader_pid(tmp_path.name), 60, "a beat to lead")
    standby = second if leader == first.proc.pid else first
    line = f":{leader} leads {tmp_path.name!r}; this beat ("
    wait_until(lambda: line in standby.log.read_text(), 30, "the standby beat to say who leads")
    text = standby.log.read_text()
    assert "beat: standing by: " in text and f"{standby.proc.pid}) sends nothing until it leads" in text


@on_both_brokers
def test_one_beat_sends_each_tick_and_the_other_takes_over_after_a_kill(
    broker: Broker, beats: Any, tmp_path: Path
) -> None:
    killed = run_and_kill_the_leader(broker, beats, tmp_path)
    ticks, slow = broker.of("tests.beat.tick"), broker.of("tests.beat.slow")
    old, new = ticks[0].pid, ticks[-1].pid
    # By sender: a tick the leader sent just before it was killed reaches the test's consumer
    # a moment after the kill (seen in CI: 0.01 s after).
    before = [s for s in ticks if s.pid == old]
    after = [s for s in ticks if s.pid != old]
    takeover = after[0].at - killed
    print(
        f"beat on {broker.url.split(':')[0]}: {len(before)} ticks before the kill, {len(after)} after; "
        f"take-over {takeover:.2f}s; tick gaps {gaps(ticks)}; slow gaps {gaps(slow)}"
    )
    assert old != new and {s.pid for s in after} == {new}
    assert before[-1].at < killed + IN_FLIGHT, "the killed beat's ticks kept arriving"
    assert after[0].at > killed, "the other beat sent while the leader lived"
    span = before[-1].at - before[0].at
    assert len(before) <= span + 2, "more than one message per tick while both beats ran"
    assert len(before) >= 3
    assert takeover <= TTL + 1.0 + 2.0, "the other beat did not take over within ttl + 1 s"
    # The dead leader sent the slow task just before it died; the new leader starts from
    # the stored last-run time, so it sends it SLOW seconds after that, not at once again.
    assert len(slow) >= 2 and slow[0].pid == old and slow[1].pid == new
    assert min(gaps(slow)) >= SLOW - 0.7, f"the slow task was sent again too soon: {gaps(slow)}"
    # Nothing skipped: the new leader's first tick catches up at once.
    assert len(after) >= SLOW


def test_negative_control_beats_without_the_election_send_every_tick_twice(
    broker: Broker, beats: Any, tmp_path: Path
) -> None:
    """The same count must catch two plain beats (each sends): else it proves nothing."""
    beats(scheduler="celery.beat:PersistentScheduler")
    beats(scheduler="celery.beat:PersistentScheduler")
    wait_until(lambda: len({s.pid for s in broker.sent}) == 2, 60, "both beats to send")
    start = time.monotonic()
    time.sleep(6.0)
    both = [s for s in broker.of("tests.beat.tick") if s.at >= start]
    print(f"negative control, two plain beats: {len(both)} ticks in 6 s")
    assert len(both) > 6 + 2, "the count did not notice two beats sending"


def test_negative_control_a_leader_that_forgets_the_stored_schedule_resends(
    broker: Broker, beats: Any, tmp_path: Path
) -> None:
    """The slow-task check must catch a new leader that starts from its own stale times."""
    run_and_kill_the_leader(broker, beats, tmp_path, scheduler="tests.procs.beat_app:ForgetfulScheduler")
    slow = broker.of("tests.beat.slow")
    print(f"negative control, forgetful leader: slow gaps {gaps(slow)}")
    assert len(slow) >= 2
    assert min(gaps(slow)) < SLOW - 0.7, "the check did not notice the slow task sent again"


def test_the_banner_line_is_indented_like_celerys_own() -> None:
    """``celery beat`` prints the scheduler's ``info`` as one line of its "Configuration ->"
    list: before, "leader election (not set up)" stood unindented among "    . x -> y" lines."""
    from celery.apps.beat import STARTUP_INFO_FMT

    from resource_lease.contrib.beat import LeaderScheduler

    scheduler = LeaderScheduler.__new__(LeaderScheduler)
    scheduler.election = None
    for election in (None, Election("celery-beat:banner", ttl=15)):
        scheduler.election = election
        banner = STARTUP_INFO_FMT.format(
            timestamp="now",
            conninfo="redis://",
            loader="app",
            scheduler="LeaderScheduler",
            scheduler_info=scheduler.info,
            logfile="[stderr]",
            loglevel="INFO",
            hmax_interval="5.00 seconds",
            max_interval=5,
            remote_control_info="",
        )
        listed = banner.split("Configuration ->\n", 1)[1].splitlines()
        assert all(line.startswith("    . ") for line in listed), banner
        assert any(line.startswith("    . leader election -> ") for line in listed), banner


def test_a_closing_scheduler_resigns_and_a_resignation_that_hangs_does_not_hold_it_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``celery beat`` closes the scheduler from its SIGTERM handler, on the main thread
    wherever the signal found it: the resignation runs on a thread of its own, waited for a
    bounded time. A real election resigns (the leadership is free at once); one whose
    resignation hangs (a lock the interrupted frame holds) is left to end by its ttl, and the
    close returns. Negative control: the hanging one is still hanging when the close returns."""
    from resource_lease.contrib.beat import resign_within

    election = Election(f"beat-close-{uuid.uuid4().hex[:6]}", ttl=30, holder="closing")
    assert election.campaign(timeout=0)
    resign_within(election, 10.0)
    assert election.leader() is None

    started, release = threading.Event(), threading.Event()

    class Stuck:
        name = "stuck"

        def resign(self) -> bool:
            started.set()
            return release.wait(30)

    began = time.monotonic()
    resign_within(Stuck(), 0.3)  # type: ignore[arg-type]
    took = time.monotonic() - began
    try:
        assert started.is_set() and 0.25 <= took < 5.0, took
        assert not release.is_set()  # the control: it was still hanging
        assert "resigning 'stuck' took longer than 0.3s" in caplog.text
    finally:
        release.set()
