"""A holder that dies (SIGKILL) gives its resource back by expiry alone: after ttl, not before."""

from __future__ import annotations

import signal
import subprocess

import pytest

from resource_lease import NoResourceAvailable, acquire
from resource_lease.models import Resource


def held_by_child(spawn_worker, *args: str) -> tuple[subprocess.Popen[str], int, int]:
    proc = spawn_worker("tests.procs.hold", *args, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line[:1] == ["HELD"], f"child did not report a grant: {line}"
    return proc, int(line[1]), int(line[2])


@pytest.mark.parametrize("auto_renew", [False, True])
def test_killed_holders_resource_is_free_after_ttl_and_not_before(spawn_worker, make_pool, auto_renew: bool) -> None:
    make_pool("proxy", 1)
    ttl = 1.5
    proc, pk, fence = held_by_child(
        spawn_worker, "--kind", "proxy", "--ttl", str(ttl), *(["--auto-renew"] if auto_renew else [])
    )
    dead_expiry = Resource.objects.get(pk=pk).busy_before
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)

    with pytest.raises(NoResourceAvailable):
        acquire("proxy", ttl=30)  # the dead holder's lease still runs

    lease = acquire("proxy", ttl=30, timeout=ttl + 20)
    assert (lease.resource.pk, lease.fence) == (pk, fence + 1)
    assert lease.resource.took_over
    # Judged by the database's clock: the new grant came after the dead lease's expiry.
    assert lease.resource.acquired_at >= dead_expiry
