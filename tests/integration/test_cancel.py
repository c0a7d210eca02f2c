"""Cancel (protocol 1.2: Cancel), against real gateways, on SQLite and PostgreSQL.

A cancelled message is dead-lettered with reason ``cancelled`` whatever its
state; an in-flight one's lease ends (its receipt is stale) and the worker
socket holding it is sent a ``cancel`` frame, also when that socket is on
another process than the one that cancelled it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from leasecast import Worker
from leasecast.errors import StaleReceipt

from tests.support.clients import Socket, ahttp, unique
from tests.support.gateways import GatewayProcess
from tests.support.sessions import (
    PASSWORD,
    StaffSession,
    admin_log,
    logged,
    notices,
)


async def _enqueue(
    gw: GatewayProcess, token: str, queue: str, *items: dict[str, object]
) -> list[str]:
    status, reply = await ahttp(
        "POST", f"{gw.http}/api/queues/{queue}/messages", token, {"messages": list(items)}
    )
    assert status == 200, reply
    return [r["id"] for r in reply["results"]]


async def _cancel(gw: GatewayProcess, token: str, queue: str, msg_id: str) -> tuple[int, object]:
    return await ahttp(  # type: ignore[no-any-return]
        "POST", f"{gw.http}/api/queues/{queue}/messages/{msg_id}/cancel", token
    )


async def _dead(gw: GatewayProcess, token: str, queue: str) -> dict[str, str | None]:
    status, page = await ahttp("GET", f"{gw.http}/api/queues/{queue}/messages?state=dead", token)
    assert status == 200, page
    return {m["id"]: m["dead_reason"] for m in page["messages"]}


async def test_cancel_in_each_state_and_refusals(gateway: GatewayProcess, admin_token: str) -> None:
    q, other = unique(), unique()
    ready, delayed, grouped, follower = await _enqueue(
        gateway,
        admin_token,
        q,
        {"body": "ready"},
        {"body": "later", "delay": 600},
        {"body": "head", "group": "g"},
        {"body": "next", "group": "g"},
    )
    (elsewhere,) = await _enqueue(gateway, admin_token, other, {"body": "other queue"})
    enqueuer = gateway.issue_token(f"enqueue:{q}", name="canceller")
    consumer = gateway.issue_token(f"consume:{q}", name="only-consume")

    # Refusals first: nothing may change.
    assert (await _cancel(gateway, consumer, q, ready))[0] == 403
    status, body = await _cancel(gateway, admin_token, q, elsewhere)  # another queue's id
    assert (status, body["error"]) == (404, "not_found")  # type: ignore[index]
    status, body = await _cancel(gateway, admin_token, q, "x1")
    assert (status, body["error"]) == (400, "invalid")  # type: ignore[index]
    status, body = await ahttp(
        "GET", f"{gateway.http}/api/queues/{q}/messages/{ready}/cancel", admin_token
    )
    assert status == 405, body
    assert await _dead(gateway, admin_token, q) == {}
    assert await _dead(gateway, admin_token, other) == {}

    # Ready, delayed, a group's head: dead at once, reason cancelled.
    for msg_id in (ready, delayed, grouped):
        assert await _cancel(gateway, enqueuer, q, msg_id) == (200, {"cancelled": 1})
    assert await _dead(gateway, admin_token, q) == {
        ready: "cancelled",
        delayed: "cancelled",
        grouped: "cancelled",
    }
    # Already dead: 0, and still dead; the group's next message is its head now.
    assert await _cancel(gateway, admin_token, q, ready) == (200, {"cancelled": 0})
    async with await Socket.open(f"{gateway.ws}/ws/queues/{q}/?prefetch=5", admin_token) as w:
        (got,) = await w.deliveries(1)
        assert (got["id"], got["body"]) == (follower, "next")
        await w.quiet(0.3)  # nothing else visible: the cancelled ones stay dead
        assert (await w.request({"op": "ack", "receipt": got["receipt"]}))["op"] == "acked"
    # Acked: gone, 404.
    status, body = await _cancel(gateway, admin_token, q, follower)
    assert (status, body["error"]) == (404, "not_found")  # type: ignore[index]
    # A cancelled message is redriven like any dead message.
    status, body = await ahttp("POST", f"{gateway.http}/api/queues/{q}/redrive", admin_token)
    assert (status, body) == (200, {"redriven": 3})


async def _held_message_is_cancelled(
    holder: GatewayProcess, cancel: object, token: str, q: str
) -> None:
    """A worker on ``holder`` holds a message; ``cancel(msg_id)`` cancels it elsewhere."""
    first, second = await _enqueue(holder, token, q, {"body": 1}, {"body": 2})
    async with await Socket.open(f"{holder.ws}/ws/queues/{q}/?prefetch=1", token) as w:
        (got,) = await w.deliveries(1)
        assert got["id"] == first
        await w.quiet(0.3)  # prefetch 1: the second waits
        await cancel(first)  # type: ignore[operator]
        told = await w.next()
        assert told == {"op": "cancel", "queue": q, "id": first, "receipt": got["receipt"]}
        # The lease is over: its room is free (the second comes) and its receipt stale.
        (nxt,) = await w.deliveries(1)
        assert nxt["id"] == second
        for frame in (
            {"op": "ack", "receipt": got["receipt"]},
            {"op": "nack", "receipt": got["receipt"]},
            {"op": "reject", "receipt": got["receipt"]},
            {"op": "extend", "receipt": got["receipt"], "timeout": 30},
        ):
            reply = await w.request(frame)
            assert (reply["op"], reply["code"]) == ("error", "stale_receipt"), reply
        assert (await w.request({"op": "ack", "receipt": nxt["receipt"]}))["op"] == "acked"
    assert await _dead(holder, token, q) == {first: "cancelled"}


ADMIN_CANCEL = """
from dashboard.cancel import cancel
from gateway.models import Message
print("CANCELLED", cancel(Message.objects.filter(pk={pk})))
"""


async def test_in_flight_cancel_from_another_process_reaches_the_socket(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """The admin's cancel runs in a process of its own (``manage.py shell``) on
    Django's connection: the socket on the gateway is told all the same."""
    q = unique()

    async def cancel(msg_id: str) -> None:
        code = ADMIN_CANCEL.format(pk=int(msg_id))
        out = await asyncio.to_thread(gateway.manage, "shell", "-c", code)
        assert "CANCELLED 1" in out, out

    await _held_message_is_cancelled(gateway, cancel, admin_token, q)


