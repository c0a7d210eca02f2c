"""Frame fuzzing against a live gateway (issue 6, item 2).

Random and malformed frames on every socket kind (worker, subscriber,
producer, dashboard) of one real daphne process, while a producer, a worker
and a subscriber of the same process carry ordinary traffic next to them.

For every frame sent, the test checks what docs/protocol.md (Conventions,
Errors) promises: exactly one reply (``error`` with the right code, or the
success reply; none for a valid ``credit``), the frame's ``ref`` echoed when
it is a string or a number, the socket still usable afterwards (except the
transport's closes: 1009 for a frame over the limit, 1007 for a text frame
that is not UTF-8, which RFC 6455 section 8.1 requires), and the neighbours
untouched: the worker gets every message once, in order, and acks it; the
subscriber gets every publish in order with nothing dropped. After each test
the gateway process is alive, ``/healthz`` answers and its log has no
``Traceback``.

How "exactly one reply" is checked: after each fuzzed frame the client sends a
barrier, an unknown op with a unique ``ref``. Its ``unknown_op`` error is
pushed synchronously when the gateway reads it, so every synchronous reply to
the fuzzed frame comes before it; a frame whose reply needs the store or the
broadcaster (a valid enqueue or publish) may answer after it, and then the
test waits for that one reply. Anything extra shows up before the next
barrier's reply and fails the test.

The expectations are computed by the test from the frame alone, from the
protocol's rules, not by calling the gateway's parser: the hand list below
names the exact code of each nasty case; the generated frames are checked
against the codes the protocol allows for their op.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.support.clients import Socket, ahttp, http, unique
from tests.support.gateways import GatewayProcess

# -- the socket kinds -------------------------------------------------------------

OPS: dict[str, frozenset[str]] = {
    "worker": frozenset(
        {"ack", "ack_many", "nack", "reject", "extend", "enqueue", "enqueue_many", "publish"}
    ),
    "subscriber": frozenset({"credit", "publish", "enqueue", "enqueue_many"}),
    "producer": frozenset({"enqueue", "enqueue_many", "publish"}),
    "dashboard": frozenset({"disconnect"}),
}
KINDS = list(OPS)
SUCCESS = {
    "enqueue": "enqueued",
    "enqueue_many": "enqueued_many",
    "ack": "acked",
    "ack_many": "acked_many",
    "nack": "nacked",
    "reject": "rejected",
    "extend": "extended",
    "publish": "published",
    "disconnect": "disconnected",
}
#: Frames the server sends on its own; never replies.
PUSHES = frozenset({"deliver", "deliveries", "messages", "snapshot", "history"})
#: Codes a well-formed-or-not frame of a known op may get with an admin token
#: and a healthy store. Never ``unavailable`` (that is the gateway's answer to
#: an exception of its own), never ``backpressure`` or ``forbidden``.
FRAME_CODES = frozenset({"bad_frame", "invalid", "too_large", "stale_receipt", "not_found"})
TRANSPORT_LIMIT = 8 * 1024 * 1024
U64_MAX = 2**64 - 1
I64_MIN = -(2**63)


def socket_path(kind: str, name: str) -> str:
    return {
        "worker": f"/ws/queues/{name}/",
        "subscriber": f"/ws/topics/{name}/",
        "producer": "/ws/produce/",
        "dashboard": "/ws/dashboard/",
    }[kind]


# -- expectations --------------------------------------------------------------------

NO_REF = object()


@dataclass(frozen=True)
class Expect:
    """What one client frame must get back."""

    codes: frozenset[str] = frozenset()  # allowed error codes
    ops: frozenset[str] = frozenset()  # allowed success ops
    ref: Any = NO_REF  # the ref the reply must carry (NO_REF: none)
    reply: bool = True  # False: a valid credit, which has no reply
    check: Callable[[dict[str, Any]], None] | None = None

    def verify(self, frame: dict[str, Any], sent: Any) -> None:
        if not self.reply:
            raise AssertionError(f"no reply expected to {short(sent)}, got {frame}")
        if frame.get("op") == "error":
            assert frame.get("code") in self.codes, (short(sent), frame, self)
            assert isinstance(frame.get("detail"), str) and frame["detail"], frame
        else:
            assert frame.get("op") in self.ops, (short(sent), frame, self)
        if self.ref is NO_REF:
            assert "ref" not in frame, (short(sent), frame)
        else:
            assert "ref" in frame and same(frame["ref"], self.ref), (short(sent), frame, self.ref)
        if self.check is not None:
            self.check(frame)


def error(code: str, ref: Any = NO_REF) -> Expect:
    return Expect(codes=frozenset({code}), ref=ref)


def success(op: str, ref: Any = NO_REF, check: Callable[[dict[str, Any]], None] | None = None):
    return Expect(ops=frozenset({SUCCESS[op]}), ref=ref, check=check)


NO_REPLY = Expect(reply=False)


def short(sent: Any) -> str:
    text = sent if isinstance(sent, str) else repr(sent)
    return text if len(text) < 300 else f"{text[:200]}...({len(text)} chars)"


def same(a: Any, b: Any) -> bool:
    """JSON equality that tells 1 from 1.0 and true from 1."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def valid_ref(obj: dict[str, Any]) -> Any:
    """The ref the protocol says a reply echoes: a string or a number, else none."""
    ref = obj.get("ref")
    if isinstance(ref, str) or (isinstance(ref, int | float) and not isinstance(ref, bool)):
        return ref
    return NO_REF


def _reject_constant(name: str) -> None:
    raise ValueError(name)


