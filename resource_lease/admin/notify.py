"""The admin of notifications, live configuration and shared counters.

Topics and counters are read-only: only ``notify()`` and ``counter().add()`` write them. Config entries are editable: the form
parses the value by the key's type (recorded by the code's ``Config`` declaration) and
validates it exactly as ``Config.set`` does, and the save goes through the same upsert,
so the version goes up and watchers in every process see an operator's edit like any other.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html

from resource_lease.admin.base import CSS, AppAdmin, ReadOnlyAdmin
from resource_lease.models import ConfigEntry, Counter, Topic
from resource_lease.recipes.config import parse_text, store_entry

#: Longest JSON shown in a list cell.
SHORT = 80


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _short(text: str) -> str:
    return text if len(text) <= SHORT else text[: SHORT - 1] + "…"


@admin.register(Topic)
class TopicAdmin(ReadOnlyAdmin):
    list_display = ("name", "version", "payload_display", "updated_at")
    search_fields = ("name",)
    ordering = ("name",)
    fields = ("name", "version", "payload_pretty", "updated_at")
    readonly_fields = fields

    class Media:
        css = CSS

    @admin.display(description="last payload")
    def payload_display(self, obj: Topic) -> str:
        return _short(_json(obj.payload))

    @admin.display(description="last payload")
    def payload_pretty(self, obj: Topic) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.payload, ensure_ascii=False, indent=2))


@admin.register(Counter)
class CounterAdmin(ReadOnlyAdmin):
    list_display = ("name", "value", "updated_at")
    search_fields = ("name",)
    ordering = ("name",)
    fields = ("name", "value", "updated_at")
    readonly_fields = fields

    class Media:
        css = CSS


class ConfigEntryForm(forms.ModelForm):
    """The value as text, parsed by the key's type (a str as typed; bool, numbers, lists and
    dicts as JSON), then checked as ``Config.set`` checks it."""

    value_text = forms.CharField(
        label="Value",
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="A str as typed; a bool as true/false; a number, list or dict as JSON.",
    )
    use_default = forms.BooleanField(
        label="Use the default", required=False, help_text="Remove the stored value: the key's default applies."
    )

    class Meta:
        model = ConfigEntry
        fields: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        entry: ConfigEntry = self.instance
        if entry.pk is not None:
            stored = entry.value
            self.fields["use_default"].initial = stored is None
            shown = entry.default if stored is None else stored
            self.fields["value_text"].initial = shown if entry.type == "str" else _json(shown)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        entry: ConfigEntry = self.instance
        if cleaned.get("use_default"):
            cleaned["parsed"] = None
            return cleaned
        try:
            cleaned["parsed"] = parse_text(entry.type, cleaned.get("value_text") or "", entry.key)
        except ValueError as exc:
            self.add_error("value_text", str(exc))
        return cleaned


@admin.register(ConfigEntry)
class ConfigEntryAdmin(AppAdmin):
    form = ConfigEntryForm
    list_display = ("namespace", "key", "type", "value_display", "default_display", "version", "updated_at")
    list_display_links = ("key",)
    search_fields = ("namespace", "key")
    ordering = ("namespace", "key")
    readonly_fields = ("namespace", "key", "type", "default_display", "version", "updated_at")
    fields = ("namespace", "key", "type", "default_display", "value_text", "use_default", "version", "updated_at")

    class Media:
        css = CSS

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # keys are declared by the code's Config(defaults=...)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # "use the default" removes a value; the key itself belongs to the code

    @admin.display(description="value")
    def value_display(self, obj: ConfigEntry) -> str:
        if obj.value is None:
            return format_html('<span class="rl-note">{}</span>', "default")
        return _short(_json(obj.value))

    @admin.display(description="default")
    def default_display(self, obj: ConfigEntry) -> str:
        return _short(_json(obj.default))

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        # Not wrapped in the admin's usual transaction: the value is stored by the engine's
        # own connection (the upsert every Config.set runs, which on PostgreSQL also wakes
        # the watchers), and on SQLite, with a single writer, that would wait for the
        # admin's own open transaction (see docs/pitfalls.md#sqlite).
        return self._changeform_view(request, object_id, form_url, extra_context)  # type: ignore[attr-defined,no-any-return]

    def save_model(self, request: HttpRequest, obj: ConfigEntry, form: forms.Form, change: bool) -> None:
        store_entry(obj, form.cleaned_data["parsed"], using=obj._state.db)
        obj.refresh_from_db()

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        pass
