"""The Django admin: queues, messages, topics and tokens, with the operator actions.

Every action is recorded in Django's admin log (LogEntry) with what it did.
"""

from __future__ import annotations

import time
from typing import Any

import django_stubs_ext
from django import forms
from django.contrib import admin
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.cache import patch_cache_control
from django.utils.html import format_html, format_html_join

from dashboard import (
    admin_schedules,  # noqa: F401  (registers the schedules' admin)
    cancel,
)
from gateway.core.errors import Invalid, ProtocolError
from gateway.core.history import DEFAULT_TOPIC_SETTINGS
from gateway.core.leases import DEFAULT_QUEUE_SETTINGS, StoredState
from gateway.core.scopes import parse_scope
from gateway.host import operations
from gateway.models import Message, Queue, TaskRecord, Token, Topic, hash_token

# ModelAdmin[Queue] and ModelForm[Token] are subscripted at run time: in a host
# project that never called this in its settings, they would fail to import.
django_stubs_ext.monkeypatch()


class QueueForm(forms.ModelForm[Queue]):
    """Queue settings, checked by the same rules as ``PATCH /api/queues/QUEUE``."""

    class Meta:
        model = Queue
        fields = (
            "name",
            "visibility_timeout",
            "max_deliveries",
            "dedup_window",
            "max_length",
            "overflow",
            "paused",
            "max_in_flight",
            "rate_limit",
            "rate_burst",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Left out (a form posted by a script written before they existed):
        # the default, as PATCH leaves a setting it is not given.
        for name in ("max_in_flight", "rate_limit"):
            self.fields[name].required = False

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for name in ("max_in_flight", "rate_limit"):
            if data.get(name) is None and name not in self.errors:
                data[name] = getattr(DEFAULT_QUEUE_SETTINGS, name)
        settings = {
            name: data[name]
            for name in (
                "visibility_timeout",
                "max_deliveries",
                "dedup_window",
                "max_length",
                "max_in_flight",
                "rate_limit",
                "rate_burst",
            )
            if data.get(name) is not None
        }
        try:
            DEFAULT_QUEUE_SETTINGS.changed(settings)
        except ProtocolError as exc:
            raise forms.ValidationError(exc.detail) from exc
        return data


def with_counts(queues: QuerySet[Queue], now: float) -> QuerySet[Queue]:
    """``queues`` with their messages counted by state at ``now``, in one grouped query.

    The database counts (``n_visible``, ``n_in_flight``, ``n_dead``) rather than
    every message row being loaded into Python; the filters are
    :func:`gateway.core.leases.observed_state`'s rules in SQL.
    """
    dead = Q(message__state=StoredState.DEAD)
    due = Q(message__state=StoredState.READY) | Q(message__visible_at__lte=now)
    leased = Q(message__state=StoredState.LEASED, message__visible_at__gt=now)
    return queues.annotate(
        n_visible=Count("message", filter=~dead & due),
        n_in_flight=Count("message", filter=leased),
        n_dead=Count("message", filter=dead),
    )


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin[Queue]):
    form = QueueForm
    list_display = (
        "name",
        "visibility_timeout",
        "max_deliveries",
        "dedup_window",
        "max_length",
        "overflow",
        "paused",
        "max_in_flight",
        "rate_limit",
        "counts",
    )
    list_filter = ("paused",)
    search_fields = ("name",)
    readonly_fields = ("created_at",)
    actions = ["purge_queues", "redrive_queues"]

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        if change:
            # The form's fields only: the token bucket's columns belong to the
            # lease transactions, which may have written them since the form
            # was loaded.
            obj.save(update_fields=list(QueueForm.Meta.fields))
        else:
            obj.save()

    def get_queryset(self, request: HttpRequest) -> QuerySet[Queue]:
        return with_counts(super().get_queryset(request), time.time())

    @admin.display(description="visible / in flight / dead")
    def counts(self, queue: Queue) -> str:
        if not hasattr(queue, "n_visible"):  # not loaded through get_queryset
            queue = with_counts(Queue.objects.filter(pk=queue.pk), time.time()).get()
        return f"{queue.n_visible} / {queue.n_in_flight} / {queue.n_dead}"  # type: ignore[attr-defined]

    @admin.action(description="Purge: delete every message not in flight")
    def purge_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        for queue in queryset:
            n = operations.purge(queue)
            self.log_change(request, queue, f"Purged {n} messages (in-flight ones kept).")
            self.message_user(request, f"{queue.name}: purged {n} messages.")

    @admin.action(description="Redrive: move dead messages back to visible")
    def redrive_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        for queue in queryset:
            n = operations.redrive(queue)
            self.log_change(request, queue, f"Redrove {n} dead messages.")
            self.message_user(request, f"{queue.name}: redrove {n} dead messages.")


