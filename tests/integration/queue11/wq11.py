"""Helpers of the work queue 1.1 tests (groups, priority, ttl, bounded queues, browsing).

Everything here speaks the wire contract (docs/protocol.md, "Work queue
1.1") to a real gateway: sockets and HTTP only, no store internals.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from tests.support.clients import Socket, ahttp
from tests.support.gateways import GatewayProcess

#: The gateway's ``GATEWAY_BLOCK_WAIT`` (seconds) in these tests: short.
BLOCK_WAIT = 3.0
#: Queue names a deployment's narrow tokens may use (``unique(NARROW)``).
NARROW = "narrow-"


@dataclass
class Deployment:
    """One running gateway on a migrated database, with its tokens (conftest.py starts it)."""

    gateway: GatewayProcess
    env: dict[str, str]
    var: Path
    admin: str  #: scope ``admin``
    consumer: str  #: ``consume:narrow-*`` and ``enqueue:narrow-*``
    producer: str  #: ``enqueue:narrow-*`` only


#: Every field of a browsed message (docs/protocol.md, Work queue 1.1: browsing).
BROWSE_FIELDS = {
    "id",
    "state",
    "body",
    "deliveries",
    "enqueued_at",
    "group",
    "priority",
    "dead_reason",
    "visible_in",
    "visible_at",
}


async def worker(gw: GatewayProcess, token: str, queue: str, **params: object) -> Socket:
    """A worker socket on ``queue`` with query parameters ``params``."""
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return await Socket.open(f"{gw.ws}/ws/queues/{queue}/?{query}", token)


async def producer(gw: GatewayProcess, token: str) -> Socket:
    return await Socket.open(f"{gw.ws}/ws/produce/", token)


async def enqueue(s: Socket, queue: str, body: object, **extra: object) -> dict[str, Any]:
    """An ``enqueue`` that must succeed; returns the ``enqueued`` reply."""
    reply = await s.request({"op": "enqueue", "queue": queue, "body": body, **extra})
    assert reply["op"] == "enqueued", reply
    return reply


async def ack(w: Socket, d: dict[str, Any]) -> None:
    reply = await w.request({"op": "ack", "receipt": d["receipt"]})
    assert reply["op"] == "acked", reply


async def error_code(s: Socket, frame: dict[str, Any]) -> str:
    """The ``code`` of the error ``frame`` must get."""
    reply = await s.request(frame)
    assert reply["op"] == "error", (frame, reply)
    assert reply["detail"], reply
    return str(reply["code"])


async def stats(gw: GatewayProcess, token: str, queue: str) -> dict[str, Any]:
    status, body = await ahttp("GET", f"{gw.http}/api/queues/{queue}", token)
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def counts(s: dict[str, Any]) -> tuple[int, int, int, int]:
    """(visible, delayed, in_flight, dead) of a queue document."""
    return s["visible"], s["delayed"], s["in_flight"], s["dead"]


async def patch(gw: GatewayProcess, token: str, queue: str, **settings: object) -> dict[str, Any]:
    """``PATCH /api/queues/QUEUE`` that must succeed; returns the queue document."""
    status, body = await ahttp("PATCH", f"{gw.http}/api/queues/{queue}", token, settings)
    assert status == 200, body
    return body  # type: ignore[no-any-return]


async def browse(
    gw: GatewayProcess, token: str, queue: str, **query: object
) -> tuple[int, dict[str, Any]]:
    """``GET /api/queues/QUEUE/messages?...``: (status, body)."""
    qs = urlencode({k: v for k, v in query.items() if v is not None})
    status, body = await ahttp("GET", f"{gw.http}/api/queues/{queue}/messages?{qs}", token)
    return status, body


async def browse_all(
    gw: GatewayProcess, token: str, queue: str, state: str = "visible", limit: int = 1000
) -> list[dict[str, Any]]:
    """Every message of ``queue`` in ``state``, page after page, in delivery order."""
    got: list[dict[str, Any]] = []
    after = None
    for _ in range(10_000):
        status, page = await browse(gw, token, queue, state=state, limit=limit, after=after)
        assert status == 200, page
        for m in page["messages"]:
            assert set(m) >= BROWSE_FIELDS, m
            assert m["state"] == state, m
        got += page["messages"]
        after = page["next"]
        if after is None:
            return got
    raise AssertionError("paging never ended")


async def first_frame(*sockets: Socket, timeout: float = 10) -> tuple[Socket, dict[str, Any]]:
    """The first unsolicited frame on any of ``sockets``, and which one got it."""
    tasks = {asyncio.ensure_future(s.next(timeout)): s for s in sockets}
    done, pending = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    assert done, "no frame arrived"
    assert len(done) == 1, [t.result() for t in done]  # one frame was expected, not several
    task = done.pop()
    return tasks[task], task.result()
