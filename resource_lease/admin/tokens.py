"""The HTTP API's tokens in the admin: who may call it, limited to which kinds, last used
when. A token is made here (its text is shown once, in the page's message, and only its
digest is stored) and revoked with an action; it is never deleted, so its name, which every
lease it took records in its holder, is never given to another token. No lookup on the
digest (``search_fields`` is the name only)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest
from django.utils import timezone

from resource_lease.admin.base import CSS, AppAdmin, badge
from resource_lease.admin.times import time_html
from resource_lease.models.api import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(AppAdmin):
    list_display = ("name", "prefix_display", "kinds_display", "state_display", "created_display", "last_used_display")
    search_fields = ("name",)
    list_per_page = 100
    actions = ("revoke",)

    class Media:
        css = CSS

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if obj is None:
            return ("name", "kinds")
        return ("name", "prefix", "kinds", "created_at", "last_used_at", "revoked_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        return ("name", "prefix", "created_at", "last_used_at", "revoked_at")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoke instead: a name stays its token's

    def save_model(self, request: HttpRequest, obj: ApiToken, form: ModelForm[ApiToken], change: bool) -> None:
        text = None if change else obj.set_new_secret()
        super().save_model(request, obj, form, change)
        if text is not None:
            messages.warning(
                request,
                f"The token {obj.name!r} is {text} . Copy it now: it is stored hashed and is not shown again.",
            )

    @admin.display(description="token starts")
    def prefix_display(self, obj: ApiToken) -> str:
        return f"{obj.prefix}…"

    @admin.display(description="kinds", ordering="kinds")
    def kinds_display(self, obj: ApiToken) -> str:
        return ", ".join(obj.kind_list()) or "every kind"

    @admin.display(description="state", ordering="revoked_at")
    def state_display(self, obj: ApiToken) -> str:
        return badge("disabled", "revoked") if obj.revoked else badge("free", "active")

    @admin.display(description="created (UTC)", ordering="created_at")
    def created_display(self, obj: ApiToken) -> str:
        return time_html(obj.created_at)

    @admin.display(description="last used (UTC)", ordering="last_used_at")
    def last_used_display(self, obj: ApiToken) -> str:
        return time_html(obj.last_used_at) if obj.last_used_at else "never"

    @admin.action(description="Revoke the selected tokens (refused at once)", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        n = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"{n} token{'s' if n != 1 else ''} revoked.", messages.SUCCESS)