class TopicForm(forms.ModelForm[Topic]):
    """Topic history settings, checked by the same rules as ``PATCH /api/topics/TOPIC``."""

    class Meta:
        model = Topic
        fields = ("name", "history_size", "history_ttl")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        settings = {
            name: data[name]
            for name in ("history_size", "history_ttl")
            if data.get(name) is not None
        }
        try:
            DEFAULT_TOPIC_SETTINGS.changed(settings)
        except ProtocolError as exc:
            raise forms.ValidationError(exc.detail) from exc
        return data


@admin.register(Topic)
class TopicAdmin(admin.ModelAdmin[Topic]):
    """A topic's stored settings. A topic needs no row to be used (defaults: no
    history); its offsets and epoch are shown by ``GET /api/topics/TOPIC`` and the
    live dashboard. Changes apply on every process within GATEWAY_QUEUE_SETTINGS_TTL."""

    form = TopicForm
    list_display = ("name", "history_size", "history_ttl")
    search_fields = ("name",)
    readonly_fields = ("created_at",)


class StateFilter(admin.SimpleListFilter):
    """The protocol's states, which depend on the time as well as the column."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("visible", "visible"),
            ("delayed", "delayed"),
            ("in_flight", "in flight"),
            ("dead", "dead"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        now = time.time()
        timed = [StoredState.LEASED, StoredState.DELAYED]
        match self.value():
            case "visible":
                return queryset.filter(state=StoredState.READY) | queryset.filter(
                    state__in=timed, visible_at__lte=now
                )
            case "delayed":
                return queryset.filter(state=StoredState.DELAYED, visible_at__gt=now)
            case "in_flight":
                return queryset.filter(state=StoredState.LEASED, visible_at__gt=now)
            case "dead":
                return queryset.filter(state=StoredState.DEAD)
        return queryset


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin[Message]):
    list_display = (
        "id",
        "queue",
        "protocol_state",
        "group",
        "priority",
        "deliveries",
        "dead_reason",
        "short_body",
    )
    list_filter = ("queue", StateFilter, "dead_reason")
    search_fields = ("=id", "key", "=group")
    readonly_fields = (
        "queue",
        "state",
        "visible_at",
        "deliveries",
        "lease_token",
        "enqueued_at",
        "key",
        "group",
        "priority",
        "expires_at",
        "dead_reason",
        "pretty_body",
    )
    exclude = ("body",)
    actions = ["requeue_messages", "cancel_messages", "delete_selected"]

    @admin.display(description="state")
    def protocol_state(self, message: Message) -> str:
        return message.protocol_state.value

    @admin.display(description="body")
    def short_body(self, message: Message) -> str:
        return message.body if len(message.body) <= 40 else message.body[:37] + "..."

    @admin.display(description="body")
    def pretty_body(self, message: Message) -> str:
        # format_html escapes the body: it is data from producers, never markup.
        return format_html("<pre style='white-space: pre-wrap'>{}</pre>", message.body)

    @admin.action(description="Requeue: make dead or in-flight messages visible again")
    def requeue_messages(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        chosen = list(queryset)
        n = operations.requeue(chosen)
        for message in chosen:
            self.log_change(
                request, message, "Requeued (delivery count reset, old receipt made stale)."
            )
        self.message_user(request, f"Requeued {n} messages.")

    @admin.action(description="Cancel: dead-letter now (reason cancelled), its worker told")
    def cancel_messages(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        chosen = list(queryset)
        n = cancel.cancel(chosen)
        for message in chosen:
            self.log_change(request, message, "Cancelled (dead-lettered, its lease ended).")
        self.message_user(request, f"Cancelled {n} messages.")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # messages come from producers, through the protocol

    def delete_model(self, request: HttpRequest, obj: Message) -> None:
        # Through the store's rules: a deleted group head lets its group's next go.
        operations.delete([obj])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        operations.delete(list(queryset))


class TokenForm(forms.ModelForm[Token]):
    scopes_text = forms.CharField(
        label="Scopes",
        help_text="One per line: admin, or ACTION:PATTERN (enqueue, consume, publish, subscribe).",
        widget=forms.Textarea(attrs={"rows": 4}),
    )

    class Meta:
        model = Token
        fields = ("name", "revoked_at")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["scopes_text"].initial = "\n".join(self.instance.scopes)

    def clean_scopes_text(self) -> list[str]:
        scopes = [
            line.strip() for line in self.cleaned_data["scopes_text"].splitlines() if line.strip()
        ]
        if not scopes:
            raise forms.ValidationError("A token needs at least one scope.")
        for scope in scopes:
            try:
                parse_scope(scope)
            except Invalid as exc:
                raise forms.ValidationError(exc.detail) from exc
        return scopes


#: Where save_model leaves a new token's secret for response_add (this request only).
_NEW_SECRET = "_leasecast_new_token_secret"


@admin.register(Token)
class TokenAdmin(admin.ModelAdmin[Token]):
    form = TokenForm
    list_display = ("name", "scopes", "created_at", "revoked_at")
    actions = ["revoke_tokens"]

    def save_model(self, request: HttpRequest, obj: Token, form: Any, change: bool) -> None:
        obj.scopes = form.cleaned_data["scopes_text"]
        if not change:
            import secrets

            secret = "lc_" + secrets.token_urlsafe(32)
            obj.token_hash = hash_token(secret)
            super().save_model(request, obj, form, change)
            # Shown once, by response_add: only the hash is stored, and a
            # message would keep the secret in the "messages" cookie (signed,
            # not encrypted) or the session until the next page.
            setattr(request, _NEW_SECRET, secret)
            return
        super().save_model(request, obj, form, change)

    def response_add(
        self, request: HttpRequest, obj: Token, post_url_continue: str | None = None
    ) -> HttpResponse:
        """The new token's secret, in this answer only (not cached, no cookie)."""
        secret = getattr(request, _NEW_SECRET, None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "token": obj,
            "secret": secret,
            "title": f"Token {obj.name} added",
        }
        response = TemplateResponse(request, "admin/gateway/token/issued.html", context)
        patch_cache_control(response, no_store=True, private=True)
        return response

    @admin.action(description="Revoke selected tokens")
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[Token]) -> None:
        for token in queryset.filter(revoked_at__isnull=True):
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            self.log_change(request, token, "Revoked.")
        self.message_user(
            request, "Revoked. Gateways stop accepting them within GATEWAY_TOKEN_CACHE_TTL."
        )


