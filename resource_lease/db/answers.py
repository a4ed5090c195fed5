"""What a named statement answers (``Dialect.execute``): the one runner of the statements that
need no more than running and reading back one shape of result."""

from __future__ import annotations

from enum import Enum


class Answer(Enum):
    """The shape of a statement's result, as ``Dialect.execute`` reads it."""

    #: Nothing is read (a write whose count does not matter).
    NOTHING = "nothing"
    #: How many rows the statement changed.
    COUNT = "count"
    #: Whether it changed exactly one row (a conditional write of one row by its key).
    CHANGED_ONE = "changed one"
    #: Whether it selected any row.
    ANY = "any"
    #: Its first row, or None.
    FIRST = "first"
    #: Its first row's first value, or None.
    VALUE = "value"
    #: Every row it selected.
    ROWS = "rows"


__all__ = ["Answer"]