def _decodable(value: Any, depth: int = 0) -> bool:
    """Whether every part of ``value`` is something a strict JSON decoder keeps as is."""
    if depth > 1000:
        return False
    if isinstance(value, str):
        try:
            value.encode("utf-8")  # lone surrogates are not text
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) < 10**308
    if isinstance(value, list):
        return all(_decodable(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(_decodable(k, depth + 1) and _decodable(v, depth + 1) for k, v in value.items())
    return True


def decode(text: str) -> Any:
    """The frame as the protocol reads it, or a sentinel when it is not JSON."""
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return NOT_JSON
    return obj if _decodable(obj) else NOT_JSON


NOT_JSON = object()


def expect_for(kind: str, text: str) -> Expect:
    """What the protocol allows as the reply to ``text`` on a socket of ``kind``."""
    obj = decode(text)
    if not isinstance(obj, dict):  # not JSON, or not an object: no ref can be read
        return error("bad_frame")
    ref = valid_ref(obj)
    op = obj.get("op")
    if not isinstance(op, str):
        return error("bad_frame", ref)
    if op not in OPS[kind]:
        return error("unknown_op", ref)
    ref_ok = obj.get("ref") is None or ref is not NO_REF
    if not ref_ok:  # a mistyped ref: the frame is refused, whatever else is in it
        return Expect(codes=frozenset({"bad_frame", "invalid", "too_large"}))
    if op == "credit":
        n = obj.get("n")
        if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 1_000_000_000:
            return NO_REPLY
        return Expect(codes=frozenset({"bad_frame", "invalid"}), ref=ref)
    if op in ("ack", "nack", "reject", "extend"):
        # No receipt the fuzzer makes up is a lease of this socket.
        return Expect(codes=FRAME_CODES, ref=ref)
    if op == "ack_many":

        def nothing_acked(frame: dict[str, Any]) -> None:
            if frame["op"] == "acked_many":
                assert frame["acked"] == 0, frame

        return Expect(
            codes=FRAME_CODES, ops=frozenset({"acked_many"}), ref=ref, check=nothing_acked
        )
    return Expect(codes=FRAME_CODES, ops=frozenset({SUCCESS[op]}), ref=ref)


# -- the client side -------------------------------------------------------------------

_CLOSED: dict[str, Any] = {"op": "<closed>"}
_barriers = itertools.count()


class FuzzSocket:
    """A raw client socket: replies in one queue, the server's own pushes counted apart."""

    def __init__(self, conn: ClientConnection, kind: str) -> None:
        self.conn = conn
        self.kind = kind
        self.replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.pushes = 0
        self.sent = 0
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, gateway: GatewayProcess, token: str, kind: str) -> FuzzSocket:
        url = gateway.ws + socket_path(kind, unique(f"fz{kind[0]}"))
        headers = {"Authorization": f"Bearer {token}"}
        conn = await connect(url, additional_headers=headers, max_size=None)
        return cls(conn, kind)

    async def _read(self) -> None:
        try:
            async for text in self.conn:
                frame = json.loads(text)
                if frame.get("op") in PUSHES:
                    self.pushes += 1
                else:
                    self.replies.put_nowait(frame)
        except ConnectionClosed:
            pass
        finally:
            self.replies.put_nowait(_CLOSED)

    @property
    def closed(self) -> bool:
        return self.reader.done()

    async def reply(self, timeout: float = 15) -> dict[str, Any]:
        frame = await asyncio.wait_for(self.replies.get(), timeout)
        if frame is _CLOSED:
            self.replies.put_nowait(_CLOSED)
            raise ConnectionError(
                f"the gateway closed the {self.kind} socket "
                f"({self.conn.close_code} {self.conn.close_reason!r})"
            )
        return frame

    async def exchange(self, payload: str | bytes, expect: Expect) -> dict[str, Any] | None:
        """Send one frame, then a barrier; check the frame got exactly what ``expect`` says."""
        try:
            return await self._exchange(payload, expect)
        except BaseException as exc:
            exc.add_note(f"{self.kind} socket, frame sent: {short(payload)}")
            raise

    async def _exchange(self, payload: str | bytes, expect: Expect) -> dict[str, Any] | None:
        barrier = f"barrier-{uuid.uuid4().hex}-{next(_barriers)}"
        await self.conn.send(payload)
        await self.conn.send(json.dumps({"op": "zz.barrier", "ref": barrier}))
        self.sent += 1
        before = []
        while True:
            frame = await self.reply()
            if frame.get("ref") == barrier:
                assert frame["op"] == "error" and frame["code"] == "unknown_op", frame
                break
            before.append(frame)
        if not before and expect.reply:
            before.append(await self.reply())  # a reply from the store or the broadcaster
        if not expect.reply:
            assert before == [], (short(payload), before)
            return None
        assert len(before) == 1, f"{len(before)} replies to {short(payload)}: {before}"
        expect.verify(before[0], payload)
        return before[0]

    async def still_usable(self, gateway: GatewayProcess, token: str) -> None:
        """A good frame still gets its success (or, on the dashboard, its proper answer)."""
        if self.kind == "dashboard":
            frame = {"op": "disconnect", "process": "nobody:0", "socket": 1, "ref": "u"}
            await self.exchange(json.dumps(frame), error("not_found", "u"))
        else:
            frame = {"op": "enqueue", "queue": unique("fzok"), "body": {"ok": True}, "ref": 7}
            await self.exchange(json.dumps(frame), success("enqueue", 7))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.conn.close()
        self.reader.cancel()


# -- the neighbours ---------------------------------------------------------------------


@dataclass
class Traffic:
    """A producer, a worker and a subscriber on the fuzzed gateway, busy all along.

    The producer enqueues and publishes ``{"i": i}`` for i = 0, 1, ...; the
    worker must get each message once, in order, and ack it; the subscriber
    must get each publish, in order, with ``dropped`` 0.
    """

    gateway: GatewayProcess
    token: str
    produced: int = 0
    worked: int = 0
    heard: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    sockets: list[Socket] = field(default_factory=list)

    async def start(self) -> None:
        ws = self.gateway.ws
        queue, topic = unique("fzq"), unique("fzt")
        self.worker = await Socket.open(f"{ws}/ws/queues/{queue}/?prefetch=20", self.token)
        self.subscriber = await Socket.open(
            f"{ws}/ws/topics/{topic}/?capacity=1000000&credit=64", self.token
        )
        self.producer = await Socket.open(f"{ws}/ws/produce/", self.token)
        self.sockets = [self.worker, self.subscriber, self.producer]
        self.queue, self.topic = queue, topic
        self.tasks = [
            asyncio.create_task(self._produce()),
            asyncio.create_task(self._work()),
            asyncio.create_task(self._listen()),
        ]

    async def _produce(self) -> None:
        while not self.stop.is_set():
            i = self.produced
            enqueued = await self.producer.request(
                {"op": "enqueue", "queue": self.queue, "body": {"i": i}}, timeout=30
            )
            assert enqueued["op"] == "enqueued", enqueued
            published = await self.producer.request(
                {"op": "publish", "topic": self.topic, "body": {"i": i}}, timeout=30
            )
            assert published["op"] == "published", published
            self.produced += 1
            await asyncio.sleep(0.01)

    async def _work(self) -> None:
        while True:
            frame = await self.worker.next(timeout=3600)
            assert frame["op"] == "deliver", frame
            assert frame["body"] == {"i": self.worked}, (frame, self.worked)
            assert frame["deliveries"] == 1, frame
            acked = await self.worker.request({"op": "ack", "receipt": frame["receipt"]}, 30)
            assert acked["op"] == "acked", acked
            self.worked += 1

    async def _listen(self) -> None:
        granted = 64
        seq = 0
        while True:
            frame = await self.subscriber.next(timeout=3600)
            assert frame["op"] == "messages", frame
            assert frame["dropped"] == 0, frame
            for item in frame["items"]:
                seq += 1
                assert item["seq"] == seq, (item, seq)
                assert item["body"] == {"i": self.heard}, (item, self.heard)
                self.heard += 1
            if granted - self.heard < 32:
                await self.subscriber.send({"op": "credit", "n": 64})
                granted += 64

    def _raise_failures(self) -> None:
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def finish(self, at_least: int = 10) -> None:
        """Stop producing (after ``at_least`` rounds); everything produced must arrive."""
        await self._until(lambda: self.produced >= at_least, "the producer to get going")
        self.stop.set()
        await self._until(lambda: self.tasks[0].done(), "the producer to stop")
        self._raise_failures()
        total = self.produced
        await self._until(lambda: self.worked >= total, f"the worker to ack all {total}")
        await self._until(lambda: self.heard >= total, f"the subscriber to hear all {total}")
        self._raise_failures()
        assert (self.worked, self.heard) == (total, total)
        for task in self.tasks:
            task.cancel()
        for s in self.sockets:
            await s.close()
        status, body = await ahttp(
            "GET", f"{self.gateway.http}/api/queues/{self.queue}", self.token
        )
        assert status == 200, body
        assert [body[k] for k in ("visible", "delayed", "in_flight", "dead")] == [0, 0, 0, 0]

    async def _until(self, condition: Callable[[], bool], what: str, limit: float = 60) -> None:
        deadline = asyncio.get_running_loop().time() + limit
        while not condition():
            self._raise_failures()
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(
                    f"gave up waiting for {what}: produced {self.produced}, "
                    f"worked {self.worked}, heard {self.heard}"
                )
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def neighbours(gateway: GatewayProcess, token: str) -> AsyncIterator[Traffic]:
    traffic = Traffic(gateway, token)
    await traffic.start()
    try:
        yield traffic
    except BaseException:
        for task in traffic.tasks:
            task.cancel()
        raise
    await traffic.finish()


@contextlib.contextmanager
def healthy_afterwards(gateway: GatewayProcess) -> Iterator[None]:
    """The gateway survives whatever the block does: alive, healthy, no traceback logged."""
    start = gateway.log_path.stat().st_size
    yield
    assert gateway.proc is not None and gateway.proc.poll() is None, "the gateway died"
    status, body = http("GET", f"{gateway.http}/healthz")
    assert (status, body) == (200, {"status": "ok"})
    with open(gateway.log_path, "rb") as log:
        log.seek(start)
        text = log.read().decode(errors="replace")
    assert "Traceback" not in text, text[-6000:]
    assert "Exception inside application" not in text, text[-6000:]


async def process_name(gateway: GatewayProcess, token: str) -> str:
    status, body = await ahttp("GET", f"{gateway.http}/api/stats", token)
    assert status == 200, body
    name: str = body["process"]["name"]
    return name


# -- the hand list ---------------------------------------------------------------------


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


def common_cases() -> list[tuple[str | bytes, Expect]]:
    """Nasty frames every socket kind must answer the same way."""
    big = 12345678901234567890123456789
    return [
        ("", error("bad_frame")),
        ("   ", error("bad_frame")),
        ("not json at all", error("bad_frame")),
        ("null", error("bad_frame")),
        ("true", error("bad_frame")),
        ("0", error("bad_frame")),
        ('"op"', error("bad_frame")),
        ("[]", error("bad_frame")),
        ('[{"op": "enqueue"}]', error("bad_frame")),
        ("{", error("bad_frame")),
        ('{"op":', error("bad_frame")),
        ('{"op": "zz"', error("bad_frame")),
        ('{"op": "zz",}', error("bad_frame")),
        ("{'op': 'zz'}", error("bad_frame")),
        ('{"op": NaN}', error("bad_frame")),
        ('{"op": "zz", "ref": Infinity}', error("bad_frame")),
        ('{"op": "zz", "ref": 1e999}', error("bad_frame")),
        ('{"op": "zz", "x": -1e999, "ref": "r"}', error("bad_frame")),
        ('{"op": "zz\n"}', error("bad_frame")),  # a raw control character in a string
        ('{"op": "zz"} {"op": "zz"}', error("bad_frame")),  # two documents, one frame
        ('\ufeff{"op": "zz"}', error("bad_frame")),
        ('{"op": "\\ud800", "ref": "r"}', error("bad_frame")),  # a lone surrogate
        ("{}", error("bad_frame")),
        ('{"ref": "r0"}', error("bad_frame", "r0")),
        ('{"op": 1, "ref": "r1"}', error("bad_frame", "r1")),
        ('{"op": null, "ref": 2}', error("bad_frame", 2)),
        ('{"op": true}', error("bad_frame")),
        ('{"op": ["enqueue"]}', error("bad_frame")),
        ('{"op": {"op": "enqueue"}}', error("bad_frame")),
        ('{"op": "ENQUEUE", "ref": "r3"}', error("unknown_op", "r3")),
        ('{"op": ""}', error("unknown_op")),
        ('{"op": "zz\\u0000"}', error("unknown_op")),
        ('{"op": "__class__"}', error("unknown_op")),
        ('{"op": "deliver"}', error("unknown_op")),  # a server op, sent by a client
        ('{"op": "error", "code": "bad_frame"}', error("unknown_op")),
        ('  {"op": "zz", "ref": -0.5}\n ', error("unknown_op", -0.5)),
        ('{"op": "enqueue", "op": "zz"}', error("unknown_op")),  # the last key wins
        (json.dumps({"op": "z" * 100_000, "ref": "long"}), error("unknown_op", "long")),
        # Refs: any JSON string or number comes back as it was sent.
        ('{"op": "zz", "ref": ""}', error("unknown_op", "")),
        ('{"op": "zz", "ref": "\\u00e9\\ud83d\\ude00"}', error("unknown_op", "\u00e9\U0001f600")),
        ('{"op": "zz", "ref": 0}', error("unknown_op", 0)),
        ('{"op": "zz", "ref": 1.0}', error("unknown_op", 1.0)),
        ('{"op": "zz", "ref": 1.5e300}', error("unknown_op", 1.5e300)),
        ('{"op": "zz", "ref": 5e-324}', error("unknown_op", 5e-324)),
        (f'{{"op": "zz", "ref": {U64_MAX}}}', error("unknown_op", U64_MAX)),
        (f'{{"op": "zz", "ref": {I64_MIN}}}', error("unknown_op", I64_MIN)),
        (f'{{"op": "zz", "ref": {big}}}', error("unknown_op", big)),
        (f'{{"op": "zz", "ref": {-big}}}', error("unknown_op", -big)),
        (f'{{"op": "zz", "ref": {10**300}}}', error("unknown_op", 10**300)),
        ('{"op": "zz", "ref": null}', error("unknown_op")),
        ('{"op": "zz", "ref": true}', error("unknown_op")),  # op first, then the ref
        ('{"op": "zz", "ref": [1]}', error("unknown_op")),
        ('{"op": "zz", "ref": {"a": 1}}', error("unknown_op")),
        # Deep nesting, under and over the decoder's limit, with and without a
        # long number (which makes the gateway decode the frame a second time).
        ('{"op": "zz", "ref": "d1", "a": ' + nested(900) + "}", error("unknown_op", "d1")),
        ('{"op": "zz", "ref": "d2", "a": ' + nested(1020) + "}", error("unknown_op", "d2")),
        (
            '{"op": "zz", "ref": "d3", "n": 1234567890123456789, "a": ' + nested(1000) + "}",
            error("bad_frame"),
        ),
        ('{"op": "zz", "a": ' + nested(100_000) + "}", error("bad_frame")),
        ("[" * 100_000, error("bad_frame")),
        ('{"a": ' * 5000, error("bad_frame")),
        ('{"op": "zz", "a": ' + '{"a": ' * 2000 + "1" + "}" * 2000 + "}", error("bad_frame")),
        # Wide rather than deep.
        (
            json.dumps({"op": "zz", "ref": "wide", **{f"k{i}": i for i in range(50_000)}}),
            error("unknown_op", "wide"),
        ),
        (
            json.dumps({"op": "zz", "ref": "arr", "a": list(range(200_000))}),
            error("unknown_op", "arr"),
        ),
        # Binary frames are never protocol frames, whatever they hold.
        (b'{"op": "enqueue", "queue": "q", "body": 1}', error("bad_frame")),
        (b"\xff\xfe\x00garbage", error("bad_frame")),
        (b"", error("bad_frame")),
        (bytes(range(256)) * 64, error("bad_frame")),
    ]


def enqueue_cases(kind: str) -> list[tuple[str | bytes, Expect]]:
    """ENQUEUE and PUBLISH on the sockets that take them (all but the dashboard)."""
    q = unique("fzh")
    enq = {"op": "enqueue", "queue": q}

    def frame(**fields: Any) -> str:
        return json.dumps({**enq, **fields})

    limit = 256 * 1024
    no_queue = success("enqueue", "nq") if kind == "worker" else error("invalid", "nq")
    return [
        (frame(body=1, ref="ok"), success("enqueue", "ok")),
        (frame(body=None, ref="null body"), success("enqueue", "null body")),
        (frame(ref="nobody"), error("bad_frame", "nobody")),
        (frame(body=1, queue=None, ref="nq"), no_queue),
        (frame(body=1, queue="", ref=1), error("invalid", 1)),
        (frame(body=1, queue="a" * 201, ref=2), error("invalid", 2)),
        (frame(body=1, queue="a" * 200), success("enqueue")),
        (frame(body=1, queue="../etc/passwd"), error("invalid")),
        (frame(body=1, queue="has space"), error("invalid")),
        (frame(body=1, queue="caf\u00e9"), error("invalid")),
        (frame(body=1, queue="q\u0000"), error("invalid")),
        (frame(body=1, queue=5), error("bad_frame")),
        (frame(body=1, queue=["q"]), error("bad_frame")),
        (frame(body=1, queue=True), error("bad_frame")),
        (frame(body=1, key=9), error("bad_frame")),
        (frame(body=1, key=""), error("invalid")),
        # A field no message has is refused, not ignored (protocol 1.2: General).
        (frame(body=1, dealy=5, ref="typo"), error("invalid", "typo")),
        (frame(body=1, Body=2), error("invalid")),
        (frame(body=1, **{"": 1}), error("invalid")),
        (frame(body=1, **{"delay\u0000": 1}), error("invalid")),
        (frame(body=1, key="k" * 513), error("invalid")),
        (frame(body=1, key="k" * 512, ref="k512"), success("enqueue", "k512")),
        (frame(body=1, key="\u00e9\U0001f600 \\ '%_"), success("enqueue")),
        # PostgreSQL cannot store U+0000 in text: refused on every backend, not
        # "unavailable" (which tells the client to retry).
        (frame(body=1, key="k\u0000", ref="nul"), error("invalid", "nul")),
        (frame(body={"s": "\u0000", "\u0000": 0}, key="k\u0001"), success("enqueue")),
        (frame(body=1, delay="1"), error("bad_frame")),
        (frame(body=1, delay=True), error("bad_frame")),
        (frame(body=1, delay=[0]), error("bad_frame")),
        (frame(body=1, delay=-1), error("invalid")),
        (frame(body=1, delay=-1e-300), error("invalid")),
        (frame(body=1, delay=365 * 24 * 3600 + 1), error("invalid")),
        (frame(body=1, delay=1e308), error("invalid")),
        (frame(body=1, delay=10**300), error("invalid")),
        (frame(body=1, delay=-(10**300)), error("invalid")),
        (frame(body=1, delay=2**64), error("invalid")),
        (frame(body=1, delay=-0.0), success("enqueue")),
        (frame(body=1, delay=5e-324), success("enqueue")),
        (frame(body=1, delay=None), success("enqueue")),
        # Numbers in bodies: 64-bit integers are kept exactly, larger ones refused.
        (frame(body=U64_MAX), success("enqueue")),
        (frame(body=I64_MIN), success("enqueue")),
        (frame(body=U64_MAX + 1, ref="u65"), error("invalid", "u65")),
        (frame(body=I64_MIN - 1), error("invalid")),
        (frame(body={"deep": [10**300]}), error("invalid")),
        (frame(body=1.7976931348623157e308), success("enqueue")),
        (frame(body=-0.0), success("enqueue")),
        # Body size and depth.
        (frame(body="x" * (limit - 2)), success("enqueue")),  # exactly the limit, quoted
        (frame(body="x" * (limit - 1)), error("too_large")),
        (frame(body=["y" * 1000] * 300), error("too_large")),
        (frame(body="\U0001f600" * (limit // 4)), error("too_large")),  # bytes, not characters
        (
            '{"op": "enqueue", "queue": "' + q + '", "body": ' + nested(200) + "}",
            success("enqueue"),
        ),
        ('{"op": "enqueue", "queue": "' + q + '", "body": ' + nested(300) + "}", error("invalid")),
        # A frame just under the transport limit is a frame like any other: here
        # one whose unknown field ``pad`` makes it invalid (protocol 1.2).
        (frame(body=1, pad="p" * (TRANSPORT_LIMIT - 1024), ref="big"), error("invalid", "big")),
        # enqueue_many.
        (json.dumps({"op": "enqueue_many", "queue": q, "messages": []}), error("invalid")),
        (json.dumps({"op": "enqueue_many", "queue": q, "messages": "x"}), error("bad_frame")),
        (json.dumps({"op": "enqueue_many", "queue": q, "messages": [1]}), error("bad_frame")),
        (json.dumps({"op": "enqueue_many", "queue": q}), error("bad_frame")),
        (
            json.dumps({"op": "enqueue_many", "queue": q, "messages": [{"body": 1}, {"b": 2}]}),
            Expect(codes=frozenset({"bad_frame"}), check=lambda f: _names(f, "messages[1]")),
        ),
        (
            json.dumps(
                {"op": "enqueue_many", "queue": q, "messages": [{"body": i} for i in range(3)]}
            ),
            success("enqueue_many", check=lambda f: _count(f["results"], 3)),
        ),
        (
            json.dumps(
                {"op": "enqueue_many", "queue": q, "messages": [{"body": 1}] * 10_001, "ref": "m"}
            ),
            error("invalid", "m"),
        ),
        # publish.
        (
            json.dumps({"op": "publish", "topic": unique("fzp"), "body": [1], "ref": "p"}),
            success("publish", "p"),
        ),
        (json.dumps({"op": "publish", "body": 1}), error("bad_frame")),
        (json.dumps({"op": "publish", "topic": "", "body": 1}), error("invalid")),
        (json.dumps({"op": "publish", "topic": 7, "body": 1}), error("bad_frame")),
        (json.dumps({"op": "publish", "topic": "t t", "body": 1}), error("invalid")),
        (json.dumps({"op": "publish", "topic": unique("fzp")}), error("bad_frame")),
        (
            json.dumps({"op": "publish", "topic": unique("fzp"), "body": U64_MAX + 1}),
            error("invalid"),
        ),
        (
            json.dumps({"op": "publish", "topic": unique("fzp"), "body": "x" * limit}),
            error("too_large"),
        ),
    ]


def _names(frame: dict[str, Any], where: str) -> None:
    assert where in frame["detail"], frame


def _count(items: list[Any], n: int) -> None:
    assert len(items) == n, items


def kind_cases(kind: str, process: str) -> list[tuple[str | bytes, Expect]]:
    """What only one kind of socket takes."""
    if kind == "worker":
        return [
            ('{"op": "ack"}', error("bad_frame")),
            ('{"op": "ack", "receipt": null}', error("bad_frame")),
            ('{"op": "ack", "receipt": 5}', error("bad_frame")),
            ('{"op": "ack", "receipt": ["1.ff"]}', error("bad_frame")),
            ('{"op": "ack", "receipt": "", "ref": "e"}', error("stale_receipt", "e")),
            ('{"op": "ack", "receipt": "1.ff"}', error("stale_receipt")),
            ('{"op": "ack", "receipt": "-1.x"}', error("stale_receipt")),
            ('{"op": "ack", "receipt": "99999999999999999999999999.x"}', error("stale_receipt")),
            ('{"op": "ack", "receipt": "\\u0000"}', error("stale_receipt")),
            (json.dumps({"op": "ack", "receipt": "r" * 200_000}), error("stale_receipt")),
            ('{"op": "ack", "receipt": "1.ff", "enqueue": "x"}', error("bad_frame")),
            ('{"op": "ack", "receipt": "1.ff", "enqueue": [1]}', error("bad_frame")),
            ('{"op": "ack", "receipt": "1.ff", "enqueue": [{"body": 1}]}', error("stale_receipt")),
            (
                json.dumps({"op": "ack", "receipt": "1.ff", "enqueue": [{"body": 1}] * 1001}),
                error("too_large"),
            ),
            ('{"op": "nack", "receipt": "1.ff", "delay": -5}', error("invalid")),
            ('{"op": "nack", "receipt": "1.ff", "delay": "5"}', error("bad_frame")),
            ('{"op": "nack", "receipt": "garbage"}', error("stale_receipt")),
            ('{"op": "reject", "receipt": {"a": 1}}', error("bad_frame")),
            ('{"op": "reject", "receipt": "1.ff", "ref": 3}', error("stale_receipt", 3)),
            ('{"op": "extend", "receipt": "1.ff"}', error("bad_frame")),
            ('{"op": "extend", "receipt": "1.ff", "timeout": "5"}', error("bad_frame")),
            ('{"op": "extend", "receipt": "1.ff", "timeout": 0}', error("invalid")),
            ('{"op": "extend", "receipt": "1.ff", "timeout": -1}', error("invalid")),
            ('{"op": "extend", "receipt": "1.ff", "timeout": 43201}', error("invalid")),
            ('{"op": "extend", "receipt": "1.ff", "timeout": 1e308}', error("invalid")),
            ('{"op": "extend", "receipt": "1.ff", "timeout": 5}', error("stale_receipt")),
            ('{"op": "ack_many", "receipts": []}', error("invalid")),
            ('{"op": "ack_many", "receipts": "1.ff"}', error("bad_frame")),
            ('{"op": "ack_many", "receipts": ["1.ff", 1]}', error("bad_frame")),
            (
                '{"op": "ack_many", "receipts": ["1.ff", "x", "1.ff"], "ref": "am"}',
                success(
                    "ack_many",
                    "am",
                    check=lambda f: _equal((f["acked"], f["stale"]), (0, ["1.ff", "x", "1.ff"])),
                ),
            ),
            ('{"op": "credit", "n": 1}', error("unknown_op")),
            ('{"op": "disconnect", "process": "p", "socket": 1}', error("unknown_op")),
        ]
    if kind == "subscriber":
        return [
            ('{"op": "credit", "n": 0}', NO_REPLY),
            ('{"op": "credit", "n": 10, "ref": "c"}', NO_REPLY),
            ('{"op": "credit", "n": 1000000000}', NO_REPLY),
            ('{"op": "credit"}', error("bad_frame")),
            ('{"op": "credit", "n": null}', error("bad_frame")),
            ('{"op": "credit", "n": -1, "ref": "neg"}', error("invalid", "neg")),
            ('{"op": "credit", "n": 1000000001}', error("invalid")),
            (f'{{"op": "credit", "n": {2**70}}}', error("invalid")),
            (f'{{"op": "credit", "n": {-(2**70)}}}', error("invalid")),
            ('{"op": "credit", "n": 1.5}', error("bad_frame")),
            ('{"op": "credit", "n": 1.0}', error("bad_frame")),
            ('{"op": "credit", "n": "5"}', error("bad_frame")),
            ('{"op": "credit", "n": true}', error("bad_frame")),
            ('{"op": "credit", "n": 5, "ref": [1]}', error("bad_frame")),
            ('{"op": "ack", "receipt": "1.ff"}', error("unknown_op")),
            ('{"op": "disconnect", "process": "p", "socket": 1}', error("unknown_op")),
        ]
    if kind == "producer":
        return [
            ('{"op": "credit", "n": 1}', error("unknown_op")),
            ('{"op": "ack", "receipt": "1.ff"}', error("unknown_op")),
            ('{"op": "extend", "receipt": "1.ff", "timeout": 1}', error("unknown_op")),
            ('{"op": "disconnect", "process": "p", "socket": 1}', error("unknown_op")),
        ]
    assert kind == "dashboard"

    def disconnect(**fields: Any) -> str:
        return json.dumps({"op": "disconnect", **fields})

    return [
        (disconnect(), error("bad_frame")),
        (disconnect(process="p"), error("bad_frame")),
        (disconnect(process=1, socket=1), error("bad_frame")),
        (disconnect(process="p", socket="1"), error("bad_frame")),
        (disconnect(process="p", socket=True), error("bad_frame")),
        (disconnect(process="p", socket=1.0), error("bad_frame")),
        (disconnect(process=None, socket=1), error("bad_frame")),
        (disconnect(process="nobody:1", socket=1, ref="nf"), error("not_found", "nf")),
        (disconnect(process="", socket=1), error("not_found")),
        (disconnect(process="\u0000" * 1000, socket=1), error("not_found")),
        (disconnect(process=process, socket=-1), error("not_found")),
        (disconnect(process=process, socket=0), error("not_found")),
        (disconnect(process=process, socket=10**30, ref=10**30), error("not_found", 10**30)),
        (disconnect(process=process, socket=U64_MAX), error("not_found")),
        ('{"op": "enqueue", "queue": "q", "body": 1}', error("unknown_op")),
        ('{"op": "publish", "topic": "t", "body": 1}', error("unknown_op")),
        ('{"op": "credit", "n": 1}', error("unknown_op")),
        ('{"op": "ack", "receipt": "1.ff"}', error("unknown_op")),
    ]


def _equal(a: Any, b: Any) -> None:
    assert a == b, (a, b)


@pytest.mark.parametrize("kind", KINDS)
async def test_nasty_frames_get_their_reply_and_nothing_else_notices(
    gateway: GatewayProcess, admin_token: str, kind: str
) -> None:
    process = await process_name(gateway, admin_token)
    cases = common_cases() + (enqueue_cases(kind) if kind != "dashboard" else [])
    cases += kind_cases(kind, process)
    with healthy_afterwards(gateway):
        async with neighbours(gateway, admin_token):
            s = await FuzzSocket.open(gateway, admin_token, kind)
            try:
                for payload, expect in cases:
                    await s.exchange(payload, expect)
                await s.still_usable(gateway, admin_token)
            finally:
                await s.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_flood_of_errors_gets_one_reply_each_in_order(
    gateway: GatewayProcess, admin_token: str, kind: str
) -> None:
    """Thousands of bad frames sent without waiting: one error each, in order, then normal."""
    bad = [
        lambda i: f'{{"op": "zz", "ref": {i}}}',
        lambda i: f'{{"op": 5, "ref": {i}}}',
        lambda i: f'{{"ref": {i}, "op": "enqueue", "queue": "no way", "body": 1}}',
        lambda i: f'{{"ref": {i}, "op": "disconnect", "process": 1, "socket": 1}}',
        lambda i: f'{{"ref": {i}, "op": "credit", "n": -1}}',
    ]
    n = 3000
    with healthy_afterwards(gateway):
        async with neighbours(gateway, admin_token):
            s = await FuzzSocket.open(gateway, admin_token, kind)
            try:
                for i in range(n):
                    await s.conn.send(bad[i % len(bad)](i))
                    if i % 7 == 0:
                        await s.conn.send(b"\x00binary")  # no ref: bad_frame without one
                refs = []
                while len(refs) < n:
                    frame = await s.reply()
                    assert frame["op"] == "error", frame
                    assert frame["code"] in ("bad_frame", "unknown_op", "invalid"), frame
                    if "ref" in frame:
                        refs.append(frame["ref"])
                    else:
                        assert frame["code"] == "bad_frame", frame
                assert refs == list(range(n))
                await s.still_usable(gateway, admin_token)
            finally:
                await s.close()


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "dashboard"])
async def test_a_flood_of_mixed_frames_gets_exactly_one_reply_per_ref(
    gateway: GatewayProcess, admin_token: str, kind: str
) -> None:
    """Good enqueues (answered by the store) among bad frames (answered at once)."""
    q = unique("fzflood")
    n = 1500
    with healthy_afterwards(gateway):
        async with neighbours(gateway, admin_token):
            s = await FuzzSocket.open(gateway, admin_token, kind)
            try:
                for i in range(n):
                    if i % 3 == 0:
                        frame = {"op": "enqueue", "queue": q, "body": i, "ref": i}
                    else:
                        frame = {"op": "enqueue", "queue": q, "body": i, "delay": -i, "ref": i}
                    await s.conn.send(json.dumps(frame))
                seen: dict[int, dict[str, Any]] = {}
                while len(seen) < n:
                    frame = await s.reply()
                    assert frame["ref"] not in seen, ("two replies", seen[frame["ref"]], frame)
                    seen[frame["ref"]] = frame
                for i, frame in seen.items():
                    if i % 3 == 0:
                        assert frame["op"] == "enqueued", frame
                    else:
                        assert (frame["op"], frame["code"]) == ("error", "invalid"), frame
                # No stray reply is still on its way: the barrier's answer comes next.
                await s.still_usable(gateway, admin_token)
            finally:
                await s.close()
            status, body = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
            assert status == 200 and body["visible"] == len(range(0, n, 3)), body


@pytest.mark.parametrize("kind", KINDS)
async def test_a_frame_over_the_transport_limit_closes_1009_and_only_that_socket(
    gateway: GatewayProcess, admin_token: str, kind: str
) -> None:
    with healthy_afterwards(gateway):
        async with neighbours(gateway, admin_token):
            victim = await FuzzSocket.open(gateway, admin_token, kind)
            other = await FuzzSocket.open(gateway, admin_token, kind)
            try:
                frame = json.dumps({"op": "zz", "pad": "p" * TRANSPORT_LIMIT})
                with contextlib.suppress(ConnectionClosed):
                    await victim.conn.send(frame)
                await asyncio.wait_for(victim.reader, 30)
                assert victim.conn.close_code == 1009
                # A socket of the same kind on the same process carries on.
                await other.still_usable(gateway, admin_token)
                await other.exchange('{"op": "zz", "ref": 1}', error("unknown_op", 1))
            finally:
                await victim.close()
                await other.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_text_frame_that_is_not_utf8_closes_1007_and_only_that_socket(
    gateway: GatewayProcess, admin_token: str, kind: str
) -> None:
    """RFC 6455 (8.1) fails such a connection with 1007; the transport does, not the app."""
    with healthy_afterwards(gateway):
        async with neighbours(gateway, admin_token):
            victim = await FuzzSocket.open(gateway, admin_token, kind)
            other = await FuzzSocket.open(gateway, admin_token, kind)
            try:
                with contextlib.suppress(ConnectionClosed):
                    await victim.conn.send(b'{"op": "\xff\xfe", "ref": 1}', text=True)
                await asyncio.wait_for(victim.reader, 30)
                assert victim.conn.close_code == 1007
                await other.still_usable(gateway, admin_token)
            finally:
                await victim.close()
                await other.close()


# -- generated frames ------------------------------------------------------------------------

ANY_OP = sorted(set(SUCCESS) | {"credit", "zz", "", "deliver", "messages", "subscribe", "Ack"})
FIELDS = [
    "queue",
    "body",
    "key",
    "delay",
    "receipt",
    "receipts",
    "timeout",
    "topic",
    "n",
    "messages",
    "enqueue",
    "process",
    "socket",
    "ref",
]
EDGE_INTS = [
    0,
    -1,
    1,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    U64_MAX,
    U64_MAX + 1,
    I64_MIN,
    I64_MIN - 1,
    10**30,
    -(10**30),
    10**300,
    1_000_000_000,
    1_000_000_001,
    31_536_000,
    31_536_001,
    43_200,
    43_201,
]
EDGE_STRINGS = [
    "",
    "\u0000",
    "1.ff",
    "q",
    "a" * 201,
    "../x",
    "\u00e9",
    "\U0001f600",
    " ",
    "1." + "f" * 64,
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**66), 2**66)
    | st.sampled_from(EDGE_INTS)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(EDGE_STRINGS)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def frame_objects(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    """A JSON object that looks more or less like a frame for ``kind``."""
    fields = draw(
        st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), json_values, max_size=5)
    )
    choice = draw(st.integers(0, 9))
    if choice < 6:
        fields["op"] = draw(st.sampled_from(sorted(OPS[kind])))
    elif choice < 8:
        fields["op"] = draw(st.sampled_from(ANY_OP))
    elif choice == 8:
        fields["op"] = draw(json_values)
    else:
        fields.pop("op", None)
    return fields


