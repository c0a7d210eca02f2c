"""Enqueue tasks and read their results, in a process of its own (JSON lines on stdin/stdout).

``python -m tests.tasksite.driver`` with ``DJANGO_SETTINGS_MODULE=tests.tasksite.settings``
and the gateway's database in the environment. Requests, one JSON object a line:

- ``{"op": "enqueue", "task": PATH, "queue": Q, "priority"?: P, "args"?: [...],
  "kwargs"?: {...}}`` -> ``{"id": RESULT_ID}``
- ``{"op": "cancel", "id": RESULT_ID}`` -> ``{"cancelled": true|false}``
  (``gateway.tasks.cancel``)
- ``{"op": "result", "id": RESULT_ID}`` -> ``{"status", "return_value", "errors":
  [{"exception_class_path", "traceback"}, ...], "attempts", "worker_ids"}``

A request that fails answers ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import django


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    from django.utils.module_loading import import_string

    from tests.tasksite.tasks import task_backend

    if request["op"] == "enqueue":
        task = import_string(request["task"]).using(
            queue_name=request["queue"], priority=request.get("priority", 0)
        )
        result = task.enqueue(*request.get("args", []), **request.get("kwargs", {}))
        return {"id": result.id}
    if request["op"] == "result":
        result = task_backend().get_result(request["id"])
        status = str(result.status.value)
        return {
            "status": status,
            "return_value": result._return_value if status == "SUCCESSFUL" else None,
            "errors": [
                {"exception_class_path": e.exception_class_path, "traceback": e.traceback}
                for e in result.errors
            ],
            "attempts": result.attempts,
            "worker_ids": list(result.worker_ids),
        }
    if request["op"] == "cancel":
        from gateway.tasks import cancel

        return {"cancelled": cancel(request["id"])}
    raise ValueError(f"unknown op {request['op']!r}")


def main() -> None:
    django.setup()
    for line in sys.stdin:
        try:
            reply = _answer(json.loads(line))
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
