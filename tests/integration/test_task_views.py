"""``GET /api/tasks`` and ``POST /api/tasks/ID/retry`` (the dashboard's task view), on both stores.

Tasks are enqueued as a Django project does (``tests.tasksite``); a test's
own worker socket settles them. The browser side (filters, buttons,
confirmations, the audit) is ``tests/browser/test_dashboard_tasks.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.clients import Socket, ahttp, unique
from tests.support.gateways import GatewayProcess
from tests.support.task_results import enqueue_tasks, settle


async def tasks(gateway: GatewayProcess, token: str, **params: str) -> dict[str, Any]:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    status, doc = await ahttp("GET", f"{gateway.http}/api/tasks?{query}", token=token)
    assert status == 200, doc
    result: dict[str, Any] = doc
    return result


async def test_a_dead_lettered_task_is_failed_and_retry_requeues_its_message(
    gateway: GatewayProcess,
) -> None:
    token = gateway.issue_token("admin", name="task-views")
    queue = unique("jobs")
    rejected, done = enqueue_tasks(gateway, ("add", queue, [1, 1]), ("add", queue, [2, 2]))
    async with await Socket.open(f"{gateway.ws}/ws/queues/{queue}/?prefetch=2", token) as worker:
        first = {d["body"]["id"]: d for d in await worker.deliveries(2)}
        await worker.request({"op": "reject", "receipt": first[rejected]["receipt"]})
        await settle(worker, first[done], "SUCCESSFUL")

        # Rejected before any outcome: stored READY, but its message is dead, so FAILED.
        doc = await tasks(gateway, token, queue=queue)
        by_id = {t["id"]: t for t in doc["tasks"]}
        assert by_id[rejected]["status"] == "FAILED"
        assert by_id[rejected]["stored_status"] == "READY"
        assert by_id[rejected]["message_state"] == "dead"
        assert "dead-lettered (rejected)" in by_id[rejected]["errors"][-1]["traceback"]
        assert by_id[done]["status"] == "SUCCESSFUL"
        assert by_id[done]["return_value"] == {"sum": 4}
        assert doc["counts"] == {"READY": 0, "RUNNING": 0, "SUCCESSFUL": 1, "FAILED": 1}
        failed = await tasks(gateway, token, queue=queue, status="failed")
        assert [t["id"] for t in failed["tasks"]] == [rejected] and failed["total"] == 1

        # Retry: the dead message itself is requeued (same id), and a worker gets it.
        status, reply = await ahttp(
            "POST", f"{gateway.http}/api/tasks/{rejected}/retry", token=token
        )
        assert status == 200, reply
        assert reply["how"] == "requeued"
        assert reply["message_id"] == int(first[rejected]["id"])
        (again,) = await worker.deliveries(1)
        assert again["id"] == first[rejected]["id"] and again["body"]["id"] == rejected
        doc = await tasks(gateway, token, queue=queue, status="RUNNING")
        assert [t["id"] for t in doc["tasks"]] == [rejected]
        assert doc["tasks"][0]["held_by"]["socket"] is not None
        # Once is enough: a task that runs is not retried.
        status, reply = await ahttp(
            "POST", f"{gateway.http}/api/tasks/{rejected}/retry", token=token
        )
        assert status == 400 and reply["error"] == "invalid" and "RUNNING" in reply["detail"]


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("status=BOGUS", "status"),
        ("limit=0", "limit"),
        ("limit=abc", "limit"),
        ("offset=-1", "offset"),
        ("name=" + "x" * 401, "task name"),
    ],
)
async def test_bad_task_queries_are_invalid_and_name_the_problem(
    gateway: GatewayProcess, query: str, named: str
) -> None:
    token = gateway.issue_token("admin", name="task-views-bad")
    status, doc = await ahttp("GET", f"{gateway.http}/api/tasks?{query}", token=token)
    assert status == 400 and doc["error"] == "invalid" and named in doc["detail"], doc


async def test_task_endpoints_need_operator_rights_and_unknown_ones_are_json_404(
    gateway: GatewayProcess,
) -> None:
    worker = gateway.issue_token("consume:*", "enqueue:*", name="task-views-worker")
    admin = gateway.issue_token("admin", name="task-views-admin")
    status, doc = await ahttp("GET", f"{gateway.http}/api/tasks", token=worker)
    assert status == 403 and doc["error"] == "forbidden"
    status, doc = await ahttp("POST", f"{gateway.http}/api/tasks/abc/retry", token=worker)
    assert status == 403 and doc["error"] == "forbidden"
    status, doc = await ahttp("POST", f"{gateway.http}/api/tasks/nope/retry", token=admin)
    assert status == 404 and doc["error"] == "not_found"
    status, doc = await ahttp("GET", f"{gateway.http}/api/tasks/nope/retry", token=admin)
    assert status == 405 and doc["error"] == "invalid"
    status, doc = await ahttp("GET", f"{gateway.http}/api/tasks/x/y", token=admin)
    assert status == 404 and doc["error"] == "not_found"
    status, _ = await ahttp("GET", f"{gateway.http}/api/tasks")
    assert status == 401