def _when(seconds: float | None) -> str:
    """Unix seconds as local time for the admin, or "-"."""
    if seconds is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


@admin.register(TaskRecord)
class TaskRecordAdmin(admin.ModelAdmin[TaskRecord]):
    """django.tasks results (gateway.tasks): what ran, how it ended, every error."""

    list_display = ("id", "task_path", "queue", "status", "attempts", "priority", "finished")
    # No filter sidebar: the columns need the width at 1,280 px. Search finds
    # a status, a task or a queue.
    search_fields = ("=id", "task_path", "queue", "=status")
    readonly_fields = (
        "id",
        "backend",
        "task_path",
        "queue",
        "priority",
        "status",
        "message_id",
        "args",
        "kwargs",
        "return_value",
        "pretty_errors",
        "worker_ids",
        "enqueued",
        "runs_after",
        "started",
        "last_attempted",
        "finished",
    )
    exclude = (
        "errors",
        "enqueued_at",
        "run_after",
        "started_at",
        "last_attempted_at",
        "finished_at",
    )

    @admin.display(description="attempts")
    def attempts(self, record: TaskRecord) -> int:
        return len(record.worker_ids)

    @admin.display(description="enqueued")
    def enqueued(self, record: TaskRecord) -> str:
        return _when(record.enqueued_at)

    @admin.display(description="run after")
    def runs_after(self, record: TaskRecord) -> str:
        return _when(record.run_after)

    @admin.display(description="started")
    def started(self, record: TaskRecord) -> str:
        return _when(record.started_at)

    @admin.display(description="last attempted")
    def last_attempted(self, record: TaskRecord) -> str:
        return _when(record.last_attempted_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, record: TaskRecord) -> str:
        return _when(record.finished_at)

    @admin.display(description="errors")
    def pretty_errors(self, record: TaskRecord) -> str:
        # Tracebacks come from task code: escaped, never markup.
        return format_html_join(
            "",
            "<p><b>{}</b></p><pre style='white-space: pre-wrap'>{}</pre>",
            ((e.get("exception_class_path", ""), e.get("traceback", "")) for e in record.errors),
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tasks come from django.tasks enqueues