@st.composite
def fuzzed_texts(draw: st.DrawFn, kind: str) -> str:
    """A frame's text: a generated object, as is or mangled, or plain noise."""
    how = draw(st.integers(0, 9))
    if how == 9:
        return draw(st.text(max_size=40))
    text = json.dumps(draw(frame_objects(kind)), ensure_ascii=draw(st.booleans()))
    if how < 6:
        return text
    # Mangle it: cut, insert or overwrite a few characters.
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        edit = draw(st.integers(0, 2))
        noise = draw(
            st.sampled_from(
                ['"', "{", "}", "[", "]", ",", ":", "\\", "\\u", "1e999", "9" * 30, "x"]
            )
        )
        if edit == 0:
            text = text[:at] + text[at + draw(st.integers(1, 8)) :]
        elif edit == 1:
            text = text[:at] + noise + text[at:]
        else:
            text = text[:at] + noise + text[at + len(noise) :]
    return text


#: A valid frame per op, and for each of its typed fields the wrong-typed
#: values that must make the frame ``bad_frame``.
TEMPLATES: dict[str, dict[str, Any]] = {
    "enqueue": {"op": "enqueue", "queue": "fzt.typed", "body": {"a": 1}, "key": "k", "delay": 0},
    "enqueue_many": {"op": "enqueue_many", "queue": "fzt.typed", "messages": [{"body": 1}]},
    "publish": {"op": "publish", "topic": "fzt.typed", "body": [1]},
    "ack": {"op": "ack", "receipt": "1.ff", "enqueue": [{"queue": "fzt.typed", "body": 1}]},
    "ack_many": {"op": "ack_many", "receipts": ["1.ff"]},
    "nack": {"op": "nack", "receipt": "1.ff", "delay": 1},
    "reject": {"op": "reject", "receipt": "1.ff"},
    "extend": {"op": "extend", "receipt": "1.ff", "timeout": 5},
    "credit": {"op": "credit", "n": 5},
    "disconnect": {"op": "disconnect", "process": "nobody:0", "socket": 1},
}
#: field -> (the JSON types it may have, whether null counts as absent and is fine)
TYPED: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "enqueue": {"queue": ((str,), True), "key": ((str,), True), "delay": ((int, float), True)},
    "enqueue_many": {"queue": ((str,), True), "messages": ((list,), False)},
    "publish": {"topic": ((str,), False)},
    "ack": {"receipt": ((str,), False), "enqueue": ((list,), True)},
    "ack_many": {"receipts": ((list,), False)},
    "nack": {"receipt": ((str,), False), "delay": ((int, float), True)},
    "reject": {"receipt": ((str,), False)},
    "extend": {"receipt": ((str,), False), "timeout": ((int, float), False)},
    "credit": {"n": ((int,), False)},
    "disconnect": {"process": ((str,), False), "socket": ((int,), False)},
}


