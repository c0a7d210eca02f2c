"""A fake gateway for the Python client's unit tests: enough of the protocol, in memory.

:class:`FakeGateway` is a tiny in-memory gateway (one ``websockets`` server on
127.0.0.1, port 0): worker sockets with leases, the produce socket, bearer
tokens, refusals (HTTP 403, close 4403/4400) and switches to drop sockets,
refuse handshakes and delay replies; the batch extensions (``batch``
deliveries, ``ack_many``, ``enqueue_many``), ``refresh`` of signed tokens and
``backpressure`` with ``retry_after``. The worker, producer, subscriber and
CLI tests of the client use it; the gateway itself is tested for real in
tests/integration.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from leasecast import Delivery, Worker
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed as WsConnectionClosed
from websockets.http11 import Request, Response

from gateway.core.errors import (
    BadFrame,
    Forbidden,
    Invalid,
    ProtocolError,
    StaleReceipt,
    UnknownOp,
)

TOKEN = "lc_test"


@dataclass
class Msg:
    """A stored message of the fake gateway."""

    seq: int
    queue: str
    body: Any
    deliveries: int = 0
    visible_at: float = 0.0
    group: str | None = None
    priority: int = 0
    ttl: float | None = None


class FakeGateway:
    """Enough of docs/protocol.md, in memory, to exercise the client over real sockets.

    Args:
        batch_op: whether ``enqueue_many`` is known (False: a v1-only gateway).
    """

    def __init__(self, *, batch_op: bool = True) -> None:
        self.batch_op = batch_op
        self.token = TOKEN
        #: names the token may not use: a worker socket on one is refused with
        #: an error frame and close 4403; an enqueue to one is ``forbidden``
        self.forbidden: set[str] = {"secret"}
        #: answer this many next handshakes with HTTP ``refuse_status``
        self.refuse_handshakes = 0
        self.refuse_status = 503
        #: seconds to wait before answering a given op (answers then overtake)
        self.reply_delays: dict[str, float] = {}
        #: abort the connection (no close frame) on a frame this says yes to
        self.drop_on: Callable[[dict[str, Any]], bool] = lambda frame: False
        #: send frames that are not JSON objects before each delivery
        self.noise = False
        #: other tokens accepted besides ``token`` (signed tokens of the tests)
        self.tokens: set[str] = set()
        #: answer ``refresh`` with this ``expires_in`` (None: ``forbidden``)
        self.refresh_expires_in: float | None = 60.0
        #: refuse this many next frames with ``backpressure`` and this ``retry_after``
        self.rate_limited = 0
        self.retry_after: float | None = 0.01
        #: whether ``ack_many`` is known (False: a gateway without the extension)
        self.ack_many_op = True

        self.handshakes = 0
        self.paths: list[str] = []  # of the sockets accepted
        self.received: list[dict[str, Any]] = []
        self.sent: list[dict[str, Any]] = []
        self.queues: dict[str, list[Msg]] = defaultdict(list)
        self.acked: list[Any] = []
        self.dead: list[Any] = []
        self.published: list[tuple[str, Any]] = []
        self.sockets: set[ServerConnection] = set()
        self._keys: dict[tuple[str, str], str] = {}
        self._seq = itertools.count(1)
        self._receipts = itertools.count(1)
        self._topic_seq = itertools.count(1)
        self._changed = asyncio.Condition()
        self._server: Server | None = None
        self.port = 0

    # -- lifecycle ---------------------------------------------------------

    async def __aenter__(self) -> FakeGateway:
        self._server = await serve(
            self._handle, "127.0.0.1", 0, process_request=self._check, compression=None
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    async def put(
        self, queue: str, *bodies: Any, group: str | None = None, priority: int = 0
    ) -> None:
        """Enqueue messages directly (test set-up)."""
        for body in bodies:
            self.queues[queue].append(
                Msg(next(self._seq), queue, body, group=group, priority=priority)
            )
        await self._notify()

    def drop(self) -> None:
        """Abort every socket, as a crash or a network cut would (close code 1006)."""
        for conn in list(self.sockets):
            conn.transport.abort()

    # -- handshake and routing ---------------------------------------------

    def _check(self, conn: ServerConnection, request: Request) -> Response | None:
        self.handshakes += 1
        if self.refuse_handshakes > 0:
            self.refuse_handshakes -= 1
            return conn.respond(self.refuse_status, "try later\n")
        if request.headers.get("Authorization") not in {
            f"Bearer {t}" for t in {self.token, *self.tokens}
        }:
            return conn.respond(403, "Forbidden\n")
        return None

    async def _handle(self, conn: ServerConnection) -> None:
        assert conn.request is not None
        self.paths.append(conn.request.path)
        parts = urlsplit(conn.request.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        segments = [unquote(s) for s in parts.path.strip("/").split("/")]
        self.sockets.add(conn)
        try:
            if segments[:2] == ["ws", "queues"] and len(segments) == 3:
                await self._worker_socket(conn, segments[2], query)
            elif segments == ["ws", "produce"]:
                await self._serve_frames(conn, None, {})
            else:
                await conn.close(4404, "no such socket")
        finally:
            self.sockets.discard(conn)

    async def _worker_socket(
        self, conn: ServerConnection, queue: str, query: dict[str, str]
    ) -> None:
        if queue.startswith("silent"):
            await conn.close(4403)  # a refusal without the error frame first
            return
        if queue in self.forbidden:
            await self._send(conn, {"op": "error", "code": "forbidden", "detail": f"no {queue}"})
            await conn.close(4403)
            return
        prefetch = int(query.get("prefetch", "10"))
        if not 1 <= prefetch <= 1000:
            await self._send(conn, {"op": "error", "code": "invalid", "detail": "prefetch"})
            await conn.close(4400)
            return
        leases: dict[str, Msg] = {}
        batch = int(query.get("batch", "1"))
        pusher = asyncio.create_task(self._push(conn, queue, prefetch, leases, batch))
        try:
            await self._serve_frames(conn, queue, leases)
        finally:
            pusher.cancel()
            # The socket is gone: its leases are released at once, each message
            # keeping its original place in the queue.
            for msg in leases.values():
                msg.visible_at = 0.0
                self.queues[msg.queue].append(msg)
                self.queues[msg.queue].sort(key=lambda m: m.seq)
            await self._notify()

    async def _serve_frames(
        self, conn: ServerConnection, own_queue: str | None, leases: dict[str, Msg]
    ) -> None:
        tasks: set[asyncio.Task[None]] = set()
        try:
            async for text in conn:
                frame = json.loads(text)
                self.received.append(frame)
                if self.drop_on(frame):
                    conn.transport.abort()
                    return
                delay = self.reply_delays.get(frame.get("op", ""), 0.0)
                answer = self._answer(conn, frame, own_queue, leases, delay)
                if delay:
                    task = asyncio.create_task(answer)  # later frames overtake it
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                else:
                    await answer
        except WsConnectionClosed:
            pass
        finally:
            for task in tasks:
                task.cancel()

    async def _answer(
        self,
        conn: ServerConnection,
        frame: dict[str, Any],
        own_queue: str | None,
        leases: dict[str, Msg],
        delay: float,
    ) -> None:
        await asyncio.sleep(delay)
        try:
            if self.rate_limited > 0:
                self.rate_limited -= 1
                detail = "over the token's rate"
                reply: dict[str, Any] = {"op": "error", "code": "backpressure", "detail": detail}
                if self.retry_after is not None:
                    reply["retry_after"] = self.retry_after
                if "ref" in frame:
                    reply["ref"] = frame["ref"]
                await self._send(conn, reply)
                return
            reply = self._apply(frame, own_queue, leases)
        except ProtocolError as exc:
            reply = {"op": "error", "code": exc.code, "detail": exc.detail}
        if "ref" in frame:
            reply["ref"] = frame["ref"]
        await self._notify()
        await self._send(conn, reply)

    # -- the operations ------------------------------------------------------

    def _apply(
        self, frame: dict[str, Any], own_queue: str | None, leases: dict[str, Msg]
    ) -> dict[str, Any]:
        op = frame.get("op")
        if op == "refresh":
            if self.refresh_expires_in is None:
                raise Forbidden("refused refresh")
            self.tokens.add(str(frame["token"]))
            return {"op": "refreshed", "expires_in": self.refresh_expires_in}
        if op == "ack_many" and own_queue is not None and self.ack_many_op:
            stale = [r for r in frame["receipts"] if r not in leases]
            for receipt in frame["receipts"]:
                if receipt in leases:
                    self.acked.append(leases.pop(receipt).body)
            acked = len(frame["receipts"]) - len(stale)
            return {"op": "acked_many", "acked": acked, "stale": stale}
        if op in ("ack", "nack", "reject", "extend") and own_queue is not None:
            receipt = frame.get("receipt")
            if not isinstance(receipt, str):
                raise BadFrame("missing field 'receipt'")
            if receipt not in leases:
                raise StaleReceipt(f"receipt {receipt} is not a current lease of this socket")
            if op == "ack":
                follow = [
                    self._enqueue({"queue": own_queue, **m}) for m in frame.get("enqueue", [])
                ]
                msg = leases.pop(receipt)
                self.acked.append(msg.body)
                return {"op": "acked", "enqueued": follow} if follow else {"op": "acked"}
            if op == "nack":
                if frame.get("delay", 0) < 0:
                    raise Invalid("delay must be >= 0")
                msg = leases.pop(receipt)
                msg.visible_at = time.monotonic() + frame.get("delay", 0)
                self.queues[msg.queue].append(msg)
                self.queues[msg.queue].sort(key=lambda m: m.seq)
                return {"op": "nacked"}
            if op == "reject":
                self.dead.append(leases.pop(receipt).body)
                return {"op": "rejected"}
            return {"op": "extended", "expires_in": float(frame["timeout"])}
        if op == "enqueue":
            return {"op": "enqueued", **self._enqueue({"queue": own_queue, **frame})}
        if op == "enqueue_many" and self.batch_op:
            queue = frame.get("queue", own_queue)
            # All or nothing: check every message before storing any.
            for index, message in enumerate(frame["messages"]):
                try:
                    self._validate(message)
                except ProtocolError as exc:
                    raise type(exc)(f"messages[{index}]: {exc.detail}") from None
            results = [self._enqueue({"queue": queue, **m}) for m in frame["messages"]]
            return {"op": "enqueued_many", "results": results}
        if op == "publish":
            self.published.append((frame["topic"], frame["body"]))
            return {"op": "published", "topic": frame["topic"], "seq": next(self._topic_seq)}
        raise UnknownOp(f"unknown op {op!r}")

    @staticmethod
    def _validate(message: dict[str, Any]) -> None:
        """A message's fields, checked as gateway/core/protocol.py does (the client does not)."""
        if message.get("delay", 0) < 0:
            raise Invalid("delay must be >= 0")
        group, priority, ttl = message.get("group"), message.get("priority", 0), message.get("ttl")
        if group is not None and not isinstance(group, str):
            raise BadFrame("field 'group' must be a string")
        if not isinstance(priority, int | float) or isinstance(priority, bool):
            raise BadFrame("field 'priority' must be a number")
        if priority != int(priority) or not -100 <= priority <= 100:
            raise Invalid("priority must be an integer -100..100")
        if ttl is not None and not 0 < ttl <= 365 * 24 * 3600:
            raise Invalid("ttl must be > 0 and <= 31536000 seconds")

    def _enqueue(self, frame: dict[str, Any]) -> dict[str, Any]:
        queue = frame["queue"]
        if queue in self.forbidden:
            raise Forbidden(f"token has no scope enqueue:{queue}")
        self._validate(frame)
        key = frame.get("key")
        if key is not None and (queue, key) in self._keys:
            return {"id": self._keys[(queue, key)], "duplicate": True}
        msg = Msg(next(self._seq), queue, frame["body"])
        msg.group, msg.ttl = frame.get("group"), frame.get("ttl")
        msg.priority = int(frame.get("priority", 0))
        msg.visible_at = time.monotonic() + frame.get("delay", 0)
        self.queues[queue].append(msg)
        if key is not None:
            self._keys[(queue, key)] = f"m{msg.seq}"
        return {"id": f"m{msg.seq}", "duplicate": False}

    async def _push(
        self,
        conn: ServerConnection,
        queue: str,
        prefetch: int,
        leases: dict[str, Msg],
        batch: int = 1,
    ) -> None:
        def ready() -> Msg | None:
            now = time.monotonic()
            if len(leases) >= prefetch:
                return None
            return next((m for m in self.queues[queue] if m.visible_at <= now), None)

        if batch > 1:
            await self._push_batches(conn, queue, prefetch, leases, batch, ready)
            return

        while True:
            async with self._changed:
                # Poll a little too: delayed messages become visible by time alone.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: ready() is not None), 0.02
                    )
                msg = ready()
                if msg is None:
                    continue
                self.queues[queue].remove(msg)
                msg.deliveries += 1
                receipt = f"r{next(self._receipts)}"
                leases[receipt] = msg
            if self.noise:
                await conn.send("not json")
                await conn.send("[1, 2]")
            deliver = {
                "op": "deliver",
                "queue": queue,
                "id": f"m{msg.seq}",
                "receipt": receipt,
                "body": msg.body,
                "deliveries": msg.deliveries,
                "expires_in": 30.0,
            }
            # As the gateway does: both protocol 1.1 fields when either applies.
            if msg.group is not None or msg.priority != 0:
                deliver["priority"] = msg.priority
            if msg.group is not None:
                deliver["group"] = msg.group
            await self._send(conn, deliver)

    async def _push_batches(
        self,
        conn: ServerConnection,
        queue: str,
        prefetch: int,
        leases: dict[str, Msg],
        batch: int,
        ready: Callable[[], Msg | None],
    ) -> None:
        """``deliveries`` frames of up to ``batch`` items (the batch extension)."""
        while True:
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: ready() is not None), 0.02
                    )
                items = []
                while len(items) < batch and (msg := ready()) is not None:
                    self.queues[queue].remove(msg)
                    msg.deliveries += 1
                    receipt = f"r{next(self._receipts)}"
                    leases[receipt] = msg
                    item = {
                        "id": f"m{msg.seq}",
                        "receipt": receipt,
                        "body": msg.body,
                        "deliveries": msg.deliveries,
                        "expires_in": 30.0,
                    }
                    if msg.group is not None or msg.priority != 0:
                        item["priority"] = msg.priority
                    if msg.group is not None:
                        item["group"] = msg.group
                    items.append(item)
            if items:
                await self._send(conn, {"op": "deliveries", "queue": queue, "items": items})

    async def close_sockets(self, code: int) -> None:
        """Close every socket with ``code`` (e.g. 4401: token expired)."""
        for conn in list(self.sockets):
            await conn.close(code)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _send(self, conn: ServerConnection, frame: dict[str, Any]) -> None:
        self.sent.append(frame)
        with contextlib.suppress(WsConnectionClosed):
            await conn.send(json.dumps(frame))


