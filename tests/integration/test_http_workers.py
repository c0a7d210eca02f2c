"""HTTP workers (protocol 1.2: HTTP workers, pull), against real gateways, on SQLite
and PostgreSQL: lease, ack, nack, reject, extend over HTTP, long polling woken
from another process, the queue's rules, and bad input."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import Socket, ahttp, unique
from tests.support.gateways import GatewayProcess


async def _enqueue(gw: GatewayProcess, token: str, queue: str, *items: dict[str, Any]) -> list[str]:
    status, reply = await ahttp(
        "POST", f"{gw.http}/api/queues/{queue}/messages", token, {"messages": list(items)}
    )
    assert status == 200, reply
    return [r["id"] for r in reply["results"]]


async def _post(
    gw: GatewayProcess, token: str, queue: str, what: str, body: Any
) -> tuple[int, Any]:
    return await ahttp("POST", f"{gw.http}/api/queues/{queue}/{what}", token, body)  # type: ignore[no-any-return]


async def _lease(gw: GatewayProcess, token: str, queue: str, **asked: Any) -> list[dict[str, Any]]:
    status, reply = await _post(gw, token, queue, "lease", asked)
    assert status == 200, reply
    return reply["deliveries"]  # type: ignore[no-any-return]


async def _stats(gw: GatewayProcess, token: str, queue: str) -> dict[str, Any]:
    status, body = await ahttp("GET", f"{gw.http}/api/queues/{queue}", token)
    assert status == 200, body
    return body  # type: ignore[no-any-return]


async def test_lease_and_end_leases_over_http(gateway: GatewayProcess, admin_token: str) -> None:
    q = unique()
    token = gateway.issue_token(f"consume:{q}", name="http-worker")
    ids = await _enqueue(
        gateway,
        admin_token,
        q,
        {"body": {"n": 0}, "priority": 5},
        {"body": {"n": 1}},
        {"body": {"n": 2}},
        {"body": {"n": 3}},
        {"body": {"n": 4}},
    )
    got = await _lease(gateway, token, q, max=5, visibility_timeout=60)
    assert [d["id"] for d in got] == ids
    first = got[0]
    assert first["queue"] == q and first["body"] == {"n": 0} and first["deliveries"] == 1
    assert first["priority"] == 5 and "group" not in first and "op" not in first
    assert 0 < first["expires_in"] <= 60
    assert "priority" not in got[1]
    receipts = [d["receipt"] for d in got]

    status, reply = await _post(gateway, token, q, "ack", {"receipts": [receipts[0], receipts[0]]})
    assert (status, reply) == (200, {"acked": 1, "stale": []})
    status, reply = await _post(gateway, token, q, "ack", {"receipts": receipts[:2]})
    assert (status, reply) == (200, {"acked": 1, "stale": [receipts[0]]})
    status, reply = await _post(
        gateway, token, q, "extend", {"receipts": receipts[2:3], "timeout": 120}
    )
    assert status == 200 and reply["extended"] == 1 and reply["stale"] == [], reply
    assert reply["expires_in"] == 120  # as asked (the contract: "expires_in": S)
    status, reply = await _post(gateway, token, q, "reject", {"receipts": receipts[3:4]})
    assert (status, reply) == (200, {"rejected": 1, "stale": []})
    status, reply = await _post(gateway, token, q, "nack", {"receipts": receipts[4:], "delay": 0})
    assert (status, reply) == (200, {"nacked": 1, "stale": []})
    # The nacked message comes again, counted; the rejected one is dead.
    (again,) = await _lease(gateway, token, q, max=10)
    assert (again["id"], again["deliveries"]) == (ids[4], 2)
    stats = await _stats(gateway, admin_token, q)
    assert (stats["visible"], stats["in_flight"], stats["dead"]) == (0, 2, 1)
    # A cancel ends an HTTP lease too: its receipt is stale from then on.
    status, reply = await _post(gateway, admin_token, q, f"messages/{ids[4]}/cancel", None)
    assert (status, reply) == (200, {"cancelled": 1})
    status, reply = await _post(gateway, token, q, "ack", {"receipts": [again["receipt"]]})
    assert (status, reply) == (200, {"acked": 0, "stale": [again["receipt"]]})


async def test_receipts_have_one_holder(gateway: GatewayProcess, admin_token: str) -> None:
    """An HTTP receipt is ended over HTTP, a socket's on its socket: otherwise stale."""
    q = unique()
    await _enqueue(gateway, admin_token, q, {"body": "socket"}, {"body": "http"})
    async with await Socket.open(f"{gateway.ws}/ws/queues/{q}/?prefetch=1", admin_token) as w:
        (held,) = await w.deliveries(1)
        (leased,) = await _lease(gateway, admin_token, q)
        assert leased["body"] == "http"
        status, reply = await _post(gateway, admin_token, q, "ack", {"receipts": [held["receipt"]]})
        assert (status, reply) == (200, {"acked": 0, "stale": [held["receipt"]]})
        reply = await w.request({"op": "ack", "receipt": leased["receipt"]})
        assert reply.get("code") == "stale_receipt", reply
        assert (await w.request({"op": "ack", "receipt": held["receipt"]}))["op"] == "acked"
    # A request to another queue does not end this queue's lease.
    other = unique()
    status, reply = await _post(
        gateway, admin_token, other, "ack", {"receipts": [leased["receipt"]]}
    )
    assert (status, reply) == (200, {"acked": 0, "stale": [leased["receipt"]]})
    status, reply = await _post(gateway, admin_token, q, "ack", {"receipts": [leased["receipt"]]})
    assert (status, reply) == (200, {"acked": 1, "stale": []})


