"""Add up pytest's JUnit XML reports of several backends into one line per backend (the runs
of one backend's shards and phases, ``mariadb``, ``mariadb-2``, ``mariadb-restarts``, added
together) and one closing line.

Exits 1 when any test failed or errored, or when no test ran at all.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main(paths: list[str]) -> int:
    total = {"passed": 0, "failed": 0, "skipped": 0}
    per_backend: dict[str, dict[str, int]] = {}
    for path in paths:
        root = ET.parse(path).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for suite in suites:
            for key in counts:
                counts[key] += int(suite.get(key, 0))
        failed = counts["failures"] + counts["errors"]
        passed = counts["tests"] - failed - counts["skipped"]
        mine = per_backend.setdefault(Path(path).stem.split("-")[0], {"passed": 0, "failed": 0, "skipped": 0})
        mine["passed"] += passed
        mine["failed"] += failed
        mine["skipped"] += counts["skipped"]
        total["passed"] += passed
        total["failed"] += failed
        total["skipped"] += counts["skipped"]
    for backend, counted in sorted(per_backend.items()):
        print(f"{backend}: {counted['passed']} passed, {counted['failed']} failed, {counted['skipped']} skipped")
    print(f"total: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 1 if total["failed"] or not total["passed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
