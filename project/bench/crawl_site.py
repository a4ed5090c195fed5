"""A local crawl target for the Scrapy test and ``lease_bench --scenario crawl``: sites that ban
proxies and rate-limit them, served on 127.0.0.1 only.

One process listens on N ports; each port plays one HTTP forward proxy. A request arrives in
absolute form (``GET http://site-3.test/p/17 HTTP/1.1``, the Host header naming the site, as a
client speaks to a proxy) and the "proxy" answers as the site itself, forwarding nothing:

- each of the S sites bans a fixed random quarter of the proxies (403 to every request of
  theirs; which ones follows from ``--seed`` alone);
- a proxy that has been served ``rate`` answers by one site in the last ``per`` seconds gets
  429 with ``Retry-After`` (whole seconds until the oldest of them leaves the window);
- otherwise 200 with a small HTML body.

A page asked for with ``?delay=S`` is answered after S seconds (a slow download). A request
for a host that is no site gets 404. Every answer is one line of the log
(``--log``: ``time proxy site status``, tab-separated; ``proxy`` the port's index). When
ready, the process prints one JSON line on stdout: ``{"ports": [...], "banned": {site:
[proxy indices]}}``; it runs until SIGTERM or SIGINT.

    python -m project.bench.crawl_site --proxies 40 --sites 8 --seed 1 --log crawl.log
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import IO
from urllib.parse import parse_qs, urlsplit

#: Each site bans this share of the proxies.
BANNED_SHARE = 0.25


def site_name(index: int) -> str:
    return f"site-{index}.test"


def banned_proxies(proxies: int, sites: int, seed: int) -> dict[str, list[int]]:
    """For each site, the proxy indices it bans: a quarter of them, fixed by ``seed``."""
    rng = random.Random(seed)
    count = max(1, round(proxies * BANNED_SHARE)) if proxies > 1 else 0
    return {site_name(s): sorted(rng.sample(range(proxies), count)) for s in range(sites)}


class Sites:
    """What every site answers, from the ban lists and each (proxy, site)'s recent answers."""

    def __init__(self, proxies: int, sites: int, seed: int, rate: int, per: float, log: IO[str] | None) -> None:
        self.banned = banned_proxies(proxies, sites, seed)
        self._banned_sets = {site: set(indices) for site, indices in self.banned.items()}
        self.rate = rate
        self.per = per
        self._served: dict[tuple[int, str], collections.deque[float]] = collections.defaultdict(collections.deque)
        self._log = log

    def answer(self, proxy: int, site: str, path: str) -> tuple[int, dict[str, str], bytes]:
        now = time.monotonic()
        headers: dict[str, str] = {}
        if site not in self._banned_sets:
            status, body = 404, b"no such site\n"
        elif proxy in self._banned_sets[site]:
            status, body = 403, f"<html><body>{site}: access denied</body></html>\n".encode()
        else:
            served = self._served[(proxy, site)]
            while served and served[0] <= now - self.per:
                served.popleft()
            if len(served) >= self.rate:
                wait = max(1, int(served[0] + self.per - now + 0.999))
                status, headers, body = 429, {"Retry-After": str(wait)}, b"too many requests\n"
            else:
                served.append(now)
                status = 200
                body = f"<html><body><h1>{site}</h1><p>{path} via proxy {proxy}</p></body></html>\n".encode()
        if self._log is not None:
            self._log.write(f"{time.time():.3f}\t{proxy}\t{site}\t{status}\n")
        return status, headers, body


#: The longest ``?delay=`` a page may ask for, in seconds.
MAX_DELAY = 30.0


def _delay(query: str) -> float:
    for value in parse_qs(query).get("delay", []):
        try:
            return min(MAX_DELAY, max(0.0, float(value)))
        except ValueError:
            return 0.0
    return 0.0


REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found", 429: "Too Many Requests"}