async def take(worker: Worker | AsyncIterator[Delivery], n: int) -> list[Delivery]:
    """The next ``n`` deliveries (with a timeout, so a bug fails instead of hanging)."""
    it = aiter(worker)
    return [await asyncio.wait_for(anext(it), 5) for _ in range(n)]


@dataclass
class TopicSocket:
    """One subscriber socket of the fake gateway."""

    conn: ServerConnection
    topic: str
    credit: int
    seq: int = 0
    pending: list[tuple[int, Any, int | None]] = field(default_factory=list)
    granted: list[int] = field(default_factory=list)  # the n of each credit frame


class TopicGateway(FakeGateway):
    """:class:`FakeGateway` with broadcast topics."""

    def __init__(self, history: int = 0) -> None:
        super().__init__()
        self.topics: dict[str, list[TopicSocket]] = defaultdict(list)
        #: every topic socket ever accepted, in order
        self.history: list[TopicSocket] = []
        #: messages kept per topic (0: a gateway without topic history)
        self.keep = history
        self.epoch = "e1"
        self.offsets: dict[str, int] = defaultdict(int)
        self.logs: dict[str, list[tuple[int, Any]]] = defaultdict(list)

    def reset_history(self, epoch: str) -> None:
        """Lose every topic's history: offsets restart under a new epoch."""
        self.epoch = epoch
        self.offsets.clear()
        self.logs.clear()

    async def _handle(self, conn: ServerConnection) -> None:
        assert conn.request is not None
        parts = urlsplit(conn.request.path)
        segments = [unquote(s) for s in parts.path.strip("/").split("/")]
        if segments[:2] != ["ws", "topics"] or len(segments) != 3:
            await super()._handle(conn)
            return
        self.paths.append(conn.request.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        topic = segments[2]
        if topic in self.forbidden:
            await self._send(conn, {"op": "error", "code": "forbidden", "detail": f"no {topic}"})
            await conn.close(4403)
            return
        sub = TopicSocket(conn, topic, credit=int(query.get("credit", "256")))
        self.sockets.add(conn)
        self.topics[topic].append(sub)
        self.history.append(sub)
        if self.keep and "since" in query:
            await self._resume(sub, int(query["since"]), query.get("epoch", ""))
        elif self.keep and query.get("recover") == "latest":
            await self._latest(sub)
        try:
            async for text in conn:
                frame = json.loads(text)
                self.received.append(frame)
                if frame.get("op") == "credit":
                    sub.granted.append(frame["n"])
                    sub.credit += frame["n"]
                    await self._flush(sub, 0)
        except WsConnectionClosed:
            pass
        finally:
            self.sockets.discard(conn)
            self.topics[topic].remove(sub)

    async def _latest(self, sub: TopicSocket) -> None:
        log = self.logs[sub.topic]
        frame = {"op": "subscribed", "topic": sub.topic, "epoch": self.epoch}
        frame |= {"offset": self.offsets[sub.topic], "recovered": bool(log)}
        await self._send(sub.conn, frame)
        if log:
            sub.seq += 1
            sub.pending.append((sub.seq, log[-1][1], log[-1][0]))
            await self._flush(sub, 0)

    async def _resume(self, sub: TopicSocket, since: int, epoch: str) -> None:
        log = self.logs[sub.topic]
        oldest = log[0][0] if log else self.offsets[sub.topic] + 1
        recovered = epoch == self.epoch and oldest - 1 <= since <= self.offsets[sub.topic]
        frame = {"op": "subscribed", "topic": sub.topic, "epoch": self.epoch}
        frame |= {"offset": self.offsets[sub.topic], "recovered": recovered}
        await self._send(sub.conn, frame)
        if recovered:
            for offset, body in log:
                if offset > since:
                    sub.seq += 1
                    sub.pending.append((sub.seq, body, offset))
            await self._flush(sub, 0)

    async def publish(self, topic: str, *bodies: Any, dropped: int = 0) -> None:
        """Offer ``bodies`` to every socket of ``topic``, reporting ``dropped`` losses first."""
        offsets: list[int | None] = []
        for body in bodies:
            if self.keep:
                self.offsets[topic] += 1
                self.logs[topic] = [*self.logs[topic], (self.offsets[topic], body)][-self.keep :]
                offsets.append(self.offsets[topic])
            else:
                offsets.append(None)
        for sub in list(self.topics[topic]):
            sub.seq += dropped
            for body, offset in zip(bodies, offsets, strict=True):
                sub.seq += 1
                sub.pending.append((sub.seq, body, offset))
            await self._flush(sub, dropped)

    async def _flush(self, sub: TopicSocket, dropped: int) -> None:
        n = min(sub.credit, len(sub.pending))
        items, sub.pending = sub.pending[:n], sub.pending[n:]
        sub.credit -= n
        if items or dropped:
            frame = {
                "op": "messages",
                "topic": sub.topic,
                "items": [
                    {"seq": seq, "body": body} | ({} if offset is None else {"offset": offset})
                    for seq, body, offset in items
                ],
                "dropped": dropped,
            }
            await self._send(sub.conn, frame)

    async def close_topic_sockets(self, code: int, error: str | None = None) -> None:
        """Close every topic socket with ``code``, stating ``error`` first if given."""
        for sub in [s for subs in self.topics.values() for s in subs]:
            if error is not None:
                await self._send(sub.conn, {"op": "error", "code": error, "detail": "no more"})
            await sub.conn.close(code)

    async def until(self, condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
        """Wait until ``condition()`` holds (the gateway's own view), or fail."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not condition():
            assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
            await asyncio.sleep(0.005)

    async def subscribed(self, topic: str, handshakes: int) -> None:
        """Wait until ``topic`` has one socket, accepted as handshake number ``handshakes``."""
        await self.until(
            lambda: len(self.topics[topic]) == 1 and len(self.history) == handshakes,
            f"socket {handshakes} on {topic}",
        )
