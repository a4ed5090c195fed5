"""The rows of docs/jepsen.md's tables from the reports of long runs (``scripts/nemesis_long``
keeps one JSON file per run in ``var/nemesis/``): the runs of each primitive and database
added up, so that no figure of the docs is summed by hand.

    python -m project.bench.nemesis.tally var/nemesis/*.json

Prints one Markdown row per (primitive, database): runs, seconds, grants, operations, trusted
units, faults (cut, kill, restart, skew, stop), losses, served in the tail, violations.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The faults' columns, in the order of docs/jepsen.md's tables.
FAULTS = ("cut", "kill", "restart", "skew", "stop")


@dataclass
class Total:
    """The runs of one primitive on one database, added up."""

    runs: int = 0
    elapsed: float = 0.0
    grants: int = 0
    operations: int = 0
    units: int = 0
    losses: int = 0
    violations: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    tails: list[str] = field(default_factory=list)

    def add(self, report: dict[str, Any]) -> None:
        self.runs += 1
        self.elapsed += float(report["elapsed"])
        for name in ("grants", "operations", "units", "losses", "violations"):
            setattr(self, name, getattr(self, name) + int(report[name]))
        self.faults.update({k: int(v) for k, v in report["faults"].items()})
        self.tails.append(str(report["served_in_tail"]))

    def row(self, primitive: str, database: str) -> str:
        tails = sorted(set(self.tails))
        tail = f"{tails[0]} in each" if len(tails) == 1 else ", ".join(self.tails)
        cells = [
            primitive,
            database,
            f"{self.runs}",
            f"{self.elapsed:,.0f}",
            f"{self.grants:,}",
            f"{self.operations:,}",
            f"{self.units:,}",
            ", ".join(f"{self.faults.get(k, 0):,}" for k in FAULTS),
            f"{self.losses:,}",
            tail,
            f"**{self.violations}**",
        ]
        return "| " + " | ".join(cells) + " |"


def tally(paths: list[Path]) -> dict[tuple[str, str], Total]:
    """The reports in ``paths`` (each a JSON list of reports, as ``nemesis --json`` writes),
    added up per (primitive, database)."""
    totals: dict[tuple[str, str], Total] = {}
    for path in paths:
        try:
            reports = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a nemesis report ({exc})") from None
        for report in reports if isinstance(reports, list) else [reports]:
            try:
                key = (str(report["primitive"]), str(report["database"]))
                totals.setdefault(key, Total()).add(report)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}: not a nemesis report (no {exc})") from None
    return totals


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write(__doc__ or "")
        return 2
    try:
        totals = tally([Path(p) for p in argv])
    except ValueError as exc:
        sys.stderr.write(f"tally: {exc}\n")
        return 2
    for (primitive, database), total in sorted(totals.items()):
        sys.stdout.write(total.row(primitive, database) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
