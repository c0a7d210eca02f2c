"""``gateway.tasks.LeasecastBackend``: a ``django.tasks`` backend on Leasecast queues.

One class serves Django's own ``django.tasks`` (Django 6.0 and later) and the
``django-tasks`` package (the same API on Django 5.2)::

    TASKS = {
        "default": {
            "BACKEND": "gateway.tasks.LeasecastBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"database": "default"},
        }
    }

A task is a queue message (``queue_name`` is the Leasecast queue) plus a row
of ``leasecast_task`` (``gateway.models.TaskRecord``) for its result, both
written in the enqueuer's transaction: a task enqueued in a transaction that
rolls back never runs, and one enqueued in a transaction that commits finds
the rows of that transaction when it runs. ``run_after`` is the message's
delay, ``priority`` its priority. Workers (``manage.py leasecast_worker``)
record the outcome in the same transaction as the ack that ends the message's
lease, so a result and its message always agree.
"""

from __future__ import annotations

import copy
import importlib
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from gateway.core.leases import StoredState
from gateway.core.protocol import NAME_RE, EnqueueSpec
from gateway.core.task_decisions import CANCELLED_PATH


def _tasks_api() -> tuple[Any, Any, Any, type[Exception]]:
    """Django's ``django.tasks`` (6.0 and later), else the ``django-tasks`` package.

    Returns the modules ``backends.base``, ``base`` and ``exceptions``, and
    the invalid-task exception (``InvalidTask`` in Django, ``InvalidTaskError``
    in the package). Typed loosely on purpose: the two APIs are the same at
    run time, and their type stubs differ in details.
    """
    for package, invalid in (("django.tasks", "InvalidTask"), ("django_tasks", "InvalidTaskError")):
        try:
            backends = importlib.import_module(f"{package}.backends.base")
        except ImportError:
            continue
        base = importlib.import_module(f"{package}.base")
        exceptions = importlib.import_module(f"{package}.exceptions")
        return backends, base, exceptions, getattr(exceptions, invalid)
    raise ImproperlyConfigured(
        "gateway.tasks needs django.tasks (Django 6.0+) or the django-tasks package (Django "
        "5.2: pip install 'leasecast-gateway[django52]')"
    )


_backends, _base, _exceptions, InvalidTaskError = _tasks_api()
BaseTaskBackend: Any = _backends.BaseTaskBackend
Task: Any = _base.Task
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
TaskResultDoesNotExist: type[Exception] = _exceptions.TaskResultDoesNotExist


__all__ = ["LeasecastBackend", "task_message", "to_datetime"]

#: The options a backend takes (``OPTIONS``); any other is a configuration error.
OPTIONS = ("database",)


def to_datetime(seconds: float | None) -> datetime | None:
    """Unix seconds as an aware datetime (results store times as seconds)."""
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=UTC)


def task_message(result_id: str, task: Any, args: Any, kwargs: Any) -> dict[str, Any]:
    """The body of a task's queue message: what a worker needs to run it."""
    return {
        "task": task.module_path,
        "id": result_id,
        "args": args,
        "kwargs": kwargs,
        "takes_context": task.takes_context,
    }


def _as_enqueued(task: Any, record: Any) -> Any:
    """``task`` with the backend, queue and priority it was enqueued with.

    Not ``task.using(...)``: that validates the task against its backend
    again, and a result must be readable whatever the settings of the
    process reading it (the enqueuing backend's ``QUEUES`` may not be
    configured here, or may have changed since).
    """
    enqueued = copy.copy(task)
    for name, value in (
        ("backend", record.backend),
        ("queue_name", record.queue),
        ("priority", record.priority),
    ):
        object.__setattr__(enqueued, name, value)
    return enqueued


