"""Add up pytest's JUnit XML reports of several backends into one closing line.

Exits 1 when any test failed or errored, or when no test ran at all.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main(paths: list[str]) -> int:
    total = {"passed": 0, "failed": 0, "skipped": 0}
    for path in paths:
        root = ET.parse(path).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for suite in suites:
            for key in counts:
                counts[key] += int(suite.get(key, 0))
        failed = counts["failures"] + counts["errors"]
        passed = counts["tests"] - failed - counts["skipped"]
        print(f"{Path(path).stem}: {passed} passed, {failed} failed, {counts['skipped']} skipped")
        total["passed"] += passed
        total["failed"] += failed
        total["skipped"] += counts["skipped"]
    print(f"total: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 1 if total["failed"] or not total["passed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
