"""JSON text that every vendor stores and reads back as it was given.

PostgreSQL's ``jsonb`` keeps a number, not how it was written: ``1e+16`` (how Python writes
every float from 1e16 up) is stored as the integer 10000000000000000 and read back as an
``int``, so a float payload would change type on PostgreSQL only. ``dumps`` writes such floats
out in full with a fraction (``10000000000000000.0``), which every database keeps, PostgreSQL
prints back the same way, and Python reads as the same float: they are whole numbers, so the
digits are exact (docs/pitfalls.md#json-compared).
"""

from __future__ import annotations

import json
import math
import secrets
from typing import Any


def _needs_digits(value: float) -> bool:
    return math.isfinite(value) and "e+" in repr(value)


class ExactEncoder(json.JSONEncoder):
    """A ``JSONEncoder`` that writes floats with an exponent in full (see the module)."""

    def encode(self, o: Any) -> str:
        marker = f"@{secrets.token_hex(8)}@"
        floats: list[float] = []

        def swap(value: Any) -> Any:
            if type(value) is float and _needs_digits(value):
                floats.append(value)
                return f"{marker}{len(floats) - 1}{marker}"
            if isinstance(value, dict):
                return {key: swap(item) for key, item in value.items()}
            if isinstance(value, (list, tuple)):
                return [swap(item) for item in value]
            return value

        text = super().encode(swap(o))
        for index, value in enumerate(floats):
            text = text.replace(f'"{marker}{index}{marker}"', f"{int(value)}.0", 1)
        return text


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps(value, **options)`` with ``ExactEncoder``."""
    return json.dumps(value, cls=ExactEncoder, **options)
