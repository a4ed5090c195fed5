"""The Django admin of the pool: states at a glance, and the operator's three actions.

Every state and time shown is judged by the database's clock (``pool.with_state``). The
actions call ``resource_lease.pool``, whose conditional UPDATEs are safe while workers lease.
Fields that only the lease engine writes are read-only, and saving a resource writes only
the fields the form changed, so an edit can never put back a stale holder, fence or expiry.
The password of a payload's ``url`` is never sent to the browser (``ResourceForm``).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.text import capfirst

from resource_lease import health, pool, sessions, targets
from resource_lease.admin.base import CSS, AppAdmin, StateFilter, actor, badge, breakable, plural
from resource_lease.admin.data_keys import data_column, data_filter, data_keys
from resource_lease.admin.times import at_second, lock_delay_html, time_html
from resource_lease.audit import acting_as
from resource_lease.conf import lease_settings
from resource_lease.display import (
    current_holder,
    format_duration,
    lock_delay_until,
    mask_payload,
    payload_url,
    quarantine_left,
    unmask_payload,
    with_display_state,
)
from resource_lease.models import LeaseEvent, Resource, ResourceQuerySet
from resource_lease.models.api import http_token_name, is_http_holder
from resource_lease.pool import database_now
from resource_lease.proxy_urls import MASK
from resource_lease.seeding import data_problem, name_problem
from resource_lease.validation import check_kind

#: Fields the lease engine (or the pool operations) write; never edited in a form.
MACHINE_FIELDS = (
    "busy_before",
    "holder",
    "fence",
    "acquired_at",
    "renewed_at",
    "released_at",
    "took_over",
    "previous_holder",
    "quarantined_until",
    "quarantine_reason",
    "health_score",
    "backoff_level",
    "backoff_seconds",
    "created_at",
)
#: What an operator may edit.
EDITABLE_FIELDS = ("kind", "name", "data", "enabled")

QUARANTINE_CHOICES = [
    (15 * 60, "15 minutes"),
    (60 * 60, "1 hour"),
    (6 * 60 * 60, "6 hours"),
    (24 * 60 * 60, "1 day"),
    (7 * 24 * 60 * 60, "7 days"),
]


class QuarantineForm(forms.Form):
    duration = forms.TypedChoiceField(label="Quarantine for", choices=QUARANTINE_CHOICES, coerce=int, initial=60 * 60)
    reason = forms.CharField(
        max_length=500,
        help_text="Why it is taken out of service (shown in the list and in the audit trail).",
        widget=forms.TextInput(attrs={"size": 60}),
    )


class ResourceForm(forms.ModelForm):
    """A resource's form; on the change form, the password of ``data["url"]`` stays on the server.

    The form shows ``data`` with that password replaced by ``***`` (its initial value, so a
    payload sent back unchanged is no change of ``data`` and is not written). Sent back with
    ``***`` still in place, the stored password is put back, whatever else of the payload
    changed; a typed password replaces it; a payload without ``url`` drops it. The mask keeps
    the password only for the same user, host and port: carried to another one, the form is
    refused with an error on ``data``. The add form takes the URL as typed.

    The kind, name and payload are checked as the API and the seeding commands check them
    (``validation.check_kind``, ``seeding.name_problem``, ``seeding.data_problem``): a kind
    ``acquire()`` would refuse cannot be saved here.
    """

    class Meta:
        model = Resource
        fields = EDITABLE_FIELDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.masks_data = not self.instance._state.adding and "data" in self.fields
        self.stored_data: Any = None
        if self.masks_data:
            # As loaded for this request (the admin reads the row again for a POST).
            self.stored_data = copy.deepcopy(self.instance.data)
            self.initial["data"] = mask_payload(self.stored_data)
            field = self.fields["data"]
            # Compare what is sent back with the masked payload held here, not with a copy
            # of it the browser returns (Django's hidden "initial-data" for a callable default).
            field.show_hidden_initial = False
            field.help_text = (
                f'{field.help_text} A password in "url" is shown as {MASK}: leave {MASK} to keep the stored'
                " one, or type the new one."
            )

    def clean_kind(self) -> str:
        # The API's own check (resource_lease.validation.check_kind): a kind acquire() refuses
        # (a coordination kind "@...", over 100 characters) is refused here too.
        try:
            return check_kind(self.cleaned_data.get("kind"))
        except ValueError as exc:
            raise forms.ValidationError("%(problem)s", code="kind", params={"problem": str(exc)}) from None

    def clean_name(self) -> str:
        name = self.cleaned_data.get("name")
        problem = name_problem(name)  # what seed_resources and seed_proxies check
        if problem is not None:
            raise forms.ValidationError("%(problem)s", code="name", params={"problem": problem})
        return str(name)

    def clean_data(self) -> Any:
        data = self.cleaned_data.get("data")
        if self.masks_data:
            try:
                data = unmask_payload(data, self.stored_data)
            except ValueError as exc:
                raise forms.ValidationError(
                    'data["url"]: %(problem)s', code="masked_password", params={"problem": str(exc)}
                ) from None
        problem = data_problem(data)  # JSON every database stores alike (encode_json)
        if problem is not None:
            raise forms.ValidationError("%(problem)s", code="data", params={"problem": problem})
        return data


@admin.register(Resource)
class ResourceAdmin(AppAdmin):
    # The time left sits under the state: seven columns do not fit 1400 px with the sidebars.
    # Names as seed_proxies writes them (user@host:port) wrap after "@" and before ":".
    list_display = ("name_display", "kind", "state_badge", "holder_display", "fence", "url_display")
    list_display_links = ("name_display",)
    list_filter = ("kind", StateFilter, "enabled")
    extra_lookups = ("kind__exact",)  # the pool overview's links
    search_fields = ("name", "holder")
    ordering = ("kind", "name")
    list_per_page = 100
    actions = ("force_release_action", "quarantine_action", "restore_action")
    form = ResourceForm
    readonly_fields = (
        *MACHINE_FIELDS,
        "masked_data",
        "state_badge",
        "busy_before_display",
        "time_left_display",
        "quarantine_display",
        "cooldowns_display",
        "sessions_display",
        "recent_events",
    )
    fieldsets = (
        (None, {"fields": EDITABLE_FIELDS}),
        (
            "Lease (written by the lease engine only)",
            {
                "fields": (
                    "state_badge",
                    "holder",
                    "fence",
                    "busy_before_display",
                    "time_left_display",
                    "acquired_at",
                    "renewed_at",
                    "released_at",
                    "took_over",
                    "previous_holder",
                )
            },
        ),
        (
            "Quarantine (the buttons above, or the list's actions)",
            {"fields": ("quarantine_display", "quarantined_until", "quarantine_reason")},
        ),
        (
            "Health (written by lease.report(); restore resets it)",
            {"fields": ("health_score", "backoff_level", "backoff_seconds")},
        ),
        (
            "Targets and sessions (release(cooldown=), report('blocked', retry_after=), acquire(session=))",
            {"fields": ("cooldowns_display", "sessions_display")},
        ),
        ("Recent events", {"fields": ("recent_events", "created_at")}),
    )

    class Media:
        css = CSS

    def get_queryset(self, request: HttpRequest) -> QuerySet[Resource]:
        # Coordination rows (locks, elections, groups) have admin pages of their own.
        queryset: ResourceQuerySet = super().get_queryset(request)  # type: ignore[assignment]
        return with_display_state(queryset.pools())

    def get_list_filter(self, request: HttpRequest) -> Any:
        return (*super().get_list_filter(request), *(data_filter(key) for key in data_keys()))

    def get_list_display(self, request: HttpRequest) -> Any:
        # The DATA_KEYS columns go before the URL, which is the widest.
        columns = list(super().get_list_display(request))
        at = columns.index("url_display") if "url_display" in columns else len(columns)
        return [*columns[:at], *(data_column(key) for key in data_keys()), *columns[at:]]

    def get_fieldsets(self, request: HttpRequest, obj: Resource | None = None) -> Any:
        if obj is None:
            return ((None, {"fields": EDITABLE_FIELDS}),)
        fieldsets = super().get_fieldsets(request, obj)
        if self.has_change_permission(request, obj):
            return fieldsets
        # Read-only, Django would print the payload as stored, password included.
        return [
            (title, {**options, "fields": tuple("masked_data" if f == "data" else f for f in options["fields"])})
            for title, options in fieldsets
        ]

    # -- columns ------------------------------------------------------------------------

    @admin.display(description="name", ordering="name")
    def name_display(self, obj: Resource) -> str:
        return breakable(obj.name)

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj: Resource) -> str:
        state = getattr(obj, "state", "")
        if not state:
            return "-"
        if state == pool.QUARANTINED:  # how long, and why, right under the badge
            return format_html('{}<div class="rl-note">{}</div>', badge(state), self.quarantine_display(obj))
        if (until := lock_delay_until(obj)) is not None:
            return lock_delay_html(badge(state), until)
        return _state_with_time_left(obj)

    @admin.display(description="holder", ordering="holder")
    def holder_display(self, obj: Resource) -> str:
        holder = current_holder(obj)
        if holder and is_http_holder(holder):
            return format_html(
                '{}<br><small title="taken through the HTTP API">over HTTP, token {}</small>',
                holder,
                http_token_name(holder),
            )
        if holder and obj.took_over and obj.previous_holder:
            return format_html(
                '{}<br><small title="its previous lease expired unreleased">took over from {}</small>',
                holder,
                obj.previous_holder,
            )
        return holder or "-"

    @admin.display(description="busy before (UTC)", ordering="busy_before")
    def busy_before_display(self, obj: Resource) -> str:
        if not obj.fence and not obj.grant_token:
            return "never leased"  # the model's default expiry, the Unix epoch, says nothing
        return time_html(obj.busy_before)

    @admin.display(description="time left", ordering="busy_before")
    def time_left_display(self, obj: Resource) -> str:
        return format_duration(getattr(obj, "time_left", None)) or "-"

    @admin.display(description="URL")
    def url_display(self, obj: Resource) -> str:
        url = payload_url(obj)
        return breakable(url, at_colons=False) if url else "-"

    @admin.display(description="data")
    def masked_data(self, obj: Resource) -> str:
        return json.dumps(mask_payload(obj.data), ensure_ascii=False)

    @admin.display(description="quarantine", ordering="quarantined_until")
    def quarantine_display(self, obj: Resource) -> str:
        remaining = quarantine_left(obj)
        if remaining is None:
            return "-"
        reason = f": {obj.quarantine_reason}" if obj.quarantine_reason else ""
        return f"{format_duration(remaining)} left{reason}"

    @admin.display(description="cooling down for")
    def cooldowns_display(self, obj: Resource) -> str:
        cooling = targets.live_cooldowns([obj.pk], obj._state.db or "default").get(obj.pk, [])
        if not cooling:
            return "no target"
        return format_html(
            "<ul class='rl-events'>{}</ul>",
            format_html_join(
                "",
                "<li>{}: {} more (until {} UTC)</li>",
                ((c["target"], format_duration(c["left"]), at_second(c["until"])) for c in cooling[:20]),
            ),
        )

    @admin.display(description="bound sessions")
    def sessions_display(self, obj: Resource) -> str:
        alias = obj._state.db or "default"
        idle = {obj.kind: health.policy_of(alias, obj.kind).session_idle}
        bound = sessions.live_bindings([obj.pk], alias, idle).get(obj.pk, [])
        return ", ".join(bound[:50]) + (" …" if len(bound) > 50 else "") if bound else "none"

    @admin.display(description="recent events")
    def recent_events(self, obj: Resource) -> str:
        events = list(
            LeaseEvent.objects.using(obj._state.db).filter(kind=obj.kind, name=obj.name).order_by("-at", "-id")[:10]
        )
        if not events:
            return "none recorded" + ("" if lease_settings.AUDIT else " (the audit trail is off)")
        return format_html(
            "<ul class='rl-events'>{}</ul>",
            format_html_join(
                "",
                "<li>{} UTC {} {} {}</li>",
                ((at_second(e.at), badge(e.event, capfirst(e.get_event_display())), e.who, e.summary) for e in events),
            ),
        )

    # -- saving -------------------------------------------------------------------------

    def save_model(self, request: HttpRequest, obj: Resource, form: forms.ModelForm[Resource], change: bool) -> None:
        if not change:
            super().save_model(request, obj, form, change)
            return
        # Only what the operator changed: a full save would write back the holder, fence and
        # expiry as they were when the form was loaded, undoing a grant made since.
        fields = [name for name in form.changed_data if name in EDITABLE_FIELDS]
        if fields:
            obj.save(update_fields=fields)

    # -- actions ------------------------------------------------------------------------

    def _apply(self, request: HttpRequest, queryset: QuerySet[Resource], operation: Any, done: str, why: str) -> None:
        """Run a pool operation on the selected rows as the admin user and say how many changed."""
        pks = list(queryset.values_list("pk", flat=True))
        with acting_as(actor(request)):
            changed = operation(pks, using=queryset.db)
        message = f"{done} {plural(changed, 'resource')}"
        if skipped := len(pks) - changed:
            message += f"; {skipped} of the {len(pks)} selected {why}"
        self.message_user(request, message + ".", messages.SUCCESS if changed else messages.WARNING)

    @admin.action(description="Force release (free now; the holder's next renewal fails)", permissions=["change"])
    def force_release_action(self, request: HttpRequest, queryset: QuerySet[Resource]) -> None:
        self._apply(request, queryset, pool.force_release, "Force-released", "had no live lease")

    @admin.action(description="Quarantine for a chosen time, with a reason…", permissions=["change"])
    def quarantine_action(self, request: HttpRequest, queryset: QuerySet[Resource]) -> HttpResponse | None:
        return self._quarantine(
            request, queryset, reverse(f"{self.admin_site.name}:resource_lease_resource_changelist")
        )

    def _quarantine(self, request: HttpRequest, queryset: QuerySet[Resource], cancel_url: str) -> HttpResponse | None:
        """The quarantine form (its duration and reason) for the selected resources, and
        applying it; None once applied."""
        pks = list(queryset.values_list("pk", flat=True))
        if "apply" in request.POST:
            form = QuarantineForm(request.POST)
            if form.is_valid():
                still_held = pool.releasable(queryset).count()
                seconds, reason = form.cleaned_data["duration"], form.cleaned_data["reason"]
                with acting_as(actor(request)):
                    count = pool.quarantine(pks, reason=reason, seconds=seconds, using=queryset.db)
                label = dict(QUARANTINE_CHOICES).get(seconds, f"{seconds}s")
                message = f"Quarantined {plural(count, 'resource')} for {label}: {reason}."
                if still_held:
                    message += (
                        f" {still_held} {'is' if still_held == 1 else 'are'} leased right now: the holder keeps it"
                        " until it releases (or its lease runs out), then it stays out until the quarantine ends."
                    )
                self.message_user(request, message, messages.SUCCESS if count else messages.WARNING)
                return None
        else:
            form = QuarantineForm(initial={"duration": _default_duration()})
        context = {
            **self.admin_site.each_context(request),
            "title": "Quarantine resources",
            "opts": self.model._meta,
            "form": form,
            "resources": queryset.order_by("kind", "name")[:200],
            "count": len(pks),
            "pks": pks,
            "cancel_url": cancel_url,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "media": self.media + form.media,
        }
        return TemplateResponse(request, "admin/resource_lease/resource/quarantine.html", context)

    @admin.action(description="Restore from quarantine", permissions=["change"])
    def restore_action(self, request: HttpRequest, queryset: QuerySet[Resource]) -> None:
        self._apply(request, queryset, pool.restore, "Restored", "were not quarantined")

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        extra_context = {**(extra_context or {}), "database_now": database_now(Resource.objects.db)}
        return super().changelist_view(request, extra_context)

    # -- the resource's own page: the same three operations, as buttons -------------------

    change_form_template = "admin/resource_lease/resource/change_form.html"

    def get_urls(self) -> list[Any]:
        wrap, name = self.admin_site.admin_view, "resource_lease_resource"
        return [
            path("<path:object_id>/force-release/", wrap(self.force_release_view), name=f"{name}_force_release"),
            path("<path:object_id>/quarantine/", wrap(self.quarantine_view), name=f"{name}_quarantine"),
            path("<path:object_id>/restore/", wrap(self.restore_view), name=f"{name}_restore"),
            *super().get_urls(),
        ]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        obj = self.get_object(request, object_id)
        operations = _operations(self.admin_site.name, obj) if obj and self.has_change_permission(request, obj) else []
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), "rl_operations": operations})

    def _one(self, request: HttpRequest, object_id: str) -> tuple[QuerySet[Resource], str]:
        """The resource of an operation's page as a queryset, and its change page's URL."""
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404(f"no resource {object_id!r}")
        if not self.has_change_permission(request, obj):
            raise PermissionDenied
        change = reverse(f"{self.admin_site.name}:resource_lease_resource_change", args=[obj.pk])
        return Resource.objects.using(obj._state.db).filter(pk=obj.pk), change

    def force_release_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._button(request, object_id, pool.force_release, "Force-released", "had no live lease")

    def restore_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._button(request, object_id, pool.restore, "Restored", "were not quarantined")

    def _button(self, request: HttpRequest, object_id: str, operation: Any, done: str, why: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        queryset, change = self._one(request, object_id)
        self._apply(request, queryset, operation, done, why)
        return HttpResponseRedirect(change)

    def quarantine_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        queryset, change = self._one(request, object_id)
        response = self._quarantine(request, queryset, change)
        return HttpResponseRedirect(change) if response is None else response


def _operations(site: str, obj: Resource) -> list[dict[str, Any]]:
    """The buttons of a resource's page: force release while it is leased, quarantine, and
    restore while it is quarantined."""
    state = getattr(obj, "state", "")
    url = lambda op: reverse(f"{site}:resource_lease_resource_{op}", args=[obj.pk])  # noqa: E731
    operations = []
    if state in (pool.HELD, pool.EXPIRED) or (state == pool.QUARANTINED and current_holder(obj)):
        help_text = "free it now; the holder's next renewal fails"
        operations.append({"label": "Force release", "url": url("force_release"), "post": True, "help": help_text})
    operations.append(
        {"label": "Quarantine…", "url": url("quarantine"), "post": False, "help": "out of service, with a reason"}
    )
    if obj.quarantined_until is not None:
        operations.append({"label": "Restore", "url": url("restore"), "post": True, "help": "end the quarantine now"})
    return operations


def _state_with_time_left(obj: Resource) -> str:
    """A lease's state badge, and under it how long it has left (the list has no column for it)."""
    state = obj.state  # type: ignore[attr-defined]
    left = format_duration(getattr(obj, "time_left", None))
    if state == pool.HELD and left:
        return format_html('{}<div class="rl-note rl-time">{} left</div>', badge(state), left)
    return badge(state)


def _default_duration() -> int:
    seconds = int(float(lease_settings.QUARANTINE_SECONDS))
    return seconds if seconds in dict(QUARANTINE_CHOICES) else 60 * 60
