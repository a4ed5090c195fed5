"""argparse ``type=`` validators shared by the demo and benchmark commands."""

from __future__ import annotations


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
