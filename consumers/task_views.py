"""Task results over HTTP (an extension for operators: the dashboard's task view).

``GET /api/tasks`` lists ``django.tasks`` results (``gateway.models.TaskRecord``)
newest first, with their effective status (a READY task whose message is
leased is RUNNING, one whose message is dead or deleted is FAILED), filtered by
``name`` (part of the task's module path), ``status`` and ``queue``, paged by
``offset`` and ``limit``. Reading needs ``gateway.view_queue`` (or the
``admin`` scope).

``POST /api/tasks/ID/retry`` runs a FAILED task again under the same result
id (``gateway.host.task_operations.retry_task``); it needs
``gateway.change_queue`` and is recorded in Django's admin log.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse

from consumers.http import _audit, _json, _query_int, api
from dashboard.live import Exchange
from gateway.core.errors import Invalid
from gateway.core.scopes import Principal
from gateway.host.task_operations import list_tasks, retry_task
from gateway.runtime import current_runtime

__all__ = ["task_list", "task_retry"]


def _holders() -> dict[int, dict[str, Any]]:
    """Which worker socket, on which process, holds each leased message now."""
    try:
        exchange = current_runtime().part(Exchange)
    except LookupError:  # a process without the dashboard's exchange: no holders known
        return {}
    found: dict[int, dict[str, Any]] = {}
    # Described now (not the sampler's snapshot of up to a second ago): a task
    # leased a moment ago shows its holder. Other processes' are their latest.
    for process in exchange.processes():
        for socket in process.get("sockets", ()):
            for message_id in socket.get("running", ()):
                found[message_id] = {
                    "process": process["name"],
                    "socket": socket["id"],
                    "client": socket.get("client"),
                }
    return found


@api("GET")
async def task_list(request: HttpRequest, principal: Principal) -> HttpResponse:
    """``{"tasks": [...], "total", "counts": {STATUS: n}, "offset", "limit"}``."""
    principal.require("view_queue")
    offset = _query_int(request, "offset", 0)
    limit = _query_int(request, "limit", 50)
    assert offset is not None and limit is not None
    if not 0 <= offset < 2**31:
        raise Invalid(f"offset must be 0..{2**31 - 1}, got {offset}")
    page = await database_sync_to_async(list_tasks)(
        name=request.GET.get("name", "").strip(),
        status=request.GET.get("status", "").strip().upper(),
        queue=request.GET.get("queue", "").strip(),
        offset=offset,
        limit=limit,
    )
    holders = _holders()
    document = page.as_json()
    for task in document["tasks"]:
        task["held_by"] = holders.get(task["message_id"]) if task["status"] == "RUNNING" else None
    return _json(document)


@api("POST")
async def task_retry(request: HttpRequest, principal: Principal, result_id: str) -> HttpResponse:
    """Run a FAILED task again: 200 ``{"retried": 1, "id", "queue", "message_id", "how"}``."""
    principal.require("change_queue")
    if not 1 <= len(result_id) <= 64:
        raise Invalid("a task result id is 1-64 characters")
    retried = await database_sync_to_async(retry_task)(result_id)
    await _audit(
        principal,
        retried.queue,
        f"Retried task {result_id} ({retried.how} message {retried.message_id}).",
    )
    return _json(retried.as_json())
