"""argparse ``type=`` validators shared by the app's commands (a bad value is a CommandError)."""

from __future__ import annotations

import argparse

from resource_lease.validation import MAX_SECONDS, check_alias, check_kind


def kind_argument(value: str) -> str:
    try:
        return check_kind(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("kind must", "must")) from None


def database_argument(value: str) -> str:
    try:
        return check_alias(value, "--database")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_days_argument(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of days, got {value!r}") from None
    if not days > 0 or days == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of days > 0, got {value!r}")
    if days * 86400 > MAX_SECONDS:
        # Further back than the databases' dates go: an error, or a cutoff that matches nothing.
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SECONDS / 86400:.0f} days, got {value!r}")
    return days
