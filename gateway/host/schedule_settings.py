"""Periodic tasks from Django settings: ``LEASECAST_SCHEDULES`` (protocol 1.2: Tasks).

::

    LEASECAST_SCHEDULES = {
        "nightly-report": {"task": "reports.tasks.nightly", "cron": "0 3 * * *",
                           "timezone": "Europe/Berlin", "kwargs": {"full": True}},
        "heartbeat": {"task": "monitoring.tasks.beat", "every": 30},
    }

Each entry is kept as a schedule of the same name (``managed``): created when
the entry appears, changed when it changes, deleted when it goes. At every
tick the gateway enqueues the task as its backend
(``gateway.tasks.LeasecastBackend``) would: the same message body and a
``TaskRecord`` for its result, on the task's queue with its priority
(``gateway.store.schedules``). The schedules are synced when a gateway
process starts (:class:`SettingsSync`, registered by the site) and by
``manage.py sync_schedules``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import orjson
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from gateway.core.errors import ProtocolError
from gateway.core.protocol import check_name
from gateway.core.schedule_ticks import parse_tick_rule
from gateway.core.schedules import ScheduleSpec
from gateway.store.schedules import ManagedTask, sync_managed

__all__ = ["ENTRY_FIELDS", "SettingsSync", "managed_tasks", "sync_schedules"]

log = logging.getLogger("leasecast.schedules")

#: The fields of one ``LEASECAST_SCHEDULES`` entry; any other is a configuration error.
ENTRY_FIELDS = frozenset({"task", "cron", "every", "args", "kwargs", "timezone"})


def managed_tasks(
    setting: Mapping[str, Any] | None = None, *, now: float | None = None
) -> dict[str, ManagedTask]:
    """The schedules ``LEASECAST_SCHEDULES`` asks for, checked and resolved.

    Args:
        setting: the setting's value (default: read from Django settings).

    Raises:
        ImproperlyConfigured: an entry that cannot be kept, named with the reason.
    """
    from gateway.conf import gateway_settings
    from gateway.host.tasks import InvalidTaskError, LeasecastBackend, task_message

    raw = getattr(settings, "LEASECAST_SCHEDULES", {}) if setting is None else setting
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured("LEASECAST_SCHEDULES must be a dict of schedule name -> entry")
    now = time.time() if now is None else now
    limit = gateway_settings().max_body_bytes
    entries: dict[str, ManagedTask] = {}
    for name, entry in raw.items():
        where = f"LEASECAST_SCHEDULES[{name!r}]"
        try:
            check_name(name, "schedule")
            if not isinstance(entry, Mapping):
                raise ImproperlyConfigured(f"{where} must be a dict")
            unknown = sorted(set(entry) - ENTRY_FIELDS)
            if unknown:
                raise ImproperlyConfigured(
                    f"{where}: unknown field(s) {', '.join(unknown)}; "
                    f"known: {', '.join(sorted(ENTRY_FIELDS))}"
                )
            path = entry.get("task")
            if not isinstance(path, str):
                raise ImproperlyConfigured(f"{where}: 'task' must be a task's dotted path")
            try:
                task = import_string(path)
            except ImportError as exc:
                raise ImproperlyConfigured(f"{where}: cannot import {path!r}: {exc}") from exc
            if not hasattr(task, "get_backend") or not hasattr(task, "module_path"):
                raise ImproperlyConfigured(f"{where}: {path!r} is not a django.tasks task")
            backend = task.get_backend()
            if not isinstance(backend, LeasecastBackend):
                raise ImproperlyConfigured(
                    f"{where}: the task's backend {task.backend!r} is not "
                    "gateway.tasks.LeasecastBackend"
                )
            backend.validate_task(task)
            args, kwargs = entry.get("args", []), entry.get("kwargs", {})
            if not isinstance(args, list | tuple) or not isinstance(kwargs, Mapping):
                raise ImproperlyConfigured(f"{where}: 'args' must be a list, 'kwargs' a dict")
            try:  # JSON, as the backend stores them (a tuple becomes a list)
                args = orjson.loads(orjson.dumps(list(args)))
                kwargs = orjson.loads(orjson.dumps(dict(kwargs)))
            except TypeError as exc:
                raise ImproperlyConfigured(f"{where}: args and kwargs must be JSON: {exc}") from exc
            message = task_message("", task, args, kwargs)
            del message["id"]  # each tick's own, made when it fires
            body = orjson.dumps(message)
            if len(body) > limit:
                raise ImproperlyConfigured(
                    f"{where}: the task's message takes {len(body)} bytes; the limit is {limit}"
                )
            rule = parse_tick_rule(
                entry.get("cron"), entry.get("every"), entry.get("timezone", "UTC"), now=now
            )
        except ProtocolError as exc:
            raise ImproperlyConfigured(f"{where}: {exc.detail}") from exc
        except InvalidTaskError as exc:
            raise ImproperlyConfigured(f"{where}: {exc}") from exc
        spec = ScheduleSpec(
            queue=task.queue_name, body_json=body.decode(), rule=rule, priority=task.priority
        )
        entries[name] = ManagedTask(spec, backend.alias)
    return entries


def sync_schedules(using: str = "default") -> tuple[int, int, int]:
    """Make the stored schedules match ``LEASECAST_SCHEDULES``, on Django's connection.

    Returns:
        How many schedules were created, changed and deleted.

    Raises:
        ImproperlyConfigured: an entry is wrong (nothing is changed).
    """
    from gateway.host.on_django import django_transaction

    entries = managed_tasks()
    with django_transaction(using) as txn:
        return sync_managed(txn, entries)


class SettingsSync:
    """A runtime part: syncs ``LEASECAST_SCHEDULES`` when the gateway process starts.

    On the scheduler's thread, so the sync and the first ticks are ordered.
    A wrong setting is logged and changes nothing (the process still serves).
    """

    def __init__(self, runtime: Any) -> None:
        self._task: Any = None
        try:
            entries = managed_tasks()
        except ImproperlyConfigured as exc:
            log.error("LEASECAST_SCHEDULES not synced: %s", exc)
            return
        # Also with no entries: schedules of entries that went are deleted.
        self._task = runtime.loop.create_task(self._sync(runtime, entries))

    @classmethod
    def for_runtime(cls, runtime: Any) -> SettingsSync:
        """Build the part for ``runtime`` (``gateway.runtime.add_part``)."""
        return cls(runtime)

    async def _sync(self, runtime: Any, entries: dict[str, ManagedTask]) -> None:
        try:
            created, changed, deleted = await runtime.schedules.call(
                lambda txn: sync_managed(txn, entries)
            )
        except Exception as exc:  # e.g. another process synced the same name at once
            log.warning("LEASECAST_SCHEDULES sync failed (%s: %s)", type(exc).__name__, exc)
            return
        if created or changed or deleted:
            log.info(
                "LEASECAST_SCHEDULES: %d created, %d changed, %d deleted", created, changed, deleted
            )

    def close(self) -> None:
        """Stop a sync still running (the runtime is closing)."""
        if self._task is not None:
            self._task.cancel()
