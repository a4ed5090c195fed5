"""Read the JSON lines a worker process prints, with deadlines (for group and barrier tests)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from typing import Any


class Reports:
    """The JSON lines of one process, read by a thread; ``next(event)`` waits for the next one
    of that event (earlier lines of other events stay available in ``seen``)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.seen: list[dict[str, Any]] = []
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._cursor: dict[str, int] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._lines.put(json.loads(line))
            except ValueError:
                self._lines.put({"event": "noise", "line": line})
        self._lines.put(None)

    def _pump(self, timeout: float) -> bool:
        try:
            item = self._lines.get(timeout=timeout)
        except queue.Empty:
            return True
        if item is None:
            self._lines.put(None)  # stays at end of stream
            return False
        self.seen.append(item)
        return True

    def next(self, event: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for i in range(self._cursor.get(event, 0), len(self.seen)):
                if self.seen[i]["event"] == event:
                    self._cursor[event] = i + 1
                    return self.seen[i]
            self._cursor[event] = len(self.seen)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {event!r} from pid {self.proc.pid} in {timeout:g}s; saw {self.seen}")
            if not self._pump(min(left, 0.5)):
                raise AssertionError(f"pid {self.proc.pid} ended without {event!r}; saw {self.seen}")

    def all(self, event: str) -> list[dict[str, Any]]:
        while self._lines.qsize() and self._pump(0):
            pass
        return [item for item in self.seen if item["event"] == event]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
