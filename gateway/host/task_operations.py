"""Operator views of ``django.tasks`` results, and their retry, for the dashboard.

A task's stored ``status`` (``gateway.models.TaskRecord``) is what its last
worker recorded; its message says the rest, as
:meth:`gateway.tasks.LeasecastBackend.get_result` reads it: a READY task whose
message is leased is RUNNING, and one whose message is dead-lettered (rejected,
cancelled, pushed out of a bounded queue) or deleted will not run and is
FAILED. :func:`list_tasks` computes that status in the query itself, so a
filter on RUNNING or FAILED pages through the database, not through a page of
rows.

:func:`retry_task` runs a FAILED task again under the same result id, as its
backend enqueues it: a new message with the task's body, in one transaction
with the result's reset to READY (its errors and workers are kept: they are
the history of its attempts). A task whose message is still there, dead, gets
that message requeued instead.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from django.db.models import Case, CharField, Count, F, OuterRef, Q, Subquery, Value, When

from gateway.core.errors import Invalid, NotFound
from gateway.core.leases import StoredState, observed_state
from gateway.core.protocol import EnqueueSpec
from gateway.host.on_django import django_transaction
from gateway.models import Message, TaskRecord
from gateway.store import operator as store_operator
from gateway.store.enqueue import enqueue as store_enqueue

__all__ = [
    "STATUSES",
    "Retried",
    "TaskPage",
    "list_tasks",
    "retry_task",
    "tasks_of_messages",
]

#: The statuses a task is listed and filtered by (``django.tasks``' own).
STATUSES = ("READY", "RUNNING", "SUCCESSFUL", "FAILED")
#: Longest task-name filter taken (the column holds 400 characters).
MAX_FILTER = 400


@dataclass(frozen=True, slots=True)
class TaskPage:
    """One page of tasks, newest first, and how many match in all (per status)."""

    tasks: list[dict[str, Any]]
    total: int
    counts: dict[str, int]
    offset: int
    limit: int

    def as_json(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "total": self.total,
            "counts": self.counts,
            "offset": self.offset,
            "limit": self.limit,
        }


@dataclass(frozen=True, slots=True)
class Retried:
    """What :func:`retry_task` did: a new message, or the dead one requeued."""

    result_id: str
    queue: str
    message_id: int
    how: Literal["enqueued", "requeued"]

    def as_json(self) -> dict[str, Any]:
        return {
            "retried": 1,
            "id": self.result_id,
            "queue": self.queue,
            "message_id": self.message_id,
            "how": self.how,
        }


def _with_status(now: float) -> Any:
    """``TaskRecord`` rows annotated with their message's state and the effective status."""
    message = Message.objects.filter(pk=OuterRef("message_id"))
    return TaskRecord.objects.annotate(
        msg_state=Subquery(message.values("state")[:1]),
        msg_visible_at=Subquery(message.values("visible_at")[:1]),
        msg_deliveries=Subquery(message.values("deliveries")[:1]),
        msg_dead_reason=Subquery(message.values("dead_reason")[:1]),
    ).annotate(
        effective=Case(
            When(Q(status="READY") & Q(msg_state__isnull=True), then=Value("FAILED")),
            When(Q(status="READY") & Q(msg_state=StoredState.DEAD), then=Value("FAILED")),
            When(
                Q(status="READY") & Q(msg_state=StoredState.LEASED) & Q(msg_visible_at__gt=now),
                then=Value("RUNNING"),
            ),
            default=F("status"),
            output_field=CharField(),
        )
    )


def _check_filters(name: str, status: str, queue: str) -> None:
    if status and status not in STATUSES:
        raise Invalid(f"status must be one of {', '.join(STATUSES)}, got {status[:40]!r}")
    if len(name) > MAX_FILTER:
        raise Invalid(f"the task name filter takes at most {MAX_FILTER} characters")
    if len(queue) > 200:
        raise Invalid("the queue filter takes at most 200 characters")


def list_tasks(
    *, name: str = "", status: str = "", queue: str = "", offset: int = 0, limit: int = 50
) -> TaskPage:
    """A page of task results, newest first.

    Args:
        name: only tasks whose module path contains this (any case).
        status: only tasks of this effective status (one of :data:`STATUSES`).
        queue: only tasks of this queue (exact name).
        offset, limit: the page (``limit`` 1..200).

    Raises:
        Invalid: a status that is none of :data:`STATUSES`, a bad page.
    """
    _check_filters(name, status, queue)
    if not 1 <= limit <= 200:
        raise Invalid(f"limit must be 1..200, got {limit}")
    if offset < 0:
        raise Invalid("offset must be >= 0")
    now = time.time()
    where = Q()
    if name:
        where &= Q(task_path__icontains=name)
    if queue:
        where &= Q(queue=queue)
    # Counted in two parts: a finished result's status is final and needs no
    # look at its message, and finished results are nearly all of a week's.
    counts = {s: 0 for s in STATUSES}
    finished = TaskRecord.objects.filter(where).exclude(status="READY").order_by()
    for group in finished.values("status").annotate(n=Count("id")):
        counts[group["status"]] = counts.get(group["status"], 0) + group["n"]
    waiting = _with_status(now).filter(where, status="READY").order_by()
    for group in waiting.values("effective").annotate(n=Count("id")):
        counts[group["effective"]] = counts.get(group["effective"], 0) + group["n"]
    rows = _with_status(now).filter(where)
    if status == "READY":
        rows = rows.filter(status="READY", effective="READY")
    elif status == "SUCCESSFUL":
        rows = rows.filter(status=status)
    elif status:  # RUNNING or FAILED: stored so, or READY with its message leased or gone
        rows = rows.filter(Q(status=status) | Q(status="READY", effective=status))
    total = counts.get(status, 0) if status else sum(counts.values())
    page = rows.order_by("-enqueued_at", "id")[offset : offset + limit]
    return TaskPage([_as_json(r, now) for r in page], total, counts, offset, limit)


