"""One worker of the demo: lease, work a little, release, repeat; print what it got as JSON.

python manage.py demo_worker --kind demo-proxy --seconds 6
python manage.py demo_worker --kind demo-proxy --hold-forever   # holds one lease until killed
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from project.arguments import positive
from resource_lease import NoResourceAvailable, acquire, install_sigterm_handler


class Command(BaseCommand):
    help = "A demo worker that leases resources of a kind and reports its grants as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--kind", default="demo-proxy")
        parser.add_argument("--seconds", type=positive, default=6.0, help="how long to keep working")
        parser.add_argument("--ttl", type=positive, default=2.0)
        parser.add_argument("--hold-forever", action="store_true", help="hold one lease until killed")

    def handle(self, *args: Any, kind: str, seconds: float, ttl: float, hold_forever: bool, **options: Any) -> None:
        install_sigterm_handler()  # SIGTERM gives back what it holds (SIGKILL, as the demo sends, cannot)
        if hold_forever:
            lease = acquire(kind, ttl=ttl, timeout=30, auto_renew=True)
            self.stdout.write(json.dumps({"held": lease.resource.name, "fence": lease.fence, "pid": os.getpid()}))
            self.stdout.flush()
            while True:
                time.sleep(60)
        grants = []
        waits = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                with acquire(kind, ttl=ttl, timeout=2, auto_renew=True) as lease:
                    grants.append([lease.resource.name, lease.fence])
                    time.sleep(random.uniform(0.02, 0.1))  # the work done with the resource
            except NoResourceAvailable:
                waits += 1
            time.sleep(random.uniform(0.0, 0.05))  # work between leases (lets waiters in)
        self.stdout.write(json.dumps({"pid": os.getpid(), "grants": grants, "gave_up_waiting": waits}))
