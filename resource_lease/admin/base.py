"""What every admin page of the app shares: the base class (``AppAdmin``: times to the second,
``times.SecondsAdmin``, and only the lookups of its own filters and links,
``lookups.AllowListLookups``) and its read-only variant, the stylesheet, the state badge and
filter, the operator's name on audit events, and text helpers."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

from resource_lease import pool
from resource_lease.admin.lookups import AllowListLookups
from resource_lease.admin.times import SecondsAdmin
from resource_lease.models import Resource

CSS = {"all": ("resource_lease/admin.css",)}


def actor(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


def badge(state: str, label: str | None = None) -> str:
    return format_html('<span class="rl-badge rl-{}">{}</span>', state, label or state)


def breakable(text: str, *, at_colons: bool = True) -> str:
    """Escaped ``text`` that may wrap after ``://`` and ``@`` (and before other colons): holders
    and URLs have no spaces, and unbroken they push the list's columns off screen."""
    html = str(escape(text)).replace("://", "\0")
    if at_colons:
        html = html.replace(":", "<wbr>:")
    html = html.replace("@", "@<wbr>").replace("\0", "://<wbr>")
    return mark_safe(html)  # noqa: S308  (built from escaped text)


def may_see_resources(request: HttpRequest) -> bool:
    """Whether the user may view (or change) resources: who sees the overview and the groups."""
    opts = Resource._meta
    return any(request.user.has_perm(f"{opts.app_label}.{action}_{opts.model_name}") for action in ("view", "change"))


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class StateFilter(admin.SimpleListFilter):
    """Filter on the ``state`` annotation (free, held, expired, quarantined, disabled)."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state, state) for state in pool.STATES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value in pool.STATES:
            return queryset.filter(state=value)
        return queryset


class AppAdmin(AllowListLookups, SecondsAdmin, admin.ModelAdmin):  # type: ignore[type-arg]
    """The base of every admin of the app (``tests/test_admin_lookups.py`` checks that none is
    left out): times to the second, and a changelist that accepts only the lookups of its own
    filters and links."""


class ReadOnlyAdmin(AppAdmin):
    """Pages that only show what machines write: nothing to add, change or delete."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