async def test_http_lease_keeps_groups_and_max_deliveries(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    status, body = await ahttp(
        "PATCH", f"{gateway.http}/api/queues/{q}", admin_token, {"max_deliveries": 1}
    )
    assert status == 200, body
    a, b, c = await _enqueue(
        gateway,
        admin_token,
        q,
        {"body": "a", "group": "g"},
        {"body": "b", "group": "g"},
        {"body": "c"},
    )
    got = await _lease(gateway, admin_token, q, max=10)
    assert [d["id"] for d in got] == [a, c]  # b waits for a, its group's head
    assert got[0]["group"] == "g"
    assert await _lease(gateway, admin_token, q, max=10) == []
    status, reply = await _post(gateway, admin_token, q, "nack", {"receipts": [got[0]["receipt"]]})
    assert reply == {"nacked": 1, "stale": []}
    # a's second delivery would exceed max_deliveries: dead instead; b goes next.
    (nxt,) = await _lease(gateway, admin_token, q, max=10)
    assert nxt["id"] == b
    status, page = await ahttp(
        "GET", f"{gateway.http}/api/queues/{q}/messages?state=dead", admin_token
    )
    assert [(m["id"], m["dead_reason"]) for m in page["messages"]] == [(a, "max_deliveries")]


async def test_long_poll_answers_empty_after_wait(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    assert await _lease(gateway, admin_token, q, wait=0.5) == []
    assert await _lease(gateway, admin_token, q) == []  # wait 0: at once


ENQUEUE_ELSEWHERE = """
import gateway
print("ENQUEUED", gateway.enqueue({queue!r}, "woken").id)
"""


async def test_long_poll_woken_by_an_enqueue_in_another_process(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """The lease waits on the gateway; a Django process of its own enqueues on its
    own connection (gateway.enqueue). Without the wake-up it would answer [] at 20 s."""
    q = unique()
    polling = asyncio.create_task(_lease(gateway, admin_token, q, wait=20, max=3))
    await asyncio.sleep(1.0)  # the request is waiting (not asserted: nothing to see yet)
    assert not polling.done()
    out = await asyncio.to_thread(gateway.manage, "shell", "-c", ENQUEUE_ELSEWHERE.format(queue=q))
    assert "ENQUEUED" in out, out
    got = await polling
    assert [d["body"] for d in got] == ["woken"]


@pytest.fixture
def pair(postgres_env: tuple[dict[str, str], Path]) -> Iterator[tuple[GatewayProcess, ...]]:
    env, var = postgres_env
    a, b = GatewayProcess(env, var, name="pull-a"), GatewayProcess(env, var, name="pull-b")
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


async def test_long_poll_on_one_gateway_woken_by_an_enqueue_on_another(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    a, b = pair
    token = a.issue_token("admin", name="pull-pair")
    q = unique()
    polling = asyncio.create_task(_lease(b, token, q, wait=20))
    await asyncio.sleep(1.0)
    assert not polling.done()
    await _enqueue(a, token, q, {"body": "from a"})
    got = await polling
    assert [d["body"] for d in got] == ["from a"]
    _, reply = await _post(a, token, q, "ack", {"receipts": [got[0]["receipt"]]})
    assert reply == {"acked": 1, "stale": []}  # an HTTP receipt is good on any process


BAD_LEASES = [
    {"max": 0},
    {"max": 101},
    {"max": "1"},
    {"max": 1.5},
    {"wait": 21},
    {"wait": -1},
    {"wait": "5"},
    {"visibility_timeout": 0},
    {"visibility_timeout": 50000},
    {"max": 1, "waitt": 5},
]

BAD_ENDS = [
    ("ack", {}),
    ("ack", {"receipts": []}),
    ("ack", {"receipts": "1.a"}),
    ("ack", {"receipts": ["not a receipt"]}),
    ("ack", {"receipts": ["h1.ff"]}),
    ("ack", {"receipts": [7]}),
    ("ack", {"receipts": ["h00000000.1.ff"] * 1001}),
    ("ack", {"receipts": ["h00000000.1.ff"], "delay": 1}),
    ("nack", {"receipts": ["h00000000.1.ff"], "delay": -1}),
    ("reject", {"receipts": ["h00000000.1.ff"], "reason": "x"}),
    ("extend", {"receipts": ["h00000000.1.ff"]}),
    ("extend", {"receipts": ["h00000000.1.ff"], "timeout": 0}),
]


async def test_bad_input_is_invalid_and_changes_nothing(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique()
    await _enqueue(gateway, admin_token, q, {"body": "stays"})
    for body in BAD_LEASES:
        status, reply = await _post(gateway, admin_token, q, "lease", body)
        assert (status, reply["error"]) == (400, "invalid"), (body, reply)
    status, reply = await _post(gateway, admin_token, q, "lease", {"max": 1, "waitt": 5})
    assert "'waitt'" in reply["detail"] and "wait" in reply["detail"].split("known")[1]
    for what, body in BAD_ENDS:
        status, reply = await _post(gateway, admin_token, q, what, body)
        assert (status, reply["error"]) == (400, "invalid"), (what, body, reply)
    status, reply = await _post(gateway, admin_token, q, "lease", None)  # no body: defaults
    assert status == 200 and len(reply["deliveries"]) == 1
    receipt = reply["deliveries"][0]["receipt"]
    # Refusals: no consume scope (403), a GET (405), a bad queue name (400).
    producer = gateway.issue_token(f"enqueue:{q}", name="no-consume")
    assert (await _post(gateway, producer, q, "lease", {}))[0] == 403
    assert (await _post(gateway, producer, q, "ack", {"receipts": [receipt]}))[0] == 403
    assert (await ahttp("GET", f"{gateway.http}/api/queues/{q}/lease", admin_token))[0] == 405
    assert (await _post(gateway, admin_token, "bad%21name", "lease", {}))[0] in (400, 404)
    stats = await _stats(gateway, admin_token, q)
    assert (stats["visible"], stats["in_flight"], stats["dead"]) == (0, 1, 0)
    status, reply = await _post(gateway, admin_token, q, "ack", {"receipts": [receipt]})
    assert reply == {"acked": 1, "stale": []}