class LeasecastBackend(BaseTaskBackend):
    """Runs ``django.tasks`` tasks through Leasecast queues (see the module docstring).

    Raises:
        ImproperlyConfigured: an unknown option, or Leasecast (``gateway``) is
            not in ``INSTALLED_APPS``.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}] OPTIONS: unknown option(s) {', '.join(unknown)}; "
                f"LeasecastBackend takes {', '.join(OPTIONS)}"
            )
        self.database: str = self.options.get("database", "default")

    def validate_task(self, task: Any) -> None:
        """Django's checks, and the queue name must be a Leasecast queue name."""
        super().validate_task(task)
        if NAME_RE.fullmatch(task.queue_name) is None:
            raise InvalidTaskError(
                f"queue_name {task.queue_name!r} is not a Leasecast queue name "
                "(1-200 characters of [A-Za-z0-9._-])"
            )

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Enqueue ``task`` in the caller's transaction (committed at once outside one).

        Raises:
            InvalidTaskError: the task cannot run here (see :meth:`validate_task`),
                or its arguments are too large for a message.
            TypeError, ValueError: arguments that are not JSON.
            Backpressure: the task's queue is bounded and full.
        """
        from gateway.conf import gateway_settings
        from gateway.host.on_django import enqueue_on_django
        from gateway.store.tasks import NewTask

        self.validate_task(task)
        result = TaskResult(  # normalises args and kwargs, or raises for non-JSON ones
            task=task,
            id=uuid.uuid4().hex,
            status=TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        body = orjson.dumps(task_message(result.id, task, result.args, result.kwargs))
        limit = gateway_settings().max_body_bytes
        if len(body) > limit:
            raise InvalidTaskError(
                f"the task's arguments take {len(body)} bytes; a message holds at most {limit}"
            )
        now = time.time()
        delay = 0.0
        if task.run_after is not None:
            delay = max(0.0, task.run_after.timestamp() - now)
        spec = EnqueueSpec(body, delay=delay, priority=task.priority)
        # The result row is written without the ORM (its model instance and
        # SQL compiler were the larger part of an enqueue's CPU).
        row = NewTask(
            result.id,
            backend=self.alias,
            task_path=task.module_path,
            queue=task.queue_name,
            priority=task.priority,
            args_json=orjson.dumps(result.args),
            kwargs_json=orjson.dumps(result.kwargs),
            enqueued_at=now,
            run_after=now + delay if delay else None,
        )
        enqueue_on_django(self.database, task.queue_name, [spec], task=row)
        object.__setattr__(result, "enqueued_at", to_datetime(now))
        return result

    def get_result(self, result_id: str) -> Any:
        """The task's result as stored, RUNNING while its message is leased.

        Raises:
            TaskResultDoesNotExist: no such result (never enqueued, or pruned
                after ``GATEWAY_TASK_RESULT_RETENTION``).
        """
        from gateway.models import Message, TaskRecord

        record = TaskRecord.objects.using(self.database).filter(id=result_id).first()
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        try:
            task = import_string(record.task_path)
        except ImportError as exc:
            raise TaskResultDoesNotExist(
                f"{result_id}: its task {record.task_path!r} cannot be imported here ({exc})"
            ) from exc
        if isinstance(task, Task):
            task = _as_enqueued(task, record)
        status = TaskResultStatus(record.status)
        errors = list(record.errors)
        if status == TaskResultStatus.READY:
            message = (
                Message.objects.using(self.database)
                .filter(pk=record.message_id or 0)
                .values_list("state", "visible_at", "dead_reason")
                .first()
            )
            if message is None or message[0] == StoredState.DEAD:
                again = TaskRecord.objects.using(self.database).filter(id=result_id).first()
                if again is not None and again.status != TaskResultStatus.READY:
                    # A worker's outcome and the ack that deletes its message
                    # commit together: the row was read just before that
                    # commit and the message just after. The row has it now.
                    return self.get_result(result_id)
            if message is None:
                # Purged or deleted by an operator before any worker finished it.
                status = TaskResultStatus.FAILED
                errors.append(
                    {
                        "exception_class_path": "gateway.errors.NotFound",
                        "traceback": "the task's message was deleted before it ran",
                    }
                )
            elif message[0] == StoredState.DEAD and message[2] == "cancelled":
                # Cancelled (protocol 1.2, Cancel): waiting, or while it ran
                # (its worker's outcome was then refused: the lease was over).
                status = TaskResultStatus.FAILED
                errors.append(
                    {
                        "exception_class_path": CANCELLED_PATH,
                        "traceback": "the task was cancelled: its message was "
                        "dead-lettered with reason cancelled",
                    }
                )
            elif message[0] == StoredState.DEAD:
                # Dead-lettered without a worker's outcome (rejected by a
                # client, pushed out of a bounded queue): it will not run
                # unless an operator redrives it, which makes it READY again.
                status = TaskResultStatus.FAILED
                errors.append(
                    {
                        "exception_class_path": "gateway.errors.NotFound",
                        "traceback": "the task's message was dead-lettered "
                        f"({message[2] or 'no reason recorded'}) before it ran",
                    }
                )
            elif message[0] == StoredState.LEASED and message[1] > time.time():
                status = TaskResultStatus.RUNNING
        result = TaskResult(
            task=task,
            id=record.id,
            status=status,
            enqueued_at=to_datetime(record.enqueued_at),
            started_at=to_datetime(record.started_at),
            finished_at=to_datetime(record.finished_at),
            last_attempted_at=to_datetime(record.last_attempted_at),
            args=record.args,
            kwargs=record.kwargs,
            backend=record.backend,
            errors=[
                TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
                for e in errors
            ],
            worker_ids=list(record.worker_ids),
        )
        object.__setattr__(result, "_return_value", record.return_value)
        return result

    def check(self, **kwargs: Any) -> list[Any]:
        """Django's system checks: Leasecast must be installed for in-process enqueue."""
        from django.apps import apps
        from django.core import checks

        if apps.is_installed("gateway"):
            return []
        return [
            checks.Error(
                "LeasecastBackend needs 'gateway' in INSTALLED_APPS (its tables hold the queue "
                "and the results)",
                id="leasecast.E001",
            )
        ]
