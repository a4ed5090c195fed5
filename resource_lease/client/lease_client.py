"""The HTTP API's client and the ``resource-lease`` command, in one file of the standard
library only (docs/http.md#client): copy it anywhere Python 3.11 runs.

    resource-lease run --url URL --kind gpu [--where k=v]... [--ttl 60] [--wait 600] -- CMD [ARG...]
    resource-lease acquire --kind gpu [--ttl S] [--wait S]      (prints the lease as JSON)
    resource-lease renew ID [--ttl S]
    resource-lease release ID

The token comes from ``RESOURCE_LEASE_TOKEN``, the URL from ``--url`` or ``RESOURCE_LEASE_URL``.
``run`` passes the resource to the command in ``RESOURCE_LEASE_KIND``, ``RESOURCE_LEASE_NAME``,
``RESOURCE_LEASE_FENCE``, ``RESOURCE_LEASE_DATA`` (JSON) and ``RESOURCE_LEASE_ID``, renews the
lease every ttl/3 while the command runs, stops the command (SIGTERM, then SIGKILL after
``--grace`` seconds) if the lease is lost (410, or no successful renewal before its local
deadline), releases the lease when the command exits, and exits with the command's status
(128 + the signal's number if a signal ended it; 75 when no lease was had in time).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any


class ApiError(Exception):
    """An answer other than success: ``status``, the server's ``error`` and ``field``; status
    0 when the server could not be reached."""

    def __init__(self, status: int, error: str, *, field: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(f"{status}: {error}" + (f" (field {field})" if field else ""))
        self.status = status
        self.error = error
        self.field = field
        self.retry_after = retry_after


class NotGranted(ApiError):
    """423: no resource in time (``retry_after``: seconds the server suggests)."""


class LeaseGone(ApiError):
    """410: the lease is no longer held."""


class LeaseClient:
    """The API at ``url`` (e.g. ``http://host/lease/api/``) with a bearer ``token``."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/") + "/"
        self.token = token
        self.timeout = timeout

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:  # noqa: S310
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise _error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ApiError(0, f"cannot reach {self.url}: {exc}") from exc

    def acquire(
        self,
        kind: str,
        *,
        ttl: float | None = None,
        wait: float = 0,
        where: dict[str, Any] | None = None,
        priority: int | None = None,
        holder: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """The lease (a dict: id, kind, name, data, fence, expires_at, holder, ttl);
        ``NotGranted`` when none in time."""
        body: dict[str, Any] = {"kind": kind, "wait": wait}
        for name, value in (
            ("ttl", ttl),
            ("where", where),
            ("priority", priority),
            ("holder", holder),
            ("idempotency_key", idempotency_key),
        ):
            if value is not None:
                body[name] = value
        lease: dict[str, Any] = self.request("POST", "leases", body, timeout=wait + self.timeout)
        return lease

    def renew(self, lease_id: str, ttl: float | None = None) -> dict[str, Any]:
        """The lease with its new ``expires_at``; ``LeaseGone`` if no longer held."""
        lease: dict[str, Any] = self.request("POST", f"leases/{lease_id}/renew", {} if ttl is None else {"ttl": ttl})
        return lease

    def release(self, lease_id: str) -> bool:
        """True if it was held and is free now."""
        return bool(self.request("POST", f"leases/{lease_id}/release", {})["released"])

    def get(self, lease_id: str) -> dict[str, Any]:
        lease: dict[str, Any] = self.request("GET", f"leases/{lease_id}")
        return lease

    def pools(self) -> list[dict[str, Any]]:
        pools: list[dict[str, Any]] = self.request("GET", "pools")["pools"]
        return pools


def _error(exc: urllib.error.HTTPError) -> ApiError:
    try:
        body = json.loads(exc.read() or b"{}")
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    error = str(body.get("error") or exc.reason)
    field = body.get("field")
    retry = exc.headers.get("Retry-After")
    retry_after = float(retry) if retry and retry.replace(".", "", 1).isdigit() else None
    cls = NotGranted if exc.code == 423 else LeaseGone if exc.code == 410 else ApiError
    return cls(exc.code, error, field=field, retry_after=retry_after)


# -- the command ---------------------------------------------------------------------------------

#: Exit statuses (sysexits.h): no lease in time; a bad request or refused token; server unreachable.
EX_TEMPFAIL, EX_USAGE, EX_NOPERM, EX_UNAVAILABLE = 75, 64, 77, 69
#: The share of the ttl a lease is trusted for locally, counted from when the renewal was sent.
TRUST = 0.9


def _where(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--where takes KEY=VALUE, got {text!r}")
    return key, value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"seconds must be a finite number >= 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("RESOURCE_LEASE_URL"), help="the API (RESOURCE_LEASE_URL)")
    common.add_argument("--timeout", type=_seconds, default=30.0, help="seconds for each request (besides --wait)")
    asking = argparse.ArgumentParser(add_help=False)
    asking.add_argument("--kind", required=True)
    asking.add_argument("--where", type=_where, action="append", default=[], metavar="KEY=VALUE")
    asking.add_argument("--ttl", type=_seconds, default=None)
    asking.add_argument("--wait", type=_seconds, default=0.0, help="seconds to wait in line (at most 300)")
    asking.add_argument("--priority", type=int, default=None)
    asking.add_argument("--holder", default=None, help="a label recorded in the lease's holder")
    parser = argparse.ArgumentParser(prog="resource-lease", description="Lease a resource over HTTP.")
    actions = parser.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run", parents=[common, asking], help="hold a lease while a command runs")
    run.add_argument("--grace", type=_seconds, default=10.0, help="seconds between SIGTERM and SIGKILL")
    run.add_argument("--renew-every", type=_seconds, default=None, help=argparse.SUPPRESS)  # tests: default ttl/3
    run.add_argument("command", nargs=argparse.REMAINDER)
    acquire = actions.add_parser("acquire", parents=[common, asking], help="take a lease, print it as JSON")
    acquire.add_argument("--idempotency-key", default=None)
    renew = actions.add_parser("renew", parents=[common], help="renew a lease, print it as JSON")
    renew.add_argument("id")
    renew.add_argument("--ttl", type=_seconds, default=None)
    release = actions.add_parser("release", parents=[common], help='release a lease, print {"released": ...}')
    release.add_argument("id")
    return parser


def _client(args: argparse.Namespace) -> LeaseClient:
    if not args.url:
        raise SystemExit("resource-lease: give --url or set RESOURCE_LEASE_URL")
    token = os.environ.get("RESOURCE_LEASE_TOKEN")
    if not token:
        raise SystemExit("resource-lease: set RESOURCE_LEASE_TOKEN to the API token")
    return LeaseClient(args.url, token, timeout=args.timeout)


def _status(exc: ApiError) -> int:
    if isinstance(exc, NotGranted):
        return EX_TEMPFAIL
    if exc.status in (401, 403):
        return EX_NOPERM
    if exc.status == 0 or exc.status >= 500:
        return EX_UNAVAILABLE
    return EX_USAGE if exc.status == 400 else 1


def _acquire(client: LeaseClient, args: argparse.Namespace, key: str | None) -> dict[str, Any]:
    where = dict(args.where) or None
    for tries_left in (3, 2, 1, 0):
        try:
            return client.acquire(
                args.kind,
                ttl=args.ttl,
                wait=args.wait,
                where=where,
                priority=args.priority,
                holder=args.holder,
                idempotency_key=key,
            )
        except ApiError as exc:
            # A lost connection or a server that went away: asking again with the same key
            # gets the first attempt's lease or none, never a second one.
            if key is None or not tries_left or not (exc.status == 0 or exc.status >= 500):
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


class Keeper(threading.Thread):
    """Renews the lease every ``every`` seconds until stopped; sets ``lost`` when the server
    says it is gone (410) or no renewal succeeded before the local deadline."""

    def __init__(self, client: LeaseClient, lease: dict[str, Any], every: float, sent_at: float) -> None:
        super().__init__(name="resource-lease-renewal", daemon=True)
        self.client, self.lease, self.every = client, lease, every
        self.ttl = float(lease["ttl"])
        self.deadline = sent_at + self.ttl * TRUST
        self.stop = threading.Event()
        self.lost = threading.Event()
        self.reason = ""

    def run(self) -> None:
        while not self.stop.wait(min(self.every, max(0.0, self.deadline - time.monotonic()))):
            if time.monotonic() >= self.deadline:
                self._lose("no renewal succeeded before the lease's local deadline")
                return
            sent_at = time.monotonic()
            try:
                self.client.renew(self.lease["id"])
            except LeaseGone as exc:
                self._lose(f"the server says the lease is gone: {exc.error}")
                return
            except ApiError as exc:
                print(f"resource-lease: renewal failed (trying again): {exc}", file=sys.stderr)
                continue
            self.deadline = sent_at + self.ttl * TRUST

    def _lose(self, reason: str) -> None:
        self.reason = reason
        self.lost.set()


def _stop(child: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        child.kill()


def _run(client: LeaseClient, args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("resource-lease run: give the command after --", file=sys.stderr)
        return EX_USAGE
    sent_at = time.monotonic()
    lease = _acquire(client, args, key=str(uuid.uuid4()))
    env = dict(os.environ)
    env.pop("RESOURCE_LEASE_TOKEN", None)  # the command gets the resource, not the token
    env.update(
        RESOURCE_LEASE_ID=lease["id"],
        RESOURCE_LEASE_KIND=lease["kind"],
        RESOURCE_LEASE_NAME=str(lease["name"]),
        RESOURCE_LEASE_FENCE=str(lease["fence"]),
        RESOURCE_LEASE_DATA=json.dumps(lease["data"]),
    )
    keeper = Keeper(client, lease, args.renew_every or float(lease["ttl"]) / 3, sent_at)
    if args.renew_every != 0:  # 0: no renewal at all (the tests' negative control)
        keeper.start()
    forwarded: list[int] = []
    child = subprocess.Popen(command, env=env)  # noqa: S603 - the user's own command

    def forward(signum: int, _frame: Any) -> None:
        forwarded.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        while child.poll() is None:
            if keeper.lost.wait(0.2):
                print(f"resource-lease: lease lost ({keeper.reason}): stopping the command", file=sys.stderr)
                _stop(child, args.grace)
                break
        status = child.wait()
    finally:
        keeper.stop.set()
        if not keeper.lost.is_set():
            try:
                client.release(lease["id"])
            except ApiError as exc:
                print(f"resource-lease: release failed (the lease expires by itself): {exc}", file=sys.stderr)
    return 128 - status if status < 0 else status


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    client = _client(args)
    try:
        if args.action == "run":
            return _run(client, args)
        if args.action == "acquire":
            result: Any = _acquire(client, args, key=args.idempotency_key)
        elif args.action == "renew":
            result = client.renew(args.id, args.ttl)
        else:
            result = {"released": client.release(args.id)}
    except ApiError as exc:
        print(f"resource-lease: {exc}", file=sys.stderr)
        return _status(exc)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
