"""The Django admin of named locks, semaphores, read/write locks and leader elections.

Each is a read-only list of its coordination rows (proxies of ``Resource``: ``LockRow``,
``SemaphoreSlot``, ``RwLockRow``, ``ElectionRow``): who holds, the fence, the time left by the
database's clock and, for an election, the hand-over state the last leader saved; and the
leadership log of every election (``LeadershipTerm``: each term's fence and leader, what
observers follow). The one action is
force release (``pool.force_release``, a conditional UPDATE that is safe while holders
work: the holder's next renewal or fenced write is refused). Nothing else is written here:
only the engine writes these rows.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html

from resource_lease import pool
from resource_lease.admin.base import CSS, AppAdmin, ReadOnlyAdmin, StateFilter, actor, badge, breakable, plural
from resource_lease.admin.times import clipped, lock_delay_html, time_html
from resource_lease.audit import acting_as
from resource_lease.display import (
    current_holder,
    format_duration,
    lock_delay_until,
    with_display_state,
)
from resource_lease.models import ElectionRow, LeadershipTerm, LockRow, Resource, RwLockRow, SemaphoreSlot
from resource_lease.pool import database_now

#: How a slot retired by shrinking a semaphore (a disabled row) is labelled.
RETIRED = "retired"


class CoordinationAdmin(AppAdmin):
    """Read-only lists of coordination rows, with force release."""

    list_per_page = 100
    actions = ("force_release_action",)
    search_fields = ("name", "holder")
    list_filter = (StateFilter,)
    change_list_template = "admin/resource_lease/coordination_change_list.html"
    #: Shown above the list: what the page is and how to use it from code.
    intro = ""

    class Media:
        css = CSS

    # Seen and force-released by whoever may see and change resources, as well as by the
    # holders of this page's own permissions.
    def _may(self, request: HttpRequest, action: str) -> bool:
        opts, resource = self.model._meta, Resource._meta
        return request.user.has_perm(f"{opts.app_label}.{action}_{opts.model_name}") or request.user.has_perm(
            f"{resource.app_label}.{action}_{resource.model_name}"
        )

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may(request, "view") or self._may(request, "change")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The list's action needs it; a row's own page stays read-only.
        return obj is None and self._may(request, "change")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Resource]:
        return with_display_state(super().get_queryset(request))

    # -- columns ------------------------------------------------------------------------

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj: Resource) -> str:
        state = getattr(obj, "state", "")
        if state == pool.DISABLED:
            return badge(pool.DISABLED, RETIRED)
        if (until := lock_delay_until(obj)) is not None:
            return lock_delay_html(badge(state), until)
        left = format_duration(getattr(obj, "time_left", None))
        if state == pool.HELD and left:  # the time left under the badge: one column less
            return format_html('{}<div class="rl-note rl-time">{} left</div>', badge(state), left)
        return badge(state) if state else "-"

    @admin.display(description="holder", ordering="holder")
    def holder_display(self, obj: Resource) -> str:
        holder = current_holder(obj)
        if not holder:
            return "-"
        if obj.took_over and obj.previous_holder:
            return format_html(
                '{}<br><small title="its previous holder\'s lease expired unreleased">took over from {}</small>',
                breakable(holder),
                obj.previous_holder,
            )
        return breakable(holder)

    @admin.display(description="time left", ordering="busy_before")
    def time_left_display(self, obj: Resource) -> str:
        return format_duration(getattr(obj, "time_left", None)) or "-"

    @admin.display(description="held since (UTC)", ordering="acquired_at")
    def held_since(self, obj: Resource) -> str:
        if not current_holder(obj) or obj.acquired_at is None:
            return "-"
        return time_html(obj.acquired_at)

    # -- the action ---------------------------------------------------------------------

    @admin.action(description="Force release (free now; the holder's next renewal fails)", permissions=["change"])
    def force_release_action(self, request: HttpRequest, queryset: QuerySet[Resource]) -> None:
        pks = list(queryset.values_list("pk", flat=True))
        with acting_as(actor(request)):
            changed = pool.force_release(pks, using=queryset.db)
        noun = str(self.model._meta.verbose_name)
        message = f"Force-released {plural(changed, noun)}"
        if skipped := len(pks) - changed:
            message += f"; {skipped} of the {len(pks)} selected had no live holder"
        self.message_user(request, message + ".", messages.SUCCESS if changed else messages.WARNING)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        extra_context = {
            **(extra_context or {}),
            "database_now": database_now(Resource.objects.db),
            "intro": self.intro,
        }
        return super().changelist_view(request, extra_context)


LEASE_FIELDS = ("state_badge", "holder_display", "fence", "time_left_display", "busy_before", "held_since")
HISTORY_FIELDS = ("acquired_at", "renewed_at", "released_at", "took_over", "previous_holder", "created_at")


@admin.register(LockRow)
class LockAdmin(CoordinationAdmin):
    intro = 'Named locks: resource_lease.lock("name") and @synchronized("key"). One row per name.'
    list_display = ("name", "state_badge", "holder_display", "fence", "held_since")
    ordering = ("name",)
    fieldsets = (
        (None, {"fields": ("name",)}),
        ("Lease (written by the lock's holders only)", {"fields": LEASE_FIELDS}),
        ("History", {"fields": HISTORY_FIELDS}),
    )
    readonly_fields = ("name", *LEASE_FIELDS, *HISTORY_FIELDS)


@admin.register(SemaphoreSlot)
class SemaphoreAdmin(CoordinationAdmin):
    intro = (
        'Semaphores: resource_lease.semaphore("name", slots=N). One row per slot; a slot above the count'
        " in force is retired: never granted again once its holder lets go."
    )
    list_display = ("semaphore", "slot", "state_badge", "holder_display", "fence", "held_since")
    ordering = ("kind", "name")
    fieldsets = (
        (None, {"fields": ("semaphore", "slot")}),
        ("Lease (written by the slot's holders only)", {"fields": LEASE_FIELDS}),
        ("History", {"fields": HISTORY_FIELDS}),
    )
    readonly_fields = ("semaphore", "slot", *LEASE_FIELDS, *HISTORY_FIELDS)

    @admin.display(description="semaphore", ordering="kind")
    def semaphore(self, obj: Resource) -> str:
        return obj.kind.split(":", 1)[1]

    @admin.display(description="slot", ordering="name")
    def slot(self, obj: Resource) -> str:
        return str(int(obj.name)) if obj.name.isdigit() else obj.name


@admin.register(RwLockRow)
class RwLockAdmin(CoordinationAdmin):
    intro = (
        'Read/write locks: resource_lease.rwlock("name").read() and .write(). One row per name, held by'
        " one writer or by readers (the holder shown is the last reader granted); every grant raises the fence."
    )
    list_display = ("name", "state_badge", "mode", "holder_display", "fence", "held_since")
    ordering = ("name",)
    fieldsets = (
        (None, {"fields": ("name", "mode")}),
        ("Lease (written by the rwlock's readers and writers only)", {"fields": LEASE_FIELDS}),
        ("History", {"fields": (*HISTORY_FIELDS, "read_fence")}),
    )
    readonly_fields = ("name", "mode", "read_fence", *LEASE_FIELDS, *HISTORY_FIELDS)

    @admin.display(description="held by")
    def mode(self, obj: Resource) -> str:
        if getattr(obj, "time_left", None) is None:
            return "-"
        return plural(obj.readers, "reader") if obj.readers else "a writer"


@admin.register(ElectionRow)
class ElectionAdmin(CoordinationAdmin):
    intro = (
        'Leader elections: resource_lease.Election("name") and @leader_only("name"). The holder is the'
        " leader; the state is what the last leader handed over."
    )
    list_display = ("name", "state_badge", "leader", "fence", "held_since", "handover_state")
    ordering = ("name",)
    fieldsets = (
        (None, {"fields": ("name", "handover_state")}),
        ("Leadership (written by the leaders only)", {"fields": LEASE_FIELDS}),
        ("History", {"fields": HISTORY_FIELDS}),
    )
    readonly_fields = ("name", "handover_state", *LEASE_FIELDS, *HISTORY_FIELDS)

    @admin.display(description="leader", ordering="holder")
    def leader(self, obj: Resource) -> str:
        return self.holder_display(obj)

    @admin.display(description="hand-over state")
    def handover_state(self, obj: Resource) -> str:
        if not obj.data:
            return "-"
        return clipped(json.dumps(obj.data, ensure_ascii=False, sort_keys=True), 160, code=True)


@admin.register(LeadershipTerm)
class LeadershipTermAdmin(ReadOnlyAdmin):
    """Every term of every election, newest first: what ``Election.observe`` reports."""

    list_display = ("election", "fence", "leader", "recorded_at")
    list_per_page = 100
    search_fields = ("election", "leader")
    ordering = ("election", "-fence")
    fields = list_display
    readonly_fields = list_display

    class Media:
        css = CSS
