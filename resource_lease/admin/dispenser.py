"""The admin of the dispensers: each one's counts, and its items with their claims.

Everything shown is judged by the database's clock: an assigned item whose claim ran out is
shown as ``expired`` (free to be claimed again). Only the engine writes items; the two
actions go through ``Dispenser`` (conditional UPDATEs, safe while workers run).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.contrib import admin, messages
from django.db.models import BooleanField, Case, QuerySet, Value, When
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html
from django.utils.http import urlencode

from resource_lease.admin.base import CSS, AppAdmin, badge, plural
from resource_lease.admin.times import clipped, time_html
from resource_lease.db import DbNow
from resource_lease.display import database_time, format_duration
from resource_lease.models import DispenserItem
from resource_lease.recipes.dispenser import Dispenser, dispenser_counts

COUNTED = ("pending", "assigned", "done", "failed")


class ItemStateFilter(admin.SimpleListFilter):
    """The state by the database's clock: an assigned item whose claim ran out is expired."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(s, s) for s in (*COUNTED, "expired")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == "expired":
            return queryset.filter(state=DispenserItem.ASSIGNED, expires_at__lte=DbNow())
        if value == DispenserItem.ASSIGNED:
            return queryset.filter(state=value, expires_at__gt=DbNow())
        if value in COUNTED:
            return queryset.filter(state=value)
        return queryset


@admin.register(DispenserItem)
class DispenserItemAdmin(AppAdmin):
    # Under the state: the attempt, and the claim's time left or when it finished (the fence is
    # on the item's page). Five columns fit 1400 px, and the error gets the room.
    list_display = ("key", "dispenser", "state_badge", "worker", "error_display")
    list_filter = ("dispenser", ItemStateFilter, "worker")
    extra_lookups = ("dispenser__exact",)  # the counts table's links
    search_fields = ("key",)
    list_per_page = 100
    # Counting a million items on every page is slow; the counts table above says how many.
    show_full_result_count = False
    actions = ("retry_failed_action", "release_claims_action")
    readonly_fields = [f.name for f in DispenserItem._meta.fields]

    class Media:
        css = CSS

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[DispenserItem]:
        now = DbNow()
        return (
            super()
            .get_queryset(request)
            .annotate(
                live=Case(
                    When(state=DispenserItem.ASSIGNED, expires_at__gt=now, then=Value(True)),
                    default=Value(False),
                    output_field=BooleanField(),
                ),
                db_now=now,
            )
        )

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj: DispenserItem) -> str:
        if obj.state == DispenserItem.ASSIGNED and not getattr(obj, "live", True):
            return badge("expired")
        shown = badge(
            {"pending": "free", "assigned": "held", "done": "released", "failed": "lost"}[obj.state], obj.state
        )
        attempt = f"attempt {obj.attempts}" if obj.attempts else ""
        when: str
        if getattr(obj, "live", False) and obj.expires_at is not None:
            when = format_html('<span class="rl-time">claim: {} left</span>', self.claim_left(obj))
        elif obj.finished_at is not None:
            when = format_html("{} UTC", time_html(obj.finished_at))
        elif not attempt:
            return shown
        else:
            when = ""
        return format_html(
            '{}<div class="rl-note">{}{}{}</div>', shown, attempt, "; " if attempt and when else "", when
        )

    @admin.display(description="claim left", ordering="expires_at")
    def claim_left(self, obj: DispenserItem) -> str:
        if not getattr(obj, "live", False) or obj.expires_at is None:
            return "-"
        return format_duration(obj.expires_at - obj.db_now)  # type: ignore[attr-defined]

    @admin.display(description="error")
    def error_display(self, obj: DispenserItem) -> str:
        return clipped(obj.error, 240) if obj.error else "-"

    @admin.action(description="Retry the selected failed items (attempts reset)", permissions=["change"])
    def retry_failed_action(self, request: HttpRequest, queryset: QuerySet[DispenserItem]) -> None:
        keys: dict[str, list[str]] = defaultdict(list)
        for name, key in queryset.filter(state=DispenserItem.FAILED).values_list("dispenser", "key"):
            keys[name].append(key)
        n = sum(Dispenser(name, using=queryset.db).retry_failed(ks) for name, ks in keys.items())
        self.message_user(request, f"{plural(n, 'failed item')} queued again.", messages.SUCCESS)

    @admin.action(
        description="Release every live claim of the selected items' workers (back to the pool)",
        permissions=["change"],
    )
    def release_claims_action(self, request: HttpRequest, queryset: QuerySet[DispenserItem]) -> None:
        pairs = set(queryset.filter(state=DispenserItem.ASSIGNED).exclude(worker="").values_list("dispenser", "worker"))
        n = sum(Dispenser(name, using=queryset.db).release(worker) for name, worker in sorted(pairs))
        workers = ", ".join(sorted(w for _, w in pairs)) or "none"
        self.message_user(
            request,
            f"{plural(n, 'claim')} released (workers: {workers}).",
            messages.SUCCESS if n else messages.WARNING,
        )

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        using = self.get_queryset(request).db
        base = request.path
        rows = []
        for name, counts in dispenser_counts(using).items():
            cells = [(counts[s], f"{base}?{urlencode({'dispenser__exact': name, 'state': s})}", s) for s in COUNTED]
            rows.append(
                {
                    "name": name,
                    "link": f"{base}?{urlencode({'dispenser__exact': name})}",
                    "cells": cells,
                    "total": sum(counts.values()),
                }
            )
        context = {
            **(extra_context or {}),
            "dispensers": rows,
            "states": COUNTED,
            "database_now": database_time(using),
        }
        return super().changelist_view(request, extra_context=context)
