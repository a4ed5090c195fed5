"""argparse ``type=`` validators shared by the app's commands (a bad value is a CommandError)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.db.models import QuerySet

from resource_lease.models import Resource
from resource_lease.seeding import name_problem
from resource_lease.validation import MAX_SECONDS, check_alias, check_kind, check_reason, check_seconds, check_where


def pool_resources(using: str) -> QuerySet[Resource]:
    """The resources of the pools: every row but the coordination rows (kind ``@...``)."""
    return Resource.objects.using(using).pools()


def kind_argument(value: str) -> str:
    try:
        return check_kind(value)  # a pool's kind: coordination kinds ("@...") are refused
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("kind must", "must")) from None


def name_argument(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def seconds_argument(value: str) -> float:
    try:
        return check_seconds(float(value), "seconds")
    except ValueError as exc:
        message = str(exc).removeprefix("seconds ")
        if "could not convert" in message:
            message = f"must be a number of seconds, got {value!r}"
        raise argparse.ArgumentTypeError(message) from None


def reason_argument(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must say why (a non-empty reason)")
    try:
        return check_reason(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("reason ")) from None


def interval_argument(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {value!r}") from None
    if not 0.1 <= seconds <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0.1 and 3600 seconds, got {value!r}")
    return seconds


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


def where_argument(value: str) -> tuple[str, Any]:
    """``KEY=VALUE``: a key of the resources' data and the value it must hold, compared as
    ``acquire(where=...)`` compares it. The value is an integer, ``true``, ``false`` or
    ``null`` when it reads as one in JSON, else the text as given (``'"1"'`` for the string)."""
    key, equals, text = value.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE (a key of the resources' data), got {value!r}")
    if key == "url":
        raise argparse.ArgumentTypeError("cannot filter by 'url' (its password is masked): use another key")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text
    item = parsed if parsed is None or isinstance(parsed, (bool, int, str)) else text
    try:
        check_where({key: item}, "where")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return key, item
