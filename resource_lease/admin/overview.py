"""The pool overview page (counts per kind and state, waits and time-outs per kind, the
latest lease events) and the audit trail's list."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.text import capfirst

from resource_lease import pool
from resource_lease.admin.base import CSS, ReadOnlyAdmin, badge, may_see_resources
from resource_lease.conf import lease_settings
from resource_lease.display import format_wait
from resource_lease.models import LeaseEvent, PoolOverview, Resource
from resource_lease.pool import database_now
from resource_lease.wait_stats import wait_stats

#: The window of the overview's waits and time-outs.
WAITS_SECONDS = 3600.0


@admin.register(PoolOverview)
class PoolOverviewAdmin(ReadOnlyAdmin):
    """The overview page: per kind, how many resources are free, held, quarantined, and
    how busy the pool is; and the latest lease events. Visible to whoever may view resources."""

    class Media:
        css = CSS

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return may_see_resources(request)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        resources_url = reverse(f"{self.admin_site.name}:resource_lease_resource_changelist")
        kinds = []
        totals = dict.fromkeys((*pool.STATES, "total"), 0)
        lines = {kind: len(line) for kind, line in pool.waiting(using=Resource.objects.db).items()}
        for kind, states in pool.counts(Resource.objects.pools()).items():
            for key, value in states.items():
                totals[key] += value
            kinds.append({**_overview_row(kind, states, resources_url), "waiting": lines.get(kind, 0)})
        totals_row = _overview_row("all kinds", totals, resources_url, link_kind=False)
        audit_on = bool(lease_settings.AUDIT)
        context = {
            **self.admin_site.each_context(request),
            **(extra_context or {}),
            "title": "Pool overview",
            "waits": _wait_rows(Resource.objects.db) if audit_on else [],
            "opts": self.model._meta,
            "kinds": kinds,
            "totals": {**totals_row, "waiting": sum(lines.values())} if len(kinds) > 1 else None,
            "waiters_url": reverse(f"{self.admin_site.name}:resource_lease_waiter_changelist"),
            "events": list(LeaseEvent.objects.order_by("-at", "-id")[:25]),
            "events_url": reverse(f"{self.admin_site.name}:resource_lease_leaseevent_changelist"),
            "audit_on": audit_on,
            "resources_url": resources_url,
            "database_now": database_now(Resource.objects.db),
            "media": self.media,
        }
        return TemplateResponse(request, "admin/resource_lease/pooloverview/overview.html", context)


def _overview_row(kind: str, states: dict[str, int], resources_url: str, *, link_kind: bool = True) -> dict[str, Any]:
    # Utilisation: the share of the resources in service (neither quarantined nor disabled)
    # that are leased now.
    in_service = states["total"] - states[pool.QUARANTINED] - states[pool.DISABLED]
    utilisation = round(100 * states[pool.HELD] / in_service) if in_service else None

    def link(state: str | None) -> str:
        query: dict[str, str] = {}
        if link_kind:
            query["kind__exact"] = kind
        if state:
            query["state"] = state
        return f"{resources_url}?{urlencode(query)}" if query else resources_url

    return {
        "kind": kind,
        "link": link(None),
        "cells": [(states[state], link(state), state) for state in (*pool.STATES,)],
        "total": states["total"],
        "utilisation": utilisation,
    }


@admin.register(LeaseEvent)
class LeaseEventAdmin(ReadOnlyAdmin):
    """The audit trail, read-only (``manage.py prune_lease_events`` deletes old entries)."""

    # Six columns that fit 1400 px: the resource is kind and name, "by" the holder or, for an
    # operator's action, the operator; the detail says whom a take-over or force release cut off.
    list_display = ("at", "event_badge", "resource", "by", "fence", "detail_display")
    list_display_links = ("at",)
    # No filter by kind: listing the kinds would scan the whole (long) trail on every page.
    list_filter = ("event",)
    search_fields = ("kind", "name", "holder", "actor")
    list_per_page = 100
    # Counting a long trail on every page is slow; the paginator shows "more" instead.
    show_full_result_count = False

    class Media:
        css = CSS

    @admin.display(description="event", ordering="event")
    def event_badge(self, obj: LeaseEvent) -> str:
        return badge(obj.event, capfirst(obj.get_event_display()))

    @admin.display(description="resource", ordering="kind")
    def resource(self, obj: LeaseEvent) -> str:
        return f"{obj.kind}: {obj.name}" if obj.name else obj.kind

    @admin.display(description="by")
    def by(self, obj: LeaseEvent) -> str:
        return obj.who

    @admin.display(description="detail")
    def detail_display(self, obj: LeaseEvent) -> str:
        return obj.summary or "-"


def _wait_rows(using: str) -> list[dict[str, Any]]:
    rows = []
    for kind, stats in wait_stats(using, seconds=WAITS_SECONDS).items():
        measured = stats["measured"]
        rows.append(
            {
                "kind": kind,
                "granted": stats["granted"],
                "taken_over": stats["taken_over"],
                "timed_out": stats["timed_out"],
                "median": format_wait(stats["median"], bound=True) if measured else "-",
                "p95": format_wait(stats["p95"], bound=True) if measured else "-",
                "longest": format_wait(stats["longest"]) if measured else "-",
            }
        )
    return rows
