"""The echo limit of an ASGI server for Leasecast's v1 work-queue frames.

A bare ASGI application (no Django, no Channels, no store) that answers the
same frames as the gateway, with replies of the same shapes and sizes, so the
same client code (``bench.workqueue.LeasecastTarget``) drives it and each
cycle costs the server exactly five WebSocket frames, as a gateway cycle does:

- ``/ws/produce/``: ``enqueue`` is answered ``{"op":"enqueued","id":..,"duplicate":false}``
  and its body goes out as a ``deliver`` frame to a worker socket of that queue;
- ``/ws/queues/Q/?prefetch=N``: a worker socket; it is sent at most ``N``
  unacked deliveries (the rest wait in memory, in order), ``ack`` is answered
  ``{"op":"acked"}`` and frees a slot;
- ``GET /healthz``: 200 (the harness waits for it).

Nothing is stored and nothing is checked beyond what routing needs: the
time a server spends here is the floor of what any application pays it per
frame. Served by the same commands as the gateway (``bench/efficiency.py``):
``python -m gateway.serve ... bench.echo_app:application`` (daphne) or
``uvicorn bench.echo_app:application ...``.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

import orjson

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_ids = itertools.count(1)


class _Worker:
    """One worker socket: how to send to it and how many more it may hold."""

    def __init__(self, send: Send, prefetch: int) -> None:
        self.send = send
        self.credit = prefetch


class _Queue:
    """Deliveries waiting for credit, and the worker sockets (served in turn)."""

    def __init__(self) -> None:
        self.waiting: deque[bytes] = deque()
        self.workers: deque[_Worker] = deque()

    async def offer(self, frame: bytes) -> None:
        """Send ``frame`` to the next worker with credit, or keep it in order."""
        for _ in range(len(self.workers)):
            worker = self.workers[0]
            self.workers.rotate(-1)
            if worker.credit > 0 and not self.waiting:
                worker.credit -= 1
                await worker.send({"type": "websocket.send", "text": frame.decode()})
                return
        self.waiting.append(frame)

    async def refill(self, worker: _Worker) -> None:
        """Give ``worker`` what waits, up to its credit."""
        while worker.credit > 0 and self.waiting:
            worker.credit -= 1
            frame = self.waiting.popleft()
            await worker.send({"type": "websocket.send", "text": frame.decode()})


queues: dict[str, _Queue] = {}


def _deliver_frame(queue: str, body: Any) -> bytes:
    """A ``deliver`` frame shaped like the gateway's (the receipt is as long)."""
    number = next(_ids)
    return orjson.dumps(
        {
            "op": "deliver",
            "queue": queue,
            "id": str(number),
            "receipt": f"{number}.{number:016x}",
            "body": body,
            "deliveries": 1,
            "expires_in": 30.0,
        }
    )


async def _producer(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] != "websocket.receive":
            return
        frame = orjson.loads(message.get("text") or message.get("bytes") or b"{}")
        name = frame["queue"]
        number = next(_ids)
        await send(
            {
                "type": "websocket.send",
                "text": f'{{"op":"enqueued","id":"{number}","duplicate":false}}',
            }
        )
        await queues.setdefault(name, _Queue()).offer(_deliver_frame(name, frame.get("body")))


async def _worker(scope: Scope, receive: Receive, send: Send, name: str) -> None:
    query = parse_qs(scope.get("query_string", b"").decode())
    worker = _Worker(send, int(query.get("prefetch", ["10"])[0]))
    queue = queues.setdefault(name, _Queue())
    queue.workers.append(worker)
    try:
        await queue.refill(worker)
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":
                return
            # Every frame a worker sends in this benchmark is an ack.
            worker.credit += 1
            await send({"type": "websocket.send", "text": '{"op":"acked"}'})
            await queue.refill(worker)
    finally:
        queue.workers.remove(worker)


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    """The ASGI entry point (HTTP for ``/healthz``, WebSocket for the frames)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] == "http":
        status = 200 if scope["path"] == "/healthz" else 404
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    path: str = scope["path"]
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    if path.startswith("/ws/queues/"):
        await _worker(scope, receive, send, path.split("/")[3])
    else:
        await _producer(receive, send)
