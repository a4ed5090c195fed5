"""The admin of groups and barriers: who is a member (with its data), who is inside a barrier.

Read-only: only the engine writes these rows. One operator action, "kick", force-releases
member rows (``pool.force_release``): the member is out of ``members()`` at once. A member
whose process is alive notices at its next renewal and joins again by itself (as after a
pause); kicking is for a member whose host is gone, so the others need not wait its ttl.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html

from resource_lease import pool
from resource_lease.admin.base import (
    CSS,
    ReadOnlyAdmin,
    StateFilter,
    actor,
    badge,
    breakable,
    may_see_resources,
    plural,
)
from resource_lease.admin.times import clipped
from resource_lease.audit import acting_as
from resource_lease.display import current_holder, format_duration, with_display_state
from resource_lease.models import COORDINATION_PREFIX, BarrierOverview, GroupMember, Resource
from resource_lease.pool import database_now
from resource_lease.recipes.barrier import barriers

GROUP_PREFIX = f"{COORDINATION_PREFIX}group:"


def group_name(obj: Resource) -> str:
    return obj.kind[len(GROUP_PREFIX) :]


class GroupFilter(admin.SimpleListFilter):
    title = "group"
    parameter_name = "group"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        kinds = Resource.objects.filter(kind__startswith=GROUP_PREFIX).values_list("kind", flat=True).distinct()
        return [(k[len(GROUP_PREFIX) :], k[len(GROUP_PREFIX) :]) for k in sorted(set(kinds))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        return queryset.filter(kind=GROUP_PREFIX + value) if value else queryset


def _can_kick(request: HttpRequest) -> bool:
    opts = Resource._meta
    return bool(request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}"))


@admin.register(GroupMember)
class GroupMemberAdmin(ReadOnlyAdmin):
    """Every group's members: live ("held") or gone, holder, time left, data."""

    # The time left sits under the state: one column less, so the data has room at 1400 px.
    list_display = ("group_display", "name", "member_state", "holder_display", "fence", "data_display")
    list_display_links = None
    list_filter = (GroupFilter, StateFilter)
    search_fields = ("name", "holder", "kind")
    ordering = ("kind", "name")
    list_per_page = 200
    actions = ("kick_action",)

    class Media:
        css = CSS

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return may_see_resources(request)

    def has_kick_permission(self, request: HttpRequest) -> bool:
        return _can_kick(request)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Resource]:
        return with_display_state(Resource.objects.filter(kind__startswith=GROUP_PREFIX))

    @admin.display(description="group", ordering="kind")
    def group_display(self, obj: Resource) -> str:
        return group_name(obj)

    @admin.display(description="state", ordering="state")
    def member_state(self, obj: Resource) -> str:
        state = getattr(obj, "state", "")
        labels = {pool.HELD: "member", pool.EXPIRED: "gone (ttl ran out)", pool.FREE: "left"}
        if not state:
            return "-"
        shown = badge(state, labels.get(state, state))
        left = format_duration(getattr(obj, "time_left", None))
        if state == pool.HELD and left:
            return format_html('{}<div class="rl-note rl-time">{} left</div>', shown, left)
        return shown

    @admin.display(description="holder", ordering="holder")
    def holder_display(self, obj: Resource) -> str:
        holder = current_holder(obj)
        return breakable(holder) if holder else "-"

    @admin.display(description="time left", ordering="busy_before")
    def time_left_display(self, obj: Resource) -> str:
        return format_duration(getattr(obj, "time_left", None)) or "-"

    @admin.display(description="data")
    def data_display(self, obj: Resource) -> str:
        return clipped(json.dumps(obj.data, ensure_ascii=False), 200, code=True)

    @admin.action(description="Kick (force-release the membership now)", permissions=["kick"])
    def kick_action(self, request: HttpRequest, queryset: QuerySet[Resource]) -> None:
        pks = list(queryset.values_list("pk", flat=True))
        with acting_as(actor(request)):
            kicked = pool.force_release(pks, using=queryset.db)
        message = f"Kicked {plural(kicked, 'member')}"
        if skipped := len(pks) - kicked:
            message += f"; {skipped} of the {len(pks)} selected were not live members"
        message += ". A member whose process is alive joins again at its next renewal."
        self.message_user(request, message, messages.SUCCESS if kicked else messages.WARNING)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        extra_context = {**(extra_context or {}), "database_now": database_now(Resource.objects.db)}
        return super().changelist_view(request, extra_context)


@admin.register(BarrierOverview)
class BarrierOverviewAdmin(ReadOnlyAdmin):
    """Every barrier: its round, the frozen cohort, who of it is still inside, who waits."""

    class Media:
        css = CSS

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return GroupMemberAdmin.has_view_permission(self, request, obj)  # type: ignore[arg-type]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            **(extra_context or {}),
            "title": "Barriers",
            "opts": self.model._meta,
            "barriers": [
                {**b, "formed_at": parse_datetime(b["formed_at"]) if b["formed_at"] else None}
                for b in barriers(Resource.objects.db)
            ],
            "members_url": reverse(f"{self.admin_site.name}:resource_lease_groupmember_changelist"),
            "database_now": database_now(Resource.objects.db),
            "media": self.media,
        }
        return TemplateResponse(request, "admin/resource_lease/barrieroverview/overview.html", context)
