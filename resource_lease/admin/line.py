"""The line of waiters in the admin: who waits for what, since when, in which place.

Read-only: only the engine writes places (a waiter that dies drops out after its ttl by
itself). The place is counted among the line's live places, by the database's clock.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import F, QuerySet, Window
from django.db.models.functions import RowNumber
from django.http import HttpRequest
from django.utils.html import format_html

from resource_lease.admin.base import CSS, ReadOnlyAdmin, breakable
from resource_lease.admin.times import clipped, time_html
from resource_lease.display import format_duration
from resource_lease.models import Waiter


@admin.register(Waiter)
class WaiterAdmin(ReadOnlyAdmin):
    """Callers waiting in line (pools, semaphores, locks, elections), in the order of service."""

    list_display = ("line_display", "place", "holder_display", "priority", "where_display", "since_display")
    search_fields = ("kind", "name", "holder")
    list_per_page = 100
    extra_lookups = ("kind__exact",)  # the pool overview's link to a kind's line

    class Media:
        css = CSS

    def get_queryset(self, request: HttpRequest) -> QuerySet[Waiter]:
        places = super().get_queryset(request)
        assert isinstance(places, QuerySet)
        return (
            Waiter.objects.using(places.db)
            .live()
            .with_waited()
            .annotate(
                place=Window(
                    RowNumber(), partition_by=[F("kind"), F("name")], order_by=[F("priority").desc(), F("id").asc()]
                )
            )
            .in_order()
        )

    @admin.display(description="line", ordering="kind")
    def line_display(self, obj: Waiter) -> str:
        return breakable(obj.line)

    @admin.display(description="holder", ordering="holder")
    def holder_display(self, obj: Waiter) -> str:
        return breakable(obj.holder)

    @admin.display(description="place")
    def place(self, obj: Any) -> int:
        return int(obj.place)

    @admin.display(description="where")
    def where_display(self, obj: Waiter) -> str:
        return "" if obj.where is None else clipped(json.dumps(obj.where, ensure_ascii=False), 120, code=True)

    @admin.display(description="waiting since (UTC)", ordering="since")
    def since_display(self, obj: Any) -> str:
        return format_html("{}<br><small>{}</small>", time_html(obj.since), format_duration(obj.waited))
