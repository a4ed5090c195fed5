"""The keys of the resources' ``data`` that operators see and filter by (``DATA_KEYS``).

For each key the setting names (e.g. ``("region",)``), the Resources list has a column (the
value, as JSON text) and a filter by the values the pool holds (``?data.region=eu``). The
filter compares the key's value as text (``KeyTextTransform``, cast to text: the ORM's own
JSON path, the same on every database), exactly: no regex, no prefix, and no other key of ``data`` can be
filtered on (the changelist's allow-list, ``lookups.py``), so nothing masked can be read
through it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.http import HttpRequest

from resource_lease.admin.times import clipped
from resource_lease.conf import lease_settings

#: The most values a key's filter lists (the first, in order).
MAX_CHOICES = 100

_filters: dict[str, type[admin.SimpleListFilter]] = {}


def _as_text(key: str) -> Cast:
    """``data[key]`` as text (a string unquoted, anything else as JSON), compared as text: a
    key transform's own ``=`` would read the value given as JSON."""
    return Cast(KeyTextTransform(key, "data"), output_field=TextField())


_columns: dict[str, Callable[[Any], str]] = {}


def data_keys() -> tuple[str, ...]:
    return tuple(lease_settings.DATA_KEYS)


def data_filter(key: str) -> type[admin.SimpleListFilter]:
    """The list filter of ``data[key]``: its parameter is ``data.<key>``, its choices the
    values the listed resources hold (as text, at most MAX_CHOICES)."""
    if key not in _filters:

        class DataKeyFilter(admin.SimpleListFilter):
            title = f"data “{key}”"
            parameter_name = f"data.{key}"

            def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
                values = (
                    model_admin.get_queryset(request)
                    .annotate(rl_value=_as_text(key))
                    .filter(rl_value__isnull=False)
                    .order_by("rl_value")
                    .values_list("rl_value", flat=True)
                    .distinct()[:MAX_CHOICES]
                )
                return [(str(v), str(v)) for v in values]

            def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
                value = self.value()
                if value is None:
                    return queryset
                return queryset.annotate(rl_value=_as_text(key)).filter(rl_value=value)

        DataKeyFilter.__name__ = DataKeyFilter.__qualname__ = f"DataKeyFilter_{len(_filters)}"
        _filters[key] = DataKeyFilter
    return _filters[key]


def data_column(key: str) -> Callable[[Any], str]:
    """The list column of ``data[key]``: the value as JSON text (a string as it is), "-" when absent."""
    if key not in _columns:

        def column(obj: Any) -> str:
            data = obj.data if isinstance(obj.data, dict) else {}
            if key not in data:
                return "-"
            value = data[key]
            return clipped(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False), 60)

        column.__name__ = f"data_key_{len(_columns)}"
        column.short_description = key  # type: ignore[attr-defined]
        _columns[key] = column
    return _columns[key]