@pytest.fixture
def pair(postgres_env: tuple[dict[str, str], Path]) -> Iterator[tuple[GatewayProcess, ...]]:
    env, var = postgres_env
    a, b = GatewayProcess(env, var, name="cancel-a"), GatewayProcess(env, var, name="cancel-b")
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


async def test_http_cancel_reaches_the_socket_on_another_gateway(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    """PostgreSQL (several gateway processes share it): cancelled on A, held on B."""
    a, b = pair
    token = a.issue_token("admin", name="pair")
    q = unique()

    async def cancel(msg_id: str) -> None:
        assert await _cancel(a, token, q, msg_id) == (200, {"cancelled": 1})

    await _held_message_is_cancelled(b, cancel, token, q)


async def test_python_worker_sees_cancel_while_busy(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """leasecast.Worker: ``delivery.cancelled`` is set and ``on_cancel`` called while
    the handler is still busy with the delivery (it is not reading the socket)."""
    q = unique()
    (msg_id,) = await _enqueue(gateway, admin_token, q, {"body": json.dumps({"slow": True})})
    seen: list[str] = []

    async def on_cancel(delivery: object) -> None:
        seen.append(delivery.id)  # type: ignore[attr-defined]

    async with Worker(gateway.http, q, token=admin_token, prefetch=2, on_cancel=on_cancel) as w:
        async for delivery in w:
            assert delivery.id == msg_id and not delivery.cancelled.is_set()
            assert await _cancel(gateway, admin_token, q, msg_id) == (200, {"cancelled": 1})
            # Still inside the handler: the frame is read without the iterator.
            await asyncio.wait_for(delivery.cancelled.wait(), 10)
            with pytest.raises(StaleReceipt):
                await delivery.ack()
            break
    assert seen == [msg_id]
    assert w.cancels == 1


async def test_admin_action_cancels_and_tells_the_socket(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """The admin's "Cancel" action: the held message's socket is told, a ready one
    is dead-lettered too, and both are in the admin log."""
    gateway.manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User;"
        f"User.objects.create_superuser('canceller', 'c@example.com', {PASSWORD!r})",
    )
    staff = StaffSession(gateway.http)
    await asyncio.to_thread(staff.login, "canceller", PASSWORD)
    q = unique()
    held_id, ready_id = await _enqueue(gateway, admin_token, q, {"body": 1}, {"body": 2})
    async with await Socket.open(f"{gateway.ws}/ws/queues/{q}/?prefetch=1", admin_token) as w:
        (held,) = await w.deliveries(1)
        assert held["id"] == held_id
        page = await asyncio.to_thread(
            staff.action, "message", "cancel_messages", [held_id, ready_id]
        )
        assert "Cancelled 2 messages." in notices(page), notices(page)
        told = await w.next()
        assert told == {"op": "cancel", "queue": q, "id": held_id, "receipt": held["receipt"]}
        await w.quiet(0.3)  # nothing else: the ready message is dead too
    assert await _dead(gateway, admin_token, q) == {held_id: "cancelled", ready_id: "cancelled"}
    entries = await asyncio.to_thread(admin_log, gateway)
    for msg_id in (held_id, ready_id):
        assert [e["message"] for e in logged(entries, "message", msg_id)] == [
            "Cancelled (dead-lettered, its lease ended)."
        ]
