"""The admin of pool policies (``resource_lease.pool_policy``): one row per kind, editable,
validated exactly as ``pool_policy()`` validates (a backoff base above its cap, a threshold
<= 0, a decay outside [0, 1), ... are form errors naming the field, nothing saved)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin

from resource_lease.admin.base import CSS, AppAdmin
from resource_lease.health import Policy, check_policy
from resource_lease.models import PoolPolicy
from resource_lease.validation import check_kind

# A Policy setting's name, for the form field that carries it (the pairs name both).
_FIELD_OF = {
    "error_threshold": "error_threshold",
    "error_decay": "error_decay",
    "backoff base": "backoff_base",
    "backoff cap": "backoff_cap",
    "backoff": "backoff_base",
    "target_rate n": "target_rate_n",
    "target_rate per": "target_rate_per",
    "cooldown": "cooldown",
    "session_idle": "session_idle",
    "max_uses": "max_uses",
    "max_age": "max_age",
}


class PoolPolicyForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = PoolPolicy
        fields = (
            "kind",
            "error_threshold",
            "error_decay",
            "backoff_base",
            "backoff_cap",
            "target_rate_n",
            "target_rate_per",
            "cooldown",
            "session_idle",
            "max_uses",
            "max_age",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            kind = check_kind(data["kind"])
            rate_n, rate_per = data.get("target_rate_n"), data.get("target_rate_per")
            if (rate_n is None) != (rate_per is None):
                raise ValueError("target_rate n and per go together: set both or neither")
            check_policy(
                kind,
                {
                    "error_threshold": data["error_threshold"],
                    "error_decay": data["error_decay"],
                    "backoff": (data["backoff_base"], data["backoff_cap"]),
                    "target_rate": None if rate_n is None else (rate_n, rate_per),
                    "cooldown": data["cooldown"],
                    "session_idle": data["session_idle"],
                    "max_uses": data.get("max_uses"),
                    "max_age": data.get("max_age"),
                },
                Policy(kind),
            )
        except ValueError as exc:
            message = str(exc)
            field = next((f for name, f in _FIELD_OF.items() if message.startswith(name)), None)
            if message.startswith("kind"):
                field = "kind"
            raise forms.ValidationError({field: message} if field else message) from exc
        return data


@admin.register(PoolPolicy)
class PoolPolicyAdmin(AppAdmin):
    form = PoolPolicyForm
    list_display = (
        "kind",
        "error_threshold",
        "error_decay",
        "backoff_display",
        "target_rate_display",
        "cooldown",
        "session_idle",
        "max_uses",
        "max_age",
        "updated_at",
    )
    search_fields = ("kind",)
    ordering = ("kind",)
    readonly_fields = ("updated_at",)

    class Media:
        css = CSS

    @admin.display(description="backoff (base, cap)")
    def backoff_display(self, obj: PoolPolicy) -> str:
        return f"{obj.backoff_base:g} s to {obj.backoff_cap:g} s"

    @admin.display(description="target rate")
    def target_rate_display(self, obj: PoolPolicy) -> str:
        if obj.target_rate_n is None or obj.target_rate_per is None:
            return "-"
        return f"{obj.target_rate_n} per {obj.target_rate_per:g} s"