def _is(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and not isinstance(value, bool)


@st.composite
def mistyped_frames(draw: st.DrawFn, kind: str) -> tuple[str, Expect]:
    """A valid frame with exactly one field of the wrong JSON type: ``bad_frame``."""
    op = draw(st.sampled_from(sorted(OPS[kind])))
    frame = dict(TEMPLATES[op])
    if kind == "worker" and op == "enqueue":
        frame.pop("queue")
    target = draw(st.sampled_from([*TYPED[op], "ref", "op"]))
    if target == "op":
        value = draw(json_values.filter(lambda v: not isinstance(v, str)))
    elif target == "ref":
        value = draw(json_values.filter(lambda v: v is not None and not _is(v, (str, int, float))))
    else:
        types, null_ok = TYPED[op][target]
        value = draw(
            json_values.filter(lambda v: not _is(v, types) and not (null_ok and v is None))
        )
    frame[target] = value
    ref = draw(
        st.one_of(
            st.none(),
            st.text(max_size=5),
            st.integers(),
            st.floats(allow_nan=False, allow_infinity=False),
        )
    )
    if target != "ref" and ref is not None:
        frame["ref"] = ref
    expect_ref = NO_REF if target == "ref" or ref is None else ref
    return json.dumps(frame), error("bad_frame", expect_ref)


@st.composite
def out_of_range_frames(draw: st.DrawFn, kind: str) -> tuple[str, Expect]:
    """A well-typed frame with one value out of its range: ``invalid``."""
    choices: list[tuple[str, str, Any]] = []
    bad_names = st.sampled_from(["", "a" * 201, "a b", "a/b", "\u00e9", "q\u0000", "*", "q?x=1"])
    bad_delays = (
        st.floats(max_value=-1e-9, allow_infinity=False)
        | st.floats(min_value=31_536_000.5, allow_infinity=False)
        | st.integers(max_value=-1)
        | st.integers(min_value=31_536_001, max_value=10**300)
    )
    bad_timeouts = (
        st.floats(max_value=0, allow_infinity=False)
        | st.floats(min_value=43_200.01, allow_infinity=False)
        | st.integers(max_value=0)
        | st.integers(min_value=43_201, max_value=10**300)
    )
    bad_bodies = st.integers(min_value=U64_MAX + 1, max_value=10**300) | st.integers(
        max_value=I64_MIN - 1, min_value=-(10**300)
    )
    if "enqueue" in OPS[kind]:
        choices += [("enqueue", "queue", draw(bad_names)), ("enqueue", "delay", draw(bad_delays))]
        choices += [("enqueue", "key", draw(st.sampled_from(["", "k" * 513])))]
        choices += [("enqueue", "body", draw(bad_bodies.map(lambda v: {"n": [v]})))]
    if "publish" in OPS[kind]:
        choices += [("publish", "topic", draw(bad_names)), ("publish", "body", draw(bad_bodies))]
    if "nack" in OPS[kind]:
        choices += [("nack", "delay", draw(bad_delays)), ("extend", "timeout", draw(bad_timeouts))]
    if "credit" in OPS[kind]:
        n = draw(
            st.integers(max_value=-1, min_value=-(10**300))
            | st.integers(min_value=10**9 + 1, max_value=10**300)
        )
        choices += [("credit", "n", n)]
    if not choices:
        return "{}", error("bad_frame")  # the dashboard takes no values with ranges
    op, name, value = draw(st.sampled_from(choices))
    frame = {**TEMPLATES[op], name: value}
    ref = draw(st.one_of(st.none(), st.text(max_size=5), st.integers(-(2**70), 2**70)))
    if ref is not None:
        frame["ref"] = ref
    return json.dumps(frame), error("invalid", NO_REF if ref is None else ref)


def run_fuzz(
    gateway: GatewayProcess, token: str, kind: str, strategy: st.SearchStrategy[Any], examples: int
) -> None:
    """Run ``strategy``'s frames through one socket of ``kind``, neighbours busy meanwhile."""
    loop = asyncio.new_event_loop()
    try:
        traffic = Traffic(gateway, token)
        loop.run_until_complete(traffic.start())
        state: dict[str, FuzzSocket] = {}

        async def socket() -> FuzzSocket:
            if "s" not in state or state["s"].closed:
                state["s"] = await FuzzSocket.open(gateway, token, kind)
            return state["s"]

        async def one(batch: list[tuple[str, Expect]]) -> None:
            s = await socket()
            try:
                for text, expect in batch:
                    await s.exchange(text, expect)
            except BaseException:
                # The next example starts on a fresh socket, so that shrinking
                # finds the frames that fail rather than those sent after them.
                del state["s"]
                await s.close()
                raise

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(batch=st.lists(strategy, min_size=1, max_size=4))
        def check(batch: list[tuple[str, Expect]]) -> None:
            loop.run_until_complete(one(batch))

        check()
        s = loop.run_until_complete(socket())
        loop.run_until_complete(s.still_usable(gateway, token))
        loop.run_until_complete(s.close())
        loop.run_until_complete(traffic.finish())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


@pytest.mark.parametrize("kind", KINDS)
def test_generated_frames_get_a_reply_the_protocol_allows(
    gateway: GatewayProcess, admin_token: str, kind: str
) -> None:
    strategy = fuzzed_texts(kind).map(lambda text: (text, expect_for(kind, text)))
    with healthy_afterwards(gateway):
        run_fuzz(gateway, admin_token, kind, strategy, examples=150)


@pytest.mark.parametrize("kind", KINDS)
def test_every_mistyped_field_is_bad_frame(
    gateway: GatewayProcess, admin_token: str, kind: str
) -> None:
    with healthy_afterwards(gateway):
        run_fuzz(gateway, admin_token, kind, mistyped_frames(kind), examples=80)


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "dashboard"])
def test_every_value_out_of_range_is_invalid(
    gateway: GatewayProcess, admin_token: str, kind: str
) -> None:
    with healthy_afterwards(gateway):
        run_fuzz(gateway, admin_token, kind, out_of_range_frames(kind), examples=80)


