"""The main job's lease over HTTP: a uvicorn server, clients with no Django, one lease lost.

    python manage.py demo_http [--clients 3] [--gpus 2] [--hold 1]

Starts ``uvicorn project.asgi:application`` (the API at /lease/api/, docs/http.md), makes a
token limited to the demo's kind (``lease_token create``: shown once, stored hashed), and runs
``--clients`` copies of ``resource-lease run --kind demo-http-gpu --wait 60 -- CMD`` at once,
the command printing the GPU it was given (its environment) and holding it ``--hold``
seconds; there are fewer GPUs than clients, so some wait in line (a long poll). Then one more
client's lease is force released behind its back: its renewal is answered 410 and its command
is stopped (SIGTERM). The summary proves that every client ran with a GPU, no GPU was held
twice at once, fences only went up per GPU, and the lost lease stopped its command.
Runs on the embedded SQLite file (or DATABASE_URL).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from resource_lease.api.tokens import create_token
from resource_lease.db.operations import ops
from resource_lease.models import ApiToken, IdempotencyKey, Resource, Waiter

KIND = "demo-http-gpu"
CLIENT = str(Path(settings.BASE_DIR) / "resource_lease" / "client" / "lease_client.py")
COMMAND = (
    "import os, sys, time;"
    "start = time.time(); time.sleep(float(sys.argv[1]));"
    "print(os.environ['RESOURCE_LEASE_NAME'], os.environ['RESOURCE_LEASE_FENCE'], start, time.time())"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(check: Any, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise CommandError(f"timed out after {seconds:g}s waiting for {what}")
        time.sleep(0.1)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):  # noqa: S310
            return True
    except (urllib.error.URLError, OSError):
        return False


class Command(BaseCommand):
    help = "Lease over HTTP: a uvicorn server, resource-lease run clients in line, a lost lease stops its command."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--clients", type=int, default=3)
        parser.add_argument("--gpus", type=int, default=2)
        parser.add_argument("--hold", type=float, default=1.0)

    def handle(self, *args: Any, clients: int, gpus: int, hold: float, **options: Any) -> None:
        call_command("migrate", verbosity=0)
        Resource.objects.filter(kind=KIND).delete()
        Resource.objects.bulk_create(Resource(kind=KIND, name=f"gpu-{i}", data={"device": i}) for i in range(gpus))
        token, text = create_token(f"demo-http-{os.getpid()}", KIND)
        port = _free_port()
        api = f"http://127.0.0.1:{port}/lease/api/"
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "project.asgi:application", "--port", str(port)]
            + ["--lifespan", "off", "--log-level", "error", "--no-access-log"],
            cwd=settings.BASE_DIR,
        )
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RESOURCE_LEASE_URL": api, "RESOURCE_LEASE_TOKEN": text}
        try:
            _wait_for(lambda: _answers(api + "openapi.json"), "the uvicorn server")
            self.stdout.write(f"uvicorn serves the API at {api}; token {token.name!r} (kind {KIND} only)")
            self._race(clients, hold, env)
            self._lost(env)
        finally:
            server.kill()
            server.wait(30)
            Resource.objects.filter(kind=KIND).delete()
            Waiter.objects.filter(kind=KIND).delete()
            IdempotencyKey.objects.filter(token=token).delete()
            ApiToken.objects.filter(pk=token.pk).delete()

    def _run(self, env: dict[str, str], *command: str, ttl: float = 5.0) -> subprocess.Popen[str]:
        argv = [sys.executable, "-I", "-S", CLIENT, "run", "--kind", KIND, "--ttl", str(ttl), "--wait", "60"]
        argv += ["--grace", "2", "--", sys.executable, *command]
        return subprocess.Popen(argv, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def _race(self, clients: int, hold: float, env: dict[str, str]) -> None:
        procs = [self._run(env, "-c", COMMAND, str(hold)) for _ in range(clients)]
        runs: list[tuple[str, int, float, float]] = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise CommandError(f"a client failed ({proc.returncode}): {err.strip()}")
            fields = out.split()
            runs.append((fields[0], int(fields[1]), float(fields[2]), float(fields[3])))
        overlaps = sum(
            1 for i, a in enumerate(runs) for b in runs[i + 1 :] if a[0] == b[0] and a[2] < b[3] and b[2] < a[3]
        )
        by_gpu: dict[str, list[tuple[float, int]]] = {}
        for run in runs:
            by_gpu.setdefault(run[0], []).append((run[2], run[1]))
        ordered = all([f for _, f in sorted(v)] == sorted(f for _, f in v) for v in by_gpu.values())
        self.stdout.write(f"{clients} `resource-lease run` clients on {len(by_gpu)} GPUs, all at once:")
        for run in sorted(runs, key=lambda r: r[2]):
            self.stdout.write(f"  {run[0]} fence {run[1]}: held {run[3] - run[2]:.1f}s")
        self.stdout.write(f"  a GPU held by two clients at once: {overlaps} times; fences in order per GPU: {ordered}")
        if overlaps or not ordered:
            raise CommandError("the HTTP clients overlapped or their fences went down")

    def _lost(self, env: dict[str, str]) -> None:
        proc = self._run(env, "-c", "import time; time.sleep(60)", ttl=2.0)
        _wait_for(lambda: Resource.objects.live().filter(kind=KIND).exists(), "the lease of the last client")
        row = Resource.objects.live().get(kind=KIND)
        ops("default").release(pk=row.pk, holder=row.holder, fence=row.fence)  # force released behind its back
        started = time.monotonic()
        try:
            status = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise CommandError("the command of a lost lease was not stopped") from None
        _, err = proc.communicate()
        self.stdout.write(
            f"a lease force released behind its client's back: its command stopped after"
            f" {time.monotonic() - started:.1f}s, exit status {status} (SIGTERM)"
        )
        if status != 143:
            raise CommandError(f"the lost lease's client exited {status}: {err.strip()}")