def _as_json(row: Any, now: float) -> dict[str, Any]:
    errors = list(row.errors or [])
    if row.status == "READY" and row.effective == "FAILED":
        # What get_result reports for a task that will not run (see the module docstring).
        why = (
            f"dead-lettered ({row.msg_dead_reason or 'no reason recorded'})"
            if row.msg_state is not None
            else "deleted"
        )
        errors.append(
            {
                "exception_class_path": "gateway.errors.NotFound",
                "traceback": f"the task's message was {why} before it ran",
            }
        )
    workers = list(row.worker_ids or [])
    attempts = max(len(workers), row.msg_deliveries or 0)
    started = row.started_at
    ended = row.finished_at
    runtime = None
    if started is not None:
        runtime = (ended if ended is not None else now) - started
    message_state = None
    if row.msg_state is not None:
        message_state = observed_state(StoredState(row.msg_state), row.msg_visible_at, now).value
    return {
        "id": row.id,
        "task": row.task_path,
        "queue": row.queue,
        "priority": row.priority,
        "status": row.effective,
        "stored_status": row.status,
        "args": row.args,
        "kwargs": row.kwargs,
        "attempts": attempts,
        "enqueued_at": row.enqueued_at,
        "run_after": row.run_after,
        "started_at": started,
        "finished_at": ended,
        "runtime": runtime,
        "return_value": row.return_value,
        "errors": errors,
        "worker": next((w for w in reversed(workers) if w), None),
        "worker_ids": workers,
        "message_id": row.message_id,
        "message_state": message_state,
        "dead_reason": row.msg_dead_reason,
    }


def retry_task(result_id: str) -> Retried:
    """Run a FAILED task again under the same result id (see the module docstring).

    Raises:
        NotFound: no such task result.
        Invalid: the task is not FAILED (it waits, runs or succeeded), or it
            changed while this ran (another operator retried it).
        QueueFull: its queue is bounded and full (nothing changed).
    """
    with django_transaction() as txn:
        record = _with_status(time.time()).filter(id=result_id).first()
        if record is None:
            raise NotFound(f"no task result {result_id[:80]!r}")
        if record.effective != "FAILED":
            raise Invalid(
                f"task {result_id} is {record.effective}: only a FAILED task can be retried"
            )
        if record.msg_state == StoredState.DEAD:
            # Its message is still there: requeued, it runs as it was enqueued.
            q = txn.queue(record.queue, create=True)
            if not store_operator.requeue_ids(txn, [record.message_id], q.id):
                raise Invalid(f"task {result_id} changed meanwhile: nothing was done")
            return Retried(result_id, record.queue, record.message_id, "requeued")
        # The body the backend enqueues (gateway.host.tasks.task_message). The
        # task is not imported here: the worker runs it by its own registry's
        # flag for ``takes_context``, whatever the message says.
        body = {
            "task": record.task_path,
            "id": record.id,
            "args": record.args,
            "kwargs": record.kwargs,
            "takes_context": False,
        }
        spec = EnqueueSpec(orjson.dumps(body), priority=record.priority)
        (enqueued,) = store_enqueue(txn, record.queue, [spec])
        new_id = int(enqueued.id)
        changed = TaskRecord.objects.filter(
            id=result_id, status=record.status, message_id=record.message_id
        ).update(status="READY", message_id=new_id, finished_at=None, run_after=None)
        if not changed:
            # Raising rolls the enqueue back with it.
            raise Invalid(f"task {result_id} changed meanwhile: nothing was done")
        return Retried(result_id, record.queue, new_id, "enqueued")


def tasks_of_messages(message_ids: Iterable[int]) -> dict[int, dict[str, str]]:
    """The task each of these messages carries: ``{message_id: {"id", "task"}}``.

    For the dashboard's worker rows (what each worker runs now); messages
    that carry no task are absent.
    """
    ids = sorted(set(message_ids))
    if not ids:
        return {}
    rows = TaskRecord.objects.filter(message_id__in=ids).values_list(
        "message_id", "id", "task_path"
    )
    return {mid: {"id": rid, "task": path} for mid, rid, path in rows if mid is not None}