def test_any_json_body_round_trips_exactly_or_is_refused_as_invalid(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """Enqueue -> deliver and publish -> messages keep a body exactly (1 stays 1, 1.0 stays 1.0)."""
    loop = asyncio.new_event_loop()
    queue, topic = unique("fzrt"), unique("fzrt")
    ws = gateway.ws

    async def open_all() -> tuple[Socket, Socket]:
        worker = await Socket.open(f"{ws}/ws/queues/{queue}/?prefetch=1", admin_token)
        sub = await Socket.open(f"{ws}/ws/topics/{topic}/?credit=1000000000", admin_token)
        return worker, sub

    def fits(value: Any) -> bool:
        if isinstance(value, int) and not isinstance(value, bool):
            return I64_MIN <= value <= U64_MAX
        if isinstance(value, list):
            return all(fits(v) for v in value)
        if isinstance(value, dict):
            return all(fits(v) for v in value.values())
        return True

    async def round_trip(worker: Socket, sub: Socket, body: Any) -> None:
        enq = await worker.request({"op": "enqueue", "body": body})
        pub = await sub.request({"op": "publish", "topic": topic, "body": body})
        if not fits(body):
            assert (enq["op"], enq["code"]) == ("error", "invalid"), enq
            assert (pub["op"], pub["code"]) == ("error", "invalid"), pub
            return
        assert enq["op"] == "enqueued" and pub["op"] == "published", (enq, pub)
        delivered = await worker.next()
        assert delivered["op"] == "deliver" and delivered["id"] == enq["id"], delivered
        assert same(delivered["body"], body), (delivered["body"], body)
        assert (await worker.request({"op": "ack", "receipt": delivered["receipt"]}))[
            "op"
        ] == "acked"
        heard = await sub.next()
        assert [i["seq"] for i in heard["items"]] == [pub["seq"]], heard
        assert same(heard["items"][0]["body"], body), (heard, body)

    try:
        with healthy_afterwards(gateway):
            worker, sub = loop.run_until_complete(open_all())

            @settings(max_examples=100, deadline=None, database=None)
            @given(body=json_values | st.text() | st.dictionaries(st.text(), json_values))
            def check(body: Any) -> None:
                loop.run_until_complete(round_trip(worker, sub, body))

            check()
            loop.run_until_complete(worker.close())
            loop.run_until_complete(sub.close())
    finally:
        loop.close()


def test_an_idempotency_key_with_nul_is_invalid_over_http_too(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """PostgreSQL cannot store U+0000 in text; both backends refuse it the same way."""
    url = f"{gateway.http}/api/queues/{unique('fznul')}/messages"
    status, body = http("POST", url, admin_token, {"messages": [{"body": 1, "key": "a\u0000b"}]})
    assert (status, body["error"]) == (400, "invalid"), body
    status, body = http("POST", url, admin_token, {"messages": [{"body": "\u0000", "key": "a"}]})
    assert status == 200, body
