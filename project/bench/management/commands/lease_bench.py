"""``manage.py lease_bench``: the lease engine against the SQL floor and the usual alternatives."""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import pstats
import secrets
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from project.arguments import names
from project.bench import report, vendor
from project.bench.baselines import CONTENDERS
from project.bench.scenarios import FULL, SCENARIOS, SMOKE, Context
from project.bench.targets import clean, prepare, resolve
from project.bench.workers import WorkerError, Workers
from resource_lease.exceptions import LeaseError


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def _int_list(text: str) -> tuple[int, ...]:
    values = tuple(_positive_int(part.replace("_", "")) for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError("needs at least one number")
    return values


def _scenarios(text: str) -> list[str]:
    return list(names(text, SCENARIOS, "scenario"))


def _waiting_cases(text: str) -> tuple[str, ...]:
    from project.bench.waiting import CASES, SMOKE_CASES

    return names(text, [*CASES, *SMOKE_CASES], "case")


#: The cycle scenario's contenders a run may name: the baselines and, with --before, the earlier
#: checkout's engine.
CHOOSABLE = ("before", *CONTENDERS)


def _contenders(text: str) -> tuple[str, ...]:
    chosen = names(text, CHOOSABLE, "contender")
    if "engine" not in chosen:
        raise argparse.ArgumentTypeError("the engine is what is measured: include 'engine'")
    return chosen


class Command(BaseCommand):
    help = (
        "Benchmark resource_lease against the SQL floor, the original SELECT+UPDATE algorithm, "
        "redis-py Lock and GET_LOCK, on each database given; writes JSON and PNG plots to --out "
        "and prints a summary table. See docs/benchmarks.md."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--scenario",
            type=_scenarios,
            action="extend",
            help=f"scenario(s) to run, comma-separated or repeated: {', '.join(SCENARIOS)} (default: all)",
        )
        parser.add_argument("--smoke", action="store_true", help="tiny sizes, runs in seconds (CI)")
        parser.add_argument("--out", default="bench-results", help="directory for JSON, plots and logs")
        parser.add_argument(
            "--database",
            "--urls",
            dest="database",
            default=os.environ.get("LEASE_BENCH_DATABASES", "default"),
            help="comma-separated database aliases or URLs (mysql://, postgres://, sqlite:///path); "
            "default: $LEASE_BENCH_DATABASES or the project's database",
        )
        parser.add_argument(
            "--redis-url",
            default=os.environ.get("LEASE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
            help="Redis for the redis-py Lock baseline ('none' to leave it out); default: "
            "$LEASE_BENCH_REDIS_URL or redis://127.0.0.1:6379/0",
        )
        parser.add_argument("--duration", type=_positive_float, help="seconds per measurement window")
        parser.add_argument("--rounds", type=_positive_int, help="interleaved rounds per point")
        parser.add_argument("--processes", type=_int_list, help="cycle scenario's process counts, e.g. 1,2,4,8")
        parser.add_argument("--pool-sizes", type=_int_list, help="pool scenario's sizes, e.g. 40,1000,20000")
        parser.add_argument(
            "--contenders",
            type=_contenders,
            help=f"only these in the cycle and pool scenarios, comma-separated: {', '.join(CHOOSABLE)}",
        )
        parser.add_argument(
            "--profile",
            action="store_true",
            help="cProfile the engine's workers in the cycle scenarios and print where the time goes "
            "(slows them down: not for figures)",
        )
        parser.add_argument(
            "--audit",
            action="store_true",
            help="workers run with RESOURCE_LEASE['AUDIT'] on (the app's default is off)",
        )
        parser.add_argument(
            "--no-vacuum",
            action="store_true",
            help="PostgreSQL: do not VACUUM the lease table between measured points (as autovacuum would)",
        )
        parser.add_argument(
            "--before",
            metavar="PATH",
            help="cycle and waiting scenarios: also measure the resource_lease of this checkout (e.g. `git worktree"
            " add /tmp/turn3 70ca3fa`, the last accepted state), its workers importing it instead, as 'before'",
        )
        parser.add_argument(
            "--waiting-seconds", type=_positive_float, help="waiting scenario: seconds per window (default 5)"
        )
        parser.add_argument(
            "--waiting-cases",
            type=_waiting_cases,
            help="waiting scenario: only these cases, comma-separated (lock8, pool16x4, pool64x40; smoke: lock3, pool4x2)",
        )
        parser.add_argument(
            "--no-peers",
            action="store_true",
            help="waiting scenario: leave out ZooKeeper (kazoo) and the Redis locks",
        )
        parser.add_argument(
            "--crawl-seconds", type=_positive_float, help="crawl scenario: seconds per contender (default 60)"
        )
        parser.add_argument(
            "--crawlers", type=_positive_int, help="crawl scenario: crawler processes (default 64; smoke: 4)"
        )
        parser.add_argument("--replot", action="store_true", help="redraw plots and the table from --out's JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        out = Path(options["out"])
        if options["replot"]:
            self._replot(out)
            return
        base = SMOKE if options["smoke"] else FULL
        plan = base.adjusted(
            duration=options["duration"],
            rounds=options["rounds"],
            processes=options["processes"],
            pool_sizes=options["pool_sizes"],
            contenders=options["contenders"],
            waiting_duration=options["waiting_seconds"],
            waiting_cases=options["waiting_cases"],
            before=options["before"],
            peers=False if options["no_peers"] else None,
            crawl_duration=options["crawl_seconds"],
            crawl_crawlers=options["crawlers"],
        )
        names: list[str] = options["scenario"] or list(SCENARIOS)
        names = list(dict.fromkeys(names))
        try:
            targets = [resolve(item) for item in str(options["database"]).split(",") if item.strip()]
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if not targets:
            raise CommandError("--database: give at least one alias or URL")
        out.mkdir(parents=True, exist_ok=True)
        verbosity = int(options["verbosity"])
        redis_url = self._redis(options["redis_url"])
        run_id = secrets.token_hex(4)
        audit = bool(options["audit"])
        profile_dir = out / "profiles" if options["profile"] else None
        if profile_dir is not None:
            profile_dir.mkdir(exist_ok=True)
            for old in profile_dir.glob("*.prof"):
                old.unlink()

        meta = {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": report.machine(),
            "command": self._command_line(),
            "smoke": bool(options["smoke"]),
            "plan": asdict(plan),
            "redis": bool(redis_url),
            "vacuum_between_points": not options["no_vacuum"],
            "audit": audit,
            "run_id": run_id,
        }
        docs: dict[str, dict[str, Any]] = {
            name: {"scenario": name, "title": SCENARIOS[name][1], "meta": meta, "databases": []} for name in names
        }
        available = 0
        failures = 0
        for target in targets:
            try:
                target.describe()
                prepare(target)
            except (DatabaseError, OSError) as exc:
                self.stderr.write(f"skipping {target.label or target.alias}: not available: {exc}")
                continue
            available += 1
            facts = vendor.server_facts(target)
            self.stdout.write(f"{target.label}: {', '.join(names)}")
            workers = Workers(target.url, out / "logs" / f"{target.key}.log", audit=audit)
            try:
                for name in names:
                    function, _ = SCENARIOS[name]
                    ctx = Context(
                        target=target,
                        workers=workers,
                        plan=plan,
                        run_id=run_id,
                        redis_url=redis_url,
                        profile_dir=profile_dir,
                        vacuum=not options["no_vacuum"],
                        say=self.stdout.write if verbosity >= 2 else (lambda message: None),
                    )
                    entry: dict[str, Any] = {
                        "key": target.key,
                        "label": target.label,
                        "vendor": target.vendor,
                        "server": facts,
                    }
                    started = time.monotonic()
                    # A shared server may restart under us: one more try on fresh connections
                    # and workers, and the JSON says so.
                    for attempt in (1, 2):
                        try:
                            entry["result"] = function(ctx)
                            break
                        except (WorkerError, DatabaseError, LeaseError, OSError) as exc:
                            message = f"{type(exc).__name__}: {exc}"
                            self.stderr.write(f"{target.label}: {name} failed (attempt {attempt}): {message}")
                            entry.setdefault("failures", []).append(message)
                            # It can leave workers mid-task and the connection broken: start afresh.
                            workers.close()
                            workers = ctx.workers = Workers(target.url, out / "logs" / f"{target.key}.log", audit=audit)
                            connections[target.alias].close()
                    else:
                        failures += 1
                        entry["error"] = entry["failures"][-1]
                    entry["seconds"] = round(time.monotonic() - started, 1)
                    docs[name]["databases"].append(entry)
                    if verbosity >= 1:
                        self.stdout.write(f"  {name}: {entry['seconds']:.1f}s")
            finally:
                workers.close()
                try:
                    clean(target)
                except DatabaseError as exc:
                    self.stderr.write(f"{target.label}: could not remove the benchmark rows: {exc}")
        if not available:
            raise CommandError("no database was available; see the messages above")

        self._write(out, list(docs.values()))
        if profile_dir is not None:
            self._profiles(profile_dir)
        if failures:
            raise CommandError(f"{failures} scenario run(s) failed; see {out}/ and its logs/")

    # -- pieces ---------------------------------------------------------------------------

    def _redis(self, url: str) -> str | None:
        if not url or url.lower() == "none":
            return None
        import redis

        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=2)
            client.ping()
            client.close()
        except (redis.RedisError, ValueError, OSError) as exc:
            self.stderr.write(f"leaving out the redis-py Lock baseline: {url} does not answer: {exc}")
            return None
        return url

    @staticmethod
    def _command_line() -> str:
        argv = sys.argv
        if argv and argv[0].endswith("manage.py"):
            # URLs may carry passwords: keep only what says which databases were used.
            return " ".join(part if "@" not in part else "<urls>" for part in ["python", "manage.py", *argv[1:]])
        return "call_command('lease_bench', ...)"

    def _write(self, out: Path, docs: list[dict[str, Any]]) -> None:
        lines: list[str] = []
        for doc in docs:
            if not doc["databases"]:
                continue
            report.write_json(doc, out)
            try:
                report.plot(doc, out)
            except Exception as exc:  # noqa: BLE001 - a plot must not cost us the figures
                self.stderr.write(f"plotting {doc['scenario']} failed: {exc!r}")
            lines += report.summary_lines(doc)
        meta = docs[0]["meta"]
        head = [
            f"lease_bench on {meta['machine']['host']} ({meta['machine']['cpus']} CPUs), {meta['date']}",
            f"a thread blocked and woken here costs {report.wake_figure(meta['machine'])} of its own CPU",
            f"command: {meta['command']}",
            "",
        ]
        text = "\n".join(head + lines)
        (out / "summary.txt").write_text(text + "\n")
        self.stdout.write(text)
        self.stdout.write(f"JSON, plots and logs in {out}/")

    def _replot(self, out: Path) -> None:
        docs = []
        for name in SCENARIOS:
            path = out / f"{name}.json"
            if path.exists():
                docs.append(json.loads(path.read_text()))
        if not docs:
            raise CommandError(f"--replot: no scenario JSON in {out}/")
        self._write(out, docs)

    def _profiles(self, profile_dir: Path) -> None:
        """Where the engine's workers spent their time, per database (cumulative, then own time)."""
        by_db: dict[str, list[str]] = {}
        for path in sorted(profile_dir.glob("*.prof")):
            by_db.setdefault(path.name.split("-", 1)[0], []).append(str(path))
        for key, paths in by_db.items():
            buffer = io.StringIO()
            stats = pstats.Stats(*paths, stream=buffer)
            stats.strip_dirs().sort_stats("cumulative").print_stats(30)
            stats.sort_stats("tottime").print_stats(20)
            text = buffer.getvalue()
            (profile_dir / f"{key}-engine.txt").write_text(text)
            self.stdout.write(f"\n== where the engine's time goes on {key} ({len(paths)} worker profiles) ==")
            self.stdout.write(text)
