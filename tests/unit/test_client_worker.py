"""The Worker against a real WebSocket server that speaks enough of the protocol.

:class:`FakeGateway` is a tiny in-memory gateway (one ``websockets`` server on
127.0.0.1, port 0): worker sockets with leases, the produce socket, bearer
tokens, refusals (HTTP 403, close 4403/4400) and switches to drop sockets,
refuse handshakes and delay replies; the batch extensions (``batch``
deliveries, ``ack_many``, ``enqueue_many``), ``refresh`` of signed tokens and
``backpressure`` with ``retry_after``. The producer and CLI tests use it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from leasecast import Delivery, EnqueueResult, Worker
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed as WsConnectionClosed
from websockets.http11 import Request, Response

from gateway.core.errors import (
    BadFrame,
    ConnectionClosed,
    Forbidden,
    Invalid,
    ProtocolError,
    StaleReceipt,
    Unauthorized,
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


@pytest.fixture
async def gateway() -> AsyncIterator[FakeGateway]:
    async with FakeGateway() as gw:
        yield gw


async def take(worker: Worker | AsyncIterator[Delivery], n: int) -> list[Delivery]:
    """The next ``n`` deliveries (with a timeout, so a bug fails instead of hanging)."""
    it = aiter(worker)
    return [await asyncio.wait_for(anext(it), 5) for _ in range(n)]


# -- iteration and ending leases ----------------------------------------------


async def test_worker_iterates_and_ends_leases(gateway: FakeGateway) -> None:
    await gateway.put("jobs", "a", "b", "c", "d")
    async with Worker(gateway.http, "jobs", token=TOKEN, prefetch=4) as worker:
        deliveries = aiter(worker)
        a, b, c, d = await take(deliveries, 4)
        assert (a.queue, a.id, a.body, a.deliveries, a.expires_in) == ("jobs", "m1", "a", 1, 30.0)
        assert [x.body for x in (b, c, d)] == ["b", "c", "d"]

        assert await a.ack() == []
        await b.nack()
        await c.reject()
        assert await d.extend(90) == 90.0 and d.expires_in == 90.0
        assert await d.ack(enqueue=[{"body": "next"}, {"queue": "other", "body": "x"}]) == [
            EnqueueResult("m5", False),
            EnqueueResult("m6", False),
        ]
        again, follow_up = await take(deliveries, 2)
        assert (again.body, again.deliveries, again.id) == ("b", 2, b.id)
        assert follow_up.body == "next"
        await again.ack()
        await follow_up.ack()
    assert gateway.acked == ["a", "d", "b", "next"]
    assert gateway.dead == ["c"]
    assert [m.body for m in gateway.queues["other"]] == ["x"]
    # Every request carried its own ref, and the URL carried the parameters.
    refs = [f["ref"] for f in gateway.received]
    assert len(set(refs)) == len(refs)


def test_worker_url_carries_prefetch_and_visibility_timeout() -> None:
    worker = Worker("http://h:1", "emails.x", token=TOKEN, prefetch=3, visibility_timeout=7.5)
    assert worker.url == "ws://h:1/ws/queues/emails.x/?prefetch=3&visibility_timeout=7.5&batch=3"
    v1 = Worker("https://h", "q", token=TOKEN, batch=False)
    assert v1.url == "wss://h/ws/queues/q/?prefetch=10"


async def test_error_replies_raise_and_the_socket_stays_usable(gateway: FakeGateway) -> None:
    await gateway.put("jobs", 1, 2)
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=2) as worker:
        one, two = await take(worker, 2)
        await one.ack()
        with pytest.raises(StaleReceipt, match="not a current lease"):
            await one.ack()
        with pytest.raises(Invalid):
            await two.nack(delay=-1)
        with pytest.raises(Forbidden, match="enqueue:secret"):
            await two.ack(enqueue=[{"queue": "secret", "body": 0}])
        assert gateway.acked == [1]  # the refused ack changed nothing
        await two.ack()
        assert gateway.acked == [1, 2]
        assert worker.connected and gateway.handshakes == 1


async def test_replies_are_matched_by_ref_whatever_their_order(gateway: FakeGateway) -> None:
    await gateway.put("jobs", "slow", "fast", "third")
    gateway.reply_delays["ack"] = 0.3  # the ack's reply comes last
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=2) as worker:
        deliveries = aiter(worker)
        slow, fast = await take(deliveries, 2)
        acking = asyncio.create_task(slow.ack())
        await asyncio.sleep(0.01)  # the ack frame is out first
        await fast.reject()  # its reply overtakes the ack's
        assert not acking.done()
        # The gateway pushed the next delivery before answering the ack, too.
        (third,) = await take(deliveries, 1)
        assert third.body == "third"
        assert await acking == []
    ops = [f["op"] for f in gateway.sent]
    assert ops.index("rejected") < ops.index("acked")
    # The frame that carried "third" ("deliver", or a "deliveries" batch).
    bodies = [
        [f.get("body")] if f["op"] == "deliver" else [i["body"] for i in f.get("items", [])]
        for f in gateway.sent
    ]
    third_at = next(i for i, b in enumerate(bodies) if "third" in b)
    assert third_at < ops.index("acked")


async def test_many_concurrent_requests_each_get_their_own_reply(gateway: FakeGateway) -> None:
    await gateway.put("jobs", *range(20))
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=20) as worker:
        got = await take(worker, 20)
        await got[3].ack()  # so acking it again is stale, in the middle of the rest
        results = await asyncio.gather(*(d.extend(d.body + 1) for d in got), return_exceptions=True)
    assert isinstance(results[3], StaleReceipt)
    assert [r for i, r in enumerate(results) if i != 3] == [
        float(i + 1) for i in range(20) if i != 3
    ]


async def test_frames_that_are_not_json_objects_are_ignored(gateway: FakeGateway) -> None:
    gateway.noise = True
    await gateway.put("jobs", {"n": 1})
    async with Worker(gateway.ws, "jobs", token=TOKEN) as worker:
        (delivery,) = await take(worker, 1)
        assert delivery.body == {"n": 1}
        await delivery.ack()


async def test_worker_enqueue_to_its_own_queue_and_others(gateway: FakeGateway) -> None:
    async with Worker(gateway.ws, "jobs", token=TOKEN) as worker:
        first = await worker.enqueue({"n": 1}, key="k")
        assert first == EnqueueResult("m1", False)
        assert await worker.enqueue({"n": 1}, key="k") == EnqueueResult("m1", True)
        await worker.enqueue("elsewhere", queue="other", delay=5)
        with pytest.raises(Forbidden):
            await worker.enqueue(1, queue="secret")
        (delivery,) = await take(worker, 1)
        assert delivery.body == {"n": 1}
    assert [m.body for m in gateway.queues["other"]] == ["elsewhere"]


# -- protocol 1.1: group, priority, ttl ------------------------------------------


async def test_deliveries_carry_group_and_priority_when_the_message_has_them(
    gateway: FakeGateway,
) -> None:
    await gateway.put("jobs", "plain")
    await gateway.put("jobs", "grouped", group="order-7")
    await gateway.put("jobs", "urgent", priority=-100)
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=3) as worker:
        plain, grouped, urgent = await take(worker, 3)
    assert (plain.group, plain.priority) == (None, 0)
    assert (grouped.group, grouped.priority) == ("order-7", 0)
    assert (urgent.group, urgent.priority) == (None, -100)
    # What the gateway sent: the fields only on the messages that have them.
    sent = [f for f in gateway.sent if f["op"] == "deliver"]
    sent += [item for f in gateway.sent if f["op"] == "deliveries" for item in f["items"]]
    assert ["group" in f for f in sent] == [False, True, False]
    assert ["priority" in f for f in sent] == [False, True, True]
    assert "group='order-7'" in repr(grouped) and "priority=-100" in repr(urgent)


async def test_worker_enqueue_and_ack_follow_ups_send_group_priority_ttl(
    gateway: FakeGateway,
) -> None:
    async with Worker(gateway.ws, "jobs", token=TOKEN) as worker:
        await worker.enqueue("v1")
        await worker.enqueue("v1.1", queue="other", group="g", priority=7, ttl=60)
        (delivery,) = await take(worker, 1)
        follow_ups = [
            {"body": "next", "group": "g", "priority": -3, "ttl": 0.5},
            {"queue": "other", "body": "plain"},
        ]
        assert len(await delivery.ack(enqueue=follow_ups)) == 2
        with pytest.raises(Invalid, match="priority"):
            await worker.enqueue("x", priority=101)  # the gateway's answer, not the client's
        with pytest.raises(Invalid, match="ttl"):
            await worker.enqueue("x", ttl=0)
    frames = [f for f in gateway.received if f["op"] in ("enqueue", "ack")]
    # A v1 call sends the v1 frame: no field of 1.1, not even a default.
    assert frames[0] == {"op": "enqueue", "body": "v1", "delay": 0, "ref": frames[0]["ref"]}
    assert {k: frames[1][k] for k in ("queue", "group", "priority", "ttl")} == {
        "queue": "other",
        "group": "g",
        "priority": 7,
        "ttl": 60,
    }
    assert frames[2]["enqueue"] == follow_ups
    stored = {m.body: m for msgs in gateway.queues.values() for m in msgs}
    assert (stored["next"].group, stored["next"].priority, stored["next"].ttl) == ("g", -3, 0.5)
    assert (stored["plain"].group, stored["plain"].priority) == (None, 0)
    assert "x" not in stored


# -- refusals -------------------------------------------------------------------


async def test_a_refused_handshake_raises_at_once(gateway: FakeGateway) -> None:
    with pytest.raises(Unauthorized, match="HTTP 403"):
        async with Worker(gateway.ws, "jobs", token="lc_wrong"):
            pass
    assert gateway.handshakes == 1


async def test_a_forbidden_queue_raises_the_stated_error_without_retrying(
    gateway: FakeGateway,
) -> None:
    async with Worker(gateway.ws, "secret", token=TOKEN, backoff_initial=0.01) as worker:
        with pytest.raises(Forbidden, match="no secret"):
            await take(worker, 1)
        with pytest.raises(Forbidden):  # and again: the refusal is final
            await take(worker, 1)
    assert gateway.handshakes == 1


async def test_invalid_parameters_and_a_bare_4403_are_final_too(gateway: FakeGateway) -> None:
    async with Worker(gateway.ws, "jobs", token=TOKEN, prefetch=0) as worker:
        with pytest.raises(Invalid, match="prefetch"):
            await take(worker, 1)
    async with Worker(gateway.ws, "silent", token=TOKEN) as worker:
        with pytest.raises(Forbidden, match="4403"):
            await take(worker, 1)
    assert gateway.handshakes == 2


async def test_an_unreachable_gateway_fails_fast_on_open() -> None:
    async with FakeGateway() as gw:
        url = gw.ws
    with pytest.raises(ConnectionClosed, match="cannot connect"):
        async with Worker(url, "jobs", token=TOKEN):
            pass


# -- dropped sockets and reconnecting -------------------------------------------


async def test_worker_reconnects_after_a_drop_and_old_receipts_are_stale(
    gateway: FakeGateway,
) -> None:
    await gateway.put("jobs", "x", "y")
    worker = Worker(gateway.ws, "jobs", token=TOKEN, prefetch=1, backoff_initial=0.01)
    async with worker:
        deliveries = aiter(worker)
        (x,) = await take(deliveries, 1)
        gateway.drop()
        # The gateway released the lease with the socket: x comes again.
        (again,) = await take(deliveries, 1)
        assert (again.body, again.id, again.deliveries) == ("x", x.id, 2)
        assert worker.reconnects == 1 and gateway.handshakes == 2
        with pytest.raises(StaleReceipt, match="released"):
            await x.ack()
        await again.ack()
        (y,) = await take(deliveries, 1)
        await y.ack()
    assert gateway.acked == ["x", "y"]


async def test_reconnect_retries_transient_refusals_with_growing_delays(
    gateway: FakeGateway,
) -> None:
    await gateway.put("jobs", "x")
    worker = Worker(gateway.ws, "jobs", token=TOKEN, backoff_initial=0.02, backoff_max=0.08)
    async with worker:
        deliveries = aiter(worker)
        await take(deliveries, 1)
        gateway.refuse_handshakes = 3  # HTTP 503 three times, then accepted
        started = time.monotonic()
        gateway.drop()
        (again,) = await take(deliveries, 1)
        # Four delays of at least half of 0.02, 0.04, 0.08, 0.08.
        assert time.monotonic() - started >= 0.11
        assert again.deliveries == 2 and worker.reconnects == 1
        assert gateway.handshakes == 5


async def test_a_token_revoked_while_disconnected_stops_reconnecting(
    gateway: FakeGateway,
) -> None:
    await gateway.put("jobs", "x")
    async with Worker(gateway.ws, "jobs", token=TOKEN, backoff_initial=0.01) as worker:
        deliveries = aiter(worker)
        await take(deliveries, 1)
        gateway.token = "lc_rotated"
        gateway.drop()
        with pytest.raises(Unauthorized):
            await take(deliveries, 1)
    assert gateway.handshakes == 2


async def test_without_reconnect_a_drop_raises_connection_closed(gateway: FakeGateway) -> None:
    await gateway.put("jobs", "x")
    async with Worker(gateway.ws, "jobs", token=TOKEN, reconnect=False) as worker:
        deliveries = aiter(worker)
        (x,) = await take(deliveries, 1)
        gateway.drop()
        with pytest.raises(ConnectionClosed):
            await take(deliveries, 1)
        with pytest.raises(StaleReceipt):
            await x.nack()
    assert gateway.handshakes == 1


async def test_a_request_in_flight_when_the_socket_drops_raises_connection_closed(
    gateway: FakeGateway,
) -> None:
    await gateway.put("jobs", "x")
    gateway.drop_on = lambda frame: frame.get("op") == "ack"
    async with Worker(gateway.ws, "jobs", token=TOKEN, backoff_initial=0.01) as worker:
        deliveries = aiter(worker)
        (x,) = await take(deliveries, 1)
        with pytest.raises(ConnectionClosed):
            await x.ack()
        gateway.drop_on = lambda frame: False
        (again,) = await take(deliveries, 1)
        assert again.deliveries == 2
        # enqueue() shares the reopened socket.
        await worker.enqueue("more")
        assert worker.reconnects == 1 and gateway.handshakes == 2


async def test_close_interrupts_a_reconnect_in_its_backoff(gateway: FakeGateway) -> None:
    await gateway.put("jobs", "x")
    worker = Worker(gateway.ws, "jobs", token=TOKEN, backoff_initial=4.0, backoff_max=4.0)
    await worker.connect()
    deliveries = aiter(worker)
    await take(deliveries, 1)
    gateway.drop()
    consuming = asyncio.create_task(take(deliveries, 1))
    await asyncio.sleep(0.05)  # now asleep in the first backoff delay (2 to 4 s)
    started = time.monotonic()
    await worker.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(consuming, 1)
    assert time.monotonic() - started < 0.5
    assert gateway.handshakes == 1
    with pytest.raises(ConnectionClosed, match="closed"):
        await worker.enqueue(1)


async def test_iterating_without_async_with_connects_on_first_use(gateway: FakeGateway) -> None:
    await gateway.put("jobs", "x")
    worker = Worker(gateway.ws, "jobs", token=TOKEN)
    try:
        (x,) = await take(worker, 1)
        await x.ack()
    finally:
        await worker.close()
    assert gateway.handshakes == 1 and worker.reconnects == 0


def test_delivery_repr_hides_the_socket() -> None:
    fields = Delivery.__dataclass_fields__
    assert set(fields) == {
        "queue",
        "id",
        "receipt",
        "body",
        "deliveries",
        "expires_in",
        "group",
        "priority",
        "_link",
        "_acks",
    }
    assert not fields["_link"].repr
