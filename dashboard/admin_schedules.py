"""The Django admin's schedules (protocol 1.2: Schedules): list, create, change, delete.

Checked by the same rules as ``PUT /api/schedules/NAME``
(``gateway.core.schedules.parse_schedule``), and with the same rights:
``gateway.view_queue`` to see them, ``gateway.change_queue`` to change them.
Schedules kept by ``LEASECAST_SCHEDULES`` are read-only here: the setting
changes them. Gateways see a change within a second (they re-read the table).
"""

from __future__ import annotations

import time
from typing import Any

import django_stubs_ext
import orjson
from django import forms
from django.contrib import admin
from django.http import HttpRequest

from gateway.conf import gateway_settings
from gateway.core.errors import ProtocolError
from gateway.core.schedule_ticks import TickRule, tick_label
from gateway.core.schedules import parse_schedule
from gateway.models import Schedule

__all__ = ["ScheduleAdmin", "ScheduleForm"]

# ModelAdmin[Schedule] is subscripted at run time (as in dashboard.admin).
django_stubs_ext.monkeypatch()

#: The form's fields, which are the schedule document's settings.
_FIELDS = (
    "name",
    "queue",
    "body",
    "cron",
    "every",
    "timezone",
    "enabled",
    "group",
    "priority",
    "ttl",
)


class ScheduleForm(forms.ModelForm[Schedule]):
    """A schedule's settings, checked as ``PUT /api/schedules/NAME`` checks them."""

    body = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4}),
        initial="null",
        help_text="The message body as JSON.",
    )

    class Meta:
        model = Schedule
        fields = _FIELDS

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            body = orjson.loads(data.get("body") or "null")
        except orjson.JSONDecodeError as exc:
            raise forms.ValidationError({"body": f"not JSON: {exc}"}) from exc
        document = {field: data.get(field) for field in _FIELDS if field not in ("name", "body")}
        document["cron"] = document["cron"] or None
        document["group"] = document["group"] or None
        document["timezone"] = document["timezone"] or "UTC"
        document["body"] = body
        try:
            spec = parse_schedule(
                data.get("name"), document, gateway_settings().limits, now=time.time()
            )
        except ProtocolError as exc:
            raise forms.ValidationError(exc.detail) from exc
        data["body"] = spec.body_json  # canonical, as the API stores it
        data["cron"], data["every"], data["timezone"] = (
            spec.rule.cron,
            spec.rule.every,
            spec.rule.timezone,
        )
        return data


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin[Schedule]):
    form = ScheduleForm
    list_display = ("name", "queue", "rule", "enabled", "next", "last", "fired", "managed")
    list_filter = ("enabled", "managed")
    search_fields = ("name", "queue")
    readonly_fields = ("next", "last", "fired", "managed")

    @admin.display(description="cron / every")
    def rule(self, schedule: Schedule) -> str:
        if schedule.cron:
            return f"{schedule.cron} ({schedule.timezone})"
        return f"every {schedule.every:g} s"

    @admin.display(description="next tick (UTC)")
    def next(self, schedule: Schedule) -> str:
        if not schedule.enabled or schedule.pk is None:
            return "-"
        tick = TickRule(schedule.cron, schedule.every, schedule.timezone).next_after(time.time())
        return "-" if tick is None else tick_label(tick)

    @admin.display(description="last tick (UTC)")
    def last(self, schedule: Schedule) -> str:
        return "-" if schedule.last_tick is None else tick_label(schedule.last_tick)

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        now = time.time()
        obj.updated_at = now
        if not change:
            obj.active_since = obj.created_at = now
            obj.save()
            return
        before = Schedule.objects.filter(pk=obj.pk).first()
        rule_changed = before is None or (before.cron, before.every, before.timezone) != (
            obj.cron,
            obj.every,
            obj.timezone,
        )
        if rule_changed or (obj.enabled and before is not None and not before.enabled):
            # Starts afresh, as over the API: ticks before now are not its own.
            obj.active_since = now
        # The form's fields only: last_tick and fired belong to the gateways,
        # which may have fired a tick since the form was loaded.
        obj.save(update_fields=[*_FIELDS, "active_since", "updated_at"])

    # Rights as the protocol gives them for schedules: the queue permissions.
    def has_view_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return request.user.has_perm("gateway.view_queue") or self._may_change(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self._may_change(request)

    def has_change_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return self._may_change(request) and not (obj is not None and obj.managed)

    def has_delete_permission(self, request: HttpRequest, obj: Schedule | None = None) -> bool:
        return self._may_change(request) and not (obj is not None and obj.managed)

    def _may_change(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("gateway.change_queue"))
