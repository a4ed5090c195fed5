"""The admin of the dispensers: each one's counts, and its items with their claims.

Everything shown is judged by the database's clock: an assigned item whose claim ran out is
shown as ``expired`` (free to be claimed again). Only the engine writes items: an item's
page is read-only (a Save would write back the whole row as the page read it, undoing a
worker's ``done()`` made in between: the item would run again and its result be lost). What
an operator may do goes through ``Dispenser``, conditional UPDATEs that are safe while
workers run: on the list, retry failed items, give claimed items back, release a worker's
claims; on an item's page, the same for that item, as buttons ("Retry" while it is failed,
"Release the claim" while the claim the page shows is live: a claim made since is left alone).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import BooleanField, Case, QuerySet, Value, When
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from resource_lease.admin.base import CSS, AppAdmin, badge, plural
from resource_lease.admin.times import clipped, time_html
from resource_lease.db.clock import DbNow
from resource_lease.display import format_duration
from resource_lease.models import DispenserItem
from resource_lease.pool import database_now
from resource_lease.recipes.dispenser import Dispenser, WorkItem, dispenser_counts

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
    actions = ("retry_failed_action", "release_items_action", "release_claims_action")
    readonly_fields = [f.name for f in DispenserItem._meta.fields]
    change_form_template = "admin/resource_lease/dispenseritem/change_form.html"

    class Media:
        css = CSS

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The list's actions and the item's buttons need it; the item's page itself stays
        # read-only: its Save would write back the whole row, as read, over a worker's outcome.
        return obj is None and super().has_change_permission(request)

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
        description="Give the selected items' live claims back to the pool (not counted as attempts)",
        permissions=["change"],
    )
    def release_items_action(self, request: HttpRequest, queryset: QuerySet[DispenserItem]) -> None:
        claims: dict[tuple[str, str], list[WorkItem]] = defaultdict(list)
        rows = queryset.filter(state=DispenserItem.ASSIGNED).values_list("dispenser", "worker", "key", "fence")
        for name, worker, key, fence in rows:
            if worker:
                claims[name, worker].append(WorkItem(key, None, 0, fence=fence, dispenser=name))
        # Each claim as it was read here (its fence): one made since is not given back.
        n = sum(Dispenser(name, using=queryset.db).release(worker, items) for (name, worker), items in claims.items())
        self.message_user(
            request, f"{plural(n, 'claim')} given back to the pool.", messages.SUCCESS if n else messages.WARNING
        )

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

    # -- an item's page: read-only, with its operations as buttons --------------------------

    def get_urls(self) -> list[Any]:
        wrap, name = self.admin_site.admin_view, "resource_lease_dispenseritem"
        return [
            path("<path:object_id>/retry/", wrap(self.retry_view), name=f"{name}_retry"),
            path("<path:object_id>/release/", wrap(self.release_view), name=f"{name}_release"),
            *super().get_urls(),
        ]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        obj = self.get_object(request, object_id)
        operations = _operations(self.admin_site.name, obj) if obj and self.has_change_permission(request) else []
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), "rl_operations": operations})

    def _item(self, request: HttpRequest, object_id: str) -> tuple[DispenserItem, str]:
        """The item of a button (POST only, by a user who may change items), and its page's URL."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404(f"no dispenser item {object_id!r}")
        return obj, reverse(f"{self.admin_site.name}:resource_lease_dispenseritem_change", args=[obj.pk])

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj, page = self._item(request, object_id)
        n = Dispenser(obj.dispenser, using=obj._state.db).retry_failed([obj.key])
        if n:
            self.message_user(request, "Queued again (attempts reset).", messages.SUCCESS)
        else:
            self.message_user(request, f"Not retried: the item is {obj.state}, not failed.", messages.WARNING)
        return HttpResponseRedirect(page)

    def release_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj, page = self._item(request, object_id)
        try:  # the claim the page showed: its worker and fence, sent with the button
            worker, fence = str(request.POST["worker"]), int(request.POST["fence"])
        except (KeyError, ValueError):
            self.message_user(request, "Not released: the button sent no claim (reload the page).", messages.ERROR)
            return HttpResponseRedirect(page)
        item = WorkItem(obj.key, None, 0, fence=fence, dispenser=obj.dispenser)
        if Dispenser(obj.dispenser, using=obj._state.db).release(worker, [item]):
            self.message_user(request, f"Claim of {worker} given back to the pool.", messages.SUCCESS)
        else:
            self.message_user(
                request,
                f"Not released: the claim of {worker} (fence {fence}) is no longer live"
                " (finished, expired, or claimed again since the page was read).",
                messages.WARNING,
            )
        return HttpResponseRedirect(page)

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
            "database_now": database_now(using),
        }
        return super().changelist_view(request, extra_context=context)


def _operations(site: str, obj: DispenserItem) -> list[dict[str, Any]]:
    """The buttons of an item's page: retry while it is failed, release while it is claimed
    (the claim shown: its worker and fence go with the button)."""
    url = lambda op: reverse(f"{site}:resource_lease_dispenseritem_{op}", args=[obj.pk])  # noqa: E731
    operations: list[dict[str, Any]] = []
    if obj.state == DispenserItem.FAILED:
        operations.append({"label": "Retry", "url": url("retry"), "help": "queue it again, attempts reset"})
    if obj.state == DispenserItem.ASSIGNED and getattr(obj, "live", False) and obj.worker:
        operations.append(
            {
                "label": "Release the claim",
                "url": url("release"),
                "help": f"give it back to the pool now; {obj.worker}'s outcome for it is then refused",
                "fields": {"worker": obj.worker, "fence": obj.fence},
            }
        )
    return operations
