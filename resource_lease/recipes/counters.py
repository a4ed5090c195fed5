"""Shared counters on the database: ``counter(name)`` with ``.add(n)`` and ``.value()``.

A counter is one row (``models.Counter``) created on first use. ``add(n)`` is one upsert that
adds ``n`` and hands back the new value from the same statement (``db/counters.py``), so two
processes adding at once each get their own value, every value is handed out once, and the
final value is the sum of every add: nothing is read first and written back later (that is
what loses updates). The value stays within BIGINT; an add that would leave it changes
nothing and is a ``ValueError``. A lost connection during an add is ``OutcomeUnknown``: it is
never sent again blindly (it might have been applied).
"""

from __future__ import annotations

from resource_lease.db.counters import BIGINT_MAX, BIGINT_MIN
from resource_lease.db.operations import ops
from resource_lease.offload import in_thread
from resource_lease.validation import check_name, refuse_inside_single_writer_transaction, resolve_using


def check_amount(value: object, name: str = "n") -> int:
    """An amount to add: an int (not a bool) within BIGINT."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not BIGINT_MIN <= value <= BIGINT_MAX:
        raise ValueError(f"{name} must be from {BIGINT_MIN} to {BIGINT_MAX} (a BIGINT), got {value!r}")
    return value


class Counter:
    """The shared counter ``name`` on database ``using`` (see the module's docstring). Cheap to
    make (nothing is read or written until ``add`` or ``value``); safe to share between threads."""

    def __init__(self, name: str, *, using: str | None = None) -> None:
        self.name = check_name(name, "name")
        self.using = resolve_using(using)

    def __repr__(self) -> str:
        return f"<Counter {self.name!r} on {self.using!r}>"

    def add(self, n: int = 1) -> int:
        """Add ``n`` (an int, negative to subtract) and return the new value, in one statement:
        race-proof across processes. ``add(0)`` reads the value. ValueError (nothing written)
        for a bad ``n`` or a sum that would leave BIGINT."""
        n = check_amount(n)
        if n == 0:
            return self.value()
        refuse_inside_single_writer_transaction(self.using, "counter.add()")
        value = ops(self.using).add_counter(self.name, n)
        if value is None:
            current = self.value()
            raise ValueError(
                f"n: counter {self.name!r} is {current}; adding {n} would leave BIGINT ({BIGINT_MIN} to"
                f" {BIGINT_MAX}); nothing was written"
            )
        return value

    def value(self) -> int:
        """The current value (0 for a counter never added to), read from the database."""
        return ops(self.using).read_counter(self.name)

    async def aadd(self, n: int = 1) -> int:
        """``add()`` for async code."""

        return await in_thread(self.add, n)

    async def avalue(self) -> int:
        """``value()`` for async code."""

        return await in_thread(self.value)


def counter(name: str, *, using: str | None = None) -> Counter:
    """The shared counter ``name`` (created at 0 on first use): ``.add(n=1)`` -> the new
    value, ``.value()``."""
    return Counter(name, using=using)


__all__ = ["Counter", "check_amount", "counter"]