async def _serve(sites: Sites, proxy: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            headers: dict[str, str] = {}
            for line in lines[1:]:
                if ":" in line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            if length:
                await reader.readexactly(length)
            extra: dict[str, str] = {}
            if len(parts) != 3:
                status, body = 400, b"bad request line\n"
            else:
                target = urlsplit(parts[1])
                delay = _delay(target.query)
                if delay:
                    await asyncio.sleep(delay)  # a slow page: ?delay=seconds (at most MAX_DELAY)
                host = (headers.get("host") or target.netloc or "").split(":")[0].lower()
                status, extra, body = sites.answer(proxy, host, target.path or "/")
            close = headers.get("connection", "").lower() == "close" or (len(parts) == 3 and parts[2] == "HTTP/1.0")
            out = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
            out += [f"{k}: {v}" for k, v in extra.items()]
            out += ["Content-Type: text/html; charset=utf-8", f"Content-Length: {len(body)}"]
            out.append("Connection: close" if close else "Connection: keep-alive")
            writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + body)
            await writer.drain()
            if close:
                break
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def run(proxies: int, sites_count: int, seed: int, rate: int, per: float, log_path: str | None) -> None:
    log = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115 - open for the whole run
    sites = Sites(proxies, sites_count, seed, rate, per, log)
    servers = []
    ports = []
    for index in range(proxies):
        handler = functools.partial(_serve, sites, index)
        server = await asyncio.start_server(handler, "127.0.0.1", 0, backlog=1024, reuse_address=True)
        servers.append(server)
        ports.append(server.sockets[0].getsockname()[1])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    sys.stdout.write(json.dumps({"ports": ports, "banned": sites.banned}) + "\n")
    sys.stdout.flush()
    await stop.wait()
    for server in servers:
        server.close()
    if log is not None:
        log.close()


class Simulator:
    """The simulator in a child process (``with Simulator(...) as site:``): its ``ports``,
    ``banned`` lists, ``proxy_urls`` and, once stopped, its ``log()``."""

    def __init__(
        self, log_path: str, *, proxies: int = 40, sites: int = 8, seed: int = 1, rate: int = 10, per: float = 60.0
    ) -> None:
        self.log_path = log_path
        self.argv = [sys.executable, "-m", "project.bench.crawl_site", "--proxies", str(proxies)]
        self.argv += ["--sites", str(sites), "--seed", str(seed), "--rate", str(rate), "--per", str(per)]
        self.argv += ["--log", log_path]
        self.sites = [site_name(s) for s in range(sites)]
        self.ports: list[int] = []
        self.banned: dict[str, list[int]] = {}
        self.proc: subprocess.Popen[str] | None = None

    def start(self, cwd: str | None = None, env: dict[str, str] | None = None) -> Simulator:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True, cwd=cwd, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"the crawl simulator did not start (exit status {self.proc.returncode})")
        ready = json.loads(line)
        self.ports, self.banned = ready["ports"], ready["banned"]
        return self

    @property
    def proxy_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def proxy_of(self, port: int) -> int:
        return self.ports.index(port)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log(self) -> list[tuple[float, int, str, int]]:
        """Every answer so far: (time, proxy index, site, status)."""
        rows = []
        with open(self.log_path) as lines:
            for line in lines:
                t, proxy, site, status = line.rstrip("\n").split("\t")
                rows.append((float(t), int(proxy), site, int(status)))
        return rows

    def __enter__(self) -> Simulator:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proxies", type=int, default=40, help="ports, one proxy each (default 40)")
    parser.add_argument("--sites", type=int, default=8, help="sites site-0.test ... (default 8)")
    parser.add_argument("--seed", type=int, default=1, help="which proxies each site bans (default 1)")
    parser.add_argument("--rate", type=int, default=10, help="answers per proxy and site in a window (default 10)")
    parser.add_argument("--per", type=float, default=60.0, help="the window, seconds (default 60)")
    parser.add_argument("--log", help="append one line per answer: time, proxy, site, status")
    args = parser.parse_args(argv)
    if args.proxies < 1 or args.sites < 1 or args.rate < 1 or not args.per > 0:
        parser.error("--proxies, --sites and --rate must be >= 1 and --per > 0")
    asyncio.run(run(args.proxies, args.sites, args.seed, args.rate, args.per, args.log))


if __name__ == "__main__":
    main()
