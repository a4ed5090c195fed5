"""argparse ``type=`` validators shared by the demo and benchmark commands."""

from __future__ import annotations

import argparse
from collections.abc import Iterable


def positive_int(value: str) -> int:
    """A whole number >= 1 (argparse reports the ValueError as an invalid value)."""
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


def positive(value: str) -> float:
    """A number > 0."""
    number = float(value)
    if not number > 0:
        raise ValueError(value)
    return number


def names(text: str, known: Iterable[str], what: str, *, every: str = "") -> tuple[str, ...]:
    """A comma-separated list of names, each one of ``known`` (``every``, if given, names them
    all); argparse reports the error, naming the unknown ones and the choices."""
    known = tuple(known)
    if every and text.strip() == every:
        return known
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in chosen if name not in known]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {', '.join(unknown) or text!r}; choose from {', '.join(known)}"
        )
    return chosen
