"""Task results for tests of the operator views: tasks enqueued as a Django project does.

:func:`enqueue_tasks` runs ``manage.py shell`` with ``tests.tasksite.settings``
(TASKS on ``gateway.tasks.LeasecastBackend``) against a gateway's database;
:func:`settle` acks a task's delivery with its outcome, as ``leasecast_worker``
does, so a test's own worker socket can make results of every status.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.support.clients import Socket
from tests.support.databases import manage
from tests.support.gateways import GatewayProcess

__all__ = ["WORKER_ID", "enqueue_tasks", "settle"]

#: The worker id :func:`settle` records with each outcome.
WORKER_ID = "worker-host:4242"


def enqueue_tasks(site: GatewayProcess, *calls: tuple[str, str, list[Any]]) -> list[str]:
    """Enqueue ``(task, queue, args)`` of ``tests.tasksite.tasks``; their result ids, in order."""
    lines = [
        "import json",
        "from tests.tasksite import tasks",
        "ids = []",
        *(
            f"ids.append(tasks.{name}.using(queue_name={queue!r}).enqueue(*{args!r}).id)"
            for name, queue, args in calls
        ),
        "print(json.dumps(ids))",
    ]
    env = {**site.env, "DJANGO_SETTINGS_MODULE": "tests.tasksite.settings"}
    out = manage(env, "shell", "-c", "\n".join(lines))
    ids: list[str] = json.loads(out.strip().splitlines()[-1])
    return ids


async def settle(worker: Socket, delivery: dict[str, Any], status: str) -> None:
    """Ack a task's delivery with a SUCCESSFUL (the sum of its two arguments) or
    FAILED (a ``ValueError`` whose message is markup) outcome."""
    task: dict[str, Any] = {
        "id": delivery["body"]["id"],
        "status": status,
        "worker_id": WORKER_ID,
        "started_at": time.time() - 1,
    }
    if status == "FAILED":
        task["error"] = {
            "exception_class_path": "builtins.ValueError",
            "traceback": "Traceback (most recent call last):\nValueError: <b>boom</b>",
        }
    else:
        args = delivery["body"]["args"]
        task["return_value"] = {"sum": args[0] + args[1]}
    await worker.request({"op": "ack", "receipt": delivery["receipt"], "task": task})
