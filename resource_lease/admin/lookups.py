"""Which query-string lookups a changelist of the app accepts: those of its own filters and
links, nothing else.

Django's ``ModelAdmin.lookup_allowed`` accepts any lookup on the model's own fields, so
``?data__url__regex=^http://alice:S`` shows or hides a row by the password the page masks:
an oracle that reads a secret one character at a time, for a user who may only view. Every
admin of the app mixes in ``AllowListLookups`` (through ``base.AppAdmin``): a changelist
accepts the parameters of its list filters (what each filter expects: a field's value
filter ``<field>`` and ``<field>__isnull``, a ``SimpleListFilter``'s ``parameter_name``) and
the admin's ``extra_lookups`` (what the app's own links use), and refuses every other lookup the way
Django refuses one: ``DisallowedModelAdminLookup``, a 400 answer, before any query runs.
Search (``?q=``) covers only ``search_fields``; ordering (``?o=``) only the list's columns.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin import FieldListFilter, ModelAdmin, SimpleListFilter
from django.contrib.admin.utils import get_fields_from_path
from django.db.models import Field
from django.http import HttpRequest


def filter_parameters(admin: ModelAdmin[Any], request: HttpRequest | None) -> set[str]:
    """The query-string parameters the list filters of ``admin`` read: a ``SimpleListFilter``'s
    ``parameter_name``; for a field, what the filter class Django picks for it (or the one
    given with it) expects, asked of the filter itself (``expected_parameters``: Django 5's
    value filter reads ``<field>`` and ``<field>__isnull``)."""
    parameters: set[str] = set()
    item: Any
    for item in admin.get_list_filter(request):  # type: ignore[arg-type]
        if isinstance(item, type) and issubclass(item, SimpleListFilter):
            parameters.add(str(item.parameter_name))
            continue
        path, make = item if isinstance(item, (list, tuple)) else (item, FieldListFilter.create)
        field: Any = path if isinstance(path, Field) else get_fields_from_path(admin.model, path)[-1]
        path = field.name if isinstance(path, Field) else path
        # Built as the changelist builds it, with no parameters (the value, boolean and choice
        # filters the app uses query nothing when built: their choices are read lazily).
        spec = make(field, request, {}, admin.model, admin, field_path=path)
        parameters.update(str(p) for p in spec.expected_parameters())
    return parameters


class AllowListLookups:
    """A ModelAdmin mixin: the changelist accepts only the lookups of the admin's list filters
    and ``extra_lookups``; any other is refused (``DisallowedModelAdminLookup``, HTTP 400)."""

    #: Lookups the app's own links use beyond the list filters' (e.g. the pool overview's
    #: ``kind__exact`` on the line of waiters): exact lookups on columns the list shows, never
    #: one on a JSON or token column.
    extra_lookups: tuple[str, ...] = ()

    def allowed_lookups(self, request: HttpRequest | None) -> set[str]:
        """The query-string parameters this admin's changelist accepts."""
        return filter_parameters(self, request) | set(self.extra_lookups)  # type: ignore[arg-type]

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        return lookup in self.allowed_lookups(request)
