"""What ``scripts/test`` says while its backends run, and after: progress, estimates, summaries.

    python scripts/test_progress.py plan BACKEND...            # what the run will take
    python scripts/test_progress.py watch --every 30 BACKEND... # progress lines until all finish
    python scripts/test_progress.py summary BACKEND...          # where each run stopped (Ctrl-C)
    python scripts/test_progress.py record BACKEND...           # remember a full run's durations
    python scripts/test_progress.py interrupted BACKEND...      # exit 0 if pytest says one was interrupted

Each backend's pytest writes ``var/test-logs/<backend>.progress`` (tests/progress.py); full
runs' durations are kept in ``var/test-history.json`` for the next run's estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("RESOURCE_LEASE_TEST_VAR") or ROOT / "var")
LOGS = VAR / "test-logs"
HISTORY = VAR / "test-history.json"


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m {seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def read(backend: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads((LOGS / f"{backend}.progress").read_text()))
    except (OSError, ValueError):
        return None


def history() -> dict[str, Any]:
    try:
        return dict(json.loads(HISTORY.read_text()))
    except (OSError, ValueError):
        return {}


def left(backend: str, state: dict[str, Any], elapsed: float) -> str:
    """A rough time left: the last full run's duration less the time spent, else the pace so far."""
    past = history().get(backend)
    total, done = state.get("collected"), state.get("done", 0)
    if past and total == past.get("collected"):
        return f", ~{duration(max(0.0, past['seconds'] - elapsed))} left"
    if total and done >= 20:
        return f", ~{duration(elapsed / done * (total - done))} left"
    return ""


def status(backend: str, state: dict[str, Any] | None) -> str:
    if state is None:
        # A backend's restarts run starts once its shards are done (scripts/test's run_phased).
        return f"{backend} after its shards" if backend.endswith("-restarts") else f"{backend} starting"
    elapsed = time.time() - state["started"]
    total = state.get("collected")
    if total is None:
        return f"{backend} collecting"
    text = f"{backend} {state['done']}/{total}"
    if state["failed"]:
        text += f", {state['failed']} FAILED"
    if state.get("finished"):
        return text + f", finished in {duration(state['ended'] - state['started'])}"
    return text + left(backend, state, elapsed)


def plan(backends: list[str]) -> None:
    past = history()
    for backend in backends:
        run = past.get(backend)
        if run:
            print(f"test: {backend}: the last full run here took {duration(run['seconds'])} ({run['collected']} tests)")
    if not any(past.get(b) for b in backends):
        print("test: no earlier full run recorded here: a full run takes 10-20 minutes on two cores")


def watch(backends: list[str], every: float) -> None:
    started = time.monotonic()
    reported: set[tuple[str, str]] = set()
    next_line = started + every
    while True:
        states = {b: read(b) for b in backends}
        for backend, state in states.items():
            for nodeid in (state or {}).get("failures", []):
                if (backend, nodeid) not in reported:
                    reported.add((backend, nodeid))
                    print(f"test: FAILED on {backend}: {nodeid}", flush=True)
        if all(s is not None and s.get("finished") for s in states.values()):
            return
        if time.monotonic() >= next_line:
            next_line += every
            line = " | ".join(status(b, states[b]) for b in backends)
            print(f"test: [{duration(time.monotonic() - started)}] {line}", flush=True)
        time.sleep(1.0)


def summary(backends: list[str]) -> None:
    for backend in backends:
        state = read(backend)
        if state is None:
            print(f"{backend}: never started")
            continue
        elapsed = duration(state.get("ended", time.time()) - state["started"])
        total = state.get("collected")
        stopped = state.get("interrupted") or not state.get("finished") or state["done"] != total
        where = "interrupted" if stopped else "finished"
        print(
            f"{backend}: {where} after {state['done']} of {total if total is not None else '?'} tests ({elapsed}):"
            f" {state['passed']} passed, {state['failed']} failed, {state['skipped']} skipped"
        )
        for nodeid in state.get("failures", []):
            print(f"  FAILED {nodeid}")
        if stopped and state.get("current"):
            print(f"  was running {state['current']}")


def interrupted(backends: list[str]) -> bool:
    """Whether pytest reported one of the runs interrupted (Ctrl-C reached it)."""
    return any((read(backend) or {}).get("interrupted") for backend in backends)


def record(backends: list[str]) -> None:
    past = history()
    for backend in backends:
        state = read(backend)
        if state is None or not state.get("finished") or state.get("collected") != state.get("done"):
            continue
        past[backend] = {"seconds": round(state["ended"] - state["started"]), "collected": state["collected"]}
    HISTORY.parent.mkdir(parents=True, exist_ok=True)
    HISTORY.write_text(json.dumps(past, indent=2))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["plan", "watch", "summary", "record", "interrupted"])
    parser.add_argument("backends", nargs="+")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between two progress lines")
    args = parser.parse_args(argv)
    if args.action == "interrupted":
        return 0 if interrupted(args.backends) else 1
    try:
        {"plan": plan, "summary": summary, "record": record}.get(args.action, lambda b: watch(b, args.every))(
            args.backends
        )
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
