"""Times in the admin: to the second, in UTC, as the database's clock wrote them.

Django shows a ``DateTimeField`` with ``DATETIME_FORMAT`` (to the minute by default, in the
project's time zone): a lease of 30 s, a renewal or a grant cannot be read from that. Every
app admin mixes in ``SecondsAdmin``, which swaps each date-time field of its lists, pages and
fieldsets for a column that shows ``2026-11-25 12:43:05`` (UTC, said in the column's title).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html

#: One display function per (model, field), so the lists Django compares hold the same object.
_displays: dict[tuple[type[models.Model], str], Callable[..., str]] = {}


def at_second(value: dt.datetime | None) -> str:
    """``"2026-11-25 12:43:05"`` in UTC; ``"-"`` for None."""
    if value is None:
        return "-"
    if timezone.is_aware(value):
        value = value.astimezone(dt.UTC)
    return f"{value:%Y-%m-%d %H:%M:%S}"


def lock_delay_html(badge: str, until: dt.datetime) -> str:
    """The state of a row in its lock delay: its ``badge`` (expired) and, under it, "lock
    delay until HH:MM:SS" (UTC, the database's clock): nobody is granted it before then."""
    when = until.astimezone(dt.UTC) if timezone.is_aware(until) else until
    return format_html(
        '{}<div class="rl-note" title="{} UTC: its holder vanished without releasing it">lock delay until {}</div>',
        badge,
        at_second(until),
        f"{when:%H:%M:%S}",
    )


def time_html(value: dt.datetime | None) -> str:
    """``at_second``: the date and the time each in a span that never wraps (``rl-time``), so a
    narrow column puts the time under the date rather than breaking either."""
    if value is None:
        return "-"
    day, time = at_second(value).split(" ")
    return format_html('<span class="rl-time">{}</span> <span class="rl-time">{}</span>', day, time)


def clipped(text: str, limit: int, *, code: bool = False) -> str:
    """``text`` cut at ``limit`` characters (``…``), the whole of it in the tooltip; it wraps
    anywhere in a list (JSON, tracebacks and URLs have few spaces)."""
    shown = text if len(text) <= limit else text[: limit - 1] + "…"
    tag = "code" if code else "span"
    return format_html('<{} class="rl-wrap" title="{}">{}</{}>', tag, text, shown, tag)


def seconds_display(model: type[models.Model], name: str) -> Callable[..., str] | str:
    """For a date-time field of ``model``, the admin display of it to the second (UTC);
    anything else unchanged."""
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:  # a display method of the admin, kept as it is
        return name
    if not isinstance(field, models.DateTimeField):
        return name
    key = (model, name)
    if key not in _displays:

        def show(obj: Any, name: str = name) -> str:  # Django calls a column callable with the row
            return time_html(getattr(obj, name))

        show.__name__ = name
        show.short_description = f"{field.verbose_name} (UTC)"  # type: ignore[attr-defined]
        show.admin_order_field = name  # type: ignore[attr-defined]
        _displays[key] = show
    return _displays[key]


class SecondsAdmin:
    """A ModelAdmin mixin: every date-time field to the second, in UTC, on the list and the
    object's page (read-only fields; editable ones keep their widgets)."""

    model: type[models.Model]

    def _seconds(self, names: Sequence[Any]) -> list[Any]:
        return [seconds_display(self.model, n) if isinstance(n, str) else n for n in names]

    def get_exclude(self, request: HttpRequest, obj: Any = None) -> Any:
        # The swapped read-only fields are callables now: keep their fields out of the form.
        swapped = [
            n
            for n in super().get_readonly_fields(request, obj)  # type: ignore[misc]
            if isinstance(n, str) and seconds_display(self.model, n) is not n
        ]
        return [*(super().get_exclude(request, obj) or []), *swapped]  # type: ignore[misc]

    def get_list_display(self, request: HttpRequest) -> Any:
        return self._seconds(super().get_list_display(request))  # type: ignore[misc]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self._seconds(super().get_readonly_fields(request, obj))  # type: ignore[misc]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        readonly = set(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        fields = super().get_fields(request, obj)  # type: ignore[misc]
        return [seconds_display(self.model, f) if f in readonly else f for f in fields]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        readonly = set(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        return [
            (
                title,
                {
                    **options,
                    "fields": [
                        tuple(seconds_display(self.model, x) if x in readonly else x for x in f)
                        if isinstance(f, (list, tuple))
                        else (seconds_display(self.model, f) if f in readonly else f)
                        for f in options["fields"]
                    ],
                },
            )
            for title, options in super().get_fieldsets(request, obj)  # type: ignore[misc]
        ]
