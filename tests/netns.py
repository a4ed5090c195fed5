"""Network namespaces joined by veth links, made and removed by a test: real partitions on
one machine (iproute2's ``ip netns``; loopback-only addresses, nothing leaves the machine).

A ``Network`` is a bridge in the host's namespace (``10.S.0.254``) and one namespace per
*site*, each joined to the bridge by a veth pair: the site's end (``10.S.0.<i>``) in its
namespace, the host's end on the bridge. Processes run in a site with ``site.argv(...)``.
Each network takes a subnet ``S`` of its own (``claim_subnet``): the backends' test runs go
on in parallel, and two bridges on one subnet would route one network's packets to the other
(both of CI's partition tests once timed out connecting, MariaDB's and PostgreSQL's at once).

- ``cut(site)`` takes the host's end of the site's link down: every packet to and from the
  site is dropped (no FIN, no RST: the peers' connections hang until their own timeouts),
  so the site is partitioned from every other site and from the host.
- ``heal(site)`` brings it back up; ``flap(site, ...)`` cuts and heals it again and again.
- ``Forward``: a TCP forwarder in the host's namespace, from the bridge's address to a
  server that listens on the host's loopback only (the machine's MariaDB or PostgreSQL), so
  a client in a site reaches its database only through its veth link.

``unavailable()`` says why namespaces cannot be made here (not root, no ``ip``, no
permission): the tests skip with that reason.
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field

_networks = itertools.count()

SUBNETS = range(200, 250)  # 10.200.0.0/24 .. 10.249.0.0/24
_LOCKS = "/tmp/resource-lease-netns"


def claim_subnet() -> tuple[int, int]:
    """A subnet no other network on this machine uses, and the file lock that holds it.

    The lock (an ``flock`` on ``/tmp/resource-lease-netns/<S>.lock``) keeps other test
    processes off the subnet until ``release_subnet``, and dies with the process; a subnet
    some address of the host's already lies in is skipped too."""
    os.makedirs(_LOCKS, exist_ok=True)
    taken = _ip("-o", "-4", "addr", "show").stdout
    used = {ipaddress.ip_interface(word).network for word in taken.split() if "/" in word and word[0].isdigit()}
    for subnet in SUBNETS:
        if ipaddress.ip_network(f"10.{subnet}.0.0/24") in used:
            continue
        fd = os.open(f"{_LOCKS}/{subnet}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return subnet, fd
    raise RuntimeError(f"no free subnet among 10.{SUBNETS.start}-{SUBNETS.stop - 1}.0.0/24 for a test network")


def release_subnet(fd: int) -> None:
    os.close(fd)  # closing the descriptor drops the flock


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def unavailable() -> str:
    """Why network namespaces cannot be made on this machine ('' if they can), tried for real."""
    if shutil.which("ip") is None:
        return "iproute2's ip command is not installed (apt-get install iproute2)"
    if os.geteuid() != 0:
        return "making network namespaces needs root (CAP_NET_ADMIN)"
    probe = f"rlprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return ""


@dataclass
class Site:
    name: str  # the namespace
    address: str  # the site's address on the network
    host_end: str  # the veth end on the bridge (what cut() takes down)

    def argv(self, *argv: str) -> list[str]:
        """``argv`` run inside the site's namespace."""
        return ["ip", "netns", "exec", self.name, *argv]


@dataclass
class Network:
    """A bridge and its sites; ``close()`` (or the context manager) removes everything."""

    prefix: str = field(default_factory=lambda: f"rl{os.getpid() % 10000}x{next(_networks)}")
    sites: dict[str, Site] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.subnet, self._lock = claim_subnet()
        self.bridge = f"{self.prefix}br"
        self.host_address = f"10.{self.subnet}.0.254"
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            _ip("link", "del", self.bridge, check=False)
            release_subnet(self._lock)
            raise

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def site(self, label: str) -> Site:
        """A new namespace joined to the bridge (its address: 10.<subnet>.0.<n>)."""
        n = len(self.sites) + 1
        name = f"{self.prefix}-{label}"
        host_end, site_end = f"{self.prefix}h{n}", f"{self.prefix}n{n}"
        _ip("netns", "add", name)
        try:
            _ip("link", "add", host_end, "type", "veth", "peer", "name", site_end, "netns", name)
            _ip("link", "set", host_end, "master", self.bridge, "up")
            _ip("-n", name, "addr", "add", f"10.{self.subnet}.0.{n}/24", "dev", site_end)
            _ip("-n", name, "link", "set", site_end, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        except subprocess.CalledProcessError:
            _ip("netns", "del", name, check=False)
            raise
        site = Site(name, f"10.{self.subnet}.0.{n}", host_end)
        self.sites[label] = site
        return site

    def cut(self, site: Site) -> float:
        """Partition ``site`` from everything; returns when (monotonic)."""
        _ip("link", "set", site.host_end, "down")
        return time.monotonic()

    def heal(self, site: Site) -> float:
        _ip("link", "set", site.host_end, "up")
        return time.monotonic()

    def flap(self, site: Site, seconds: float, *, down: float = 0.7, up: float = 0.7) -> int:
        """Cut and heal ``site`` again and again for ``seconds``; ends healed; how many cuts."""
        cuts = 0
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                self.cut(site)
                cuts += 1
                time.sleep(down)
                self.heal(site)
                time.sleep(up)
        finally:
            self.heal(site)
        return cuts

    def close(self) -> None:
        for site in self.sites.values():
            # Every process still in the namespace is gone with the test's own cleanup; the
            # namespace's links go with it.
            _ip("netns", "del", site.name, check=False)
        self.sites.clear()
        _ip("link", "del", self.bridge, check=False)
        if self._lock >= 0:
            release_subnet(self._lock)
            self._lock = -1


class Forward:
    """Forward TCP connections from ``listen`` (an address on the bridge) to ``target``."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(listen)
        self.address = self._listener.getsockname()
        self._socks: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="netns-forward", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for sock in self._socks:
            sock.close()
