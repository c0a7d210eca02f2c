"""What every Leasecast socket shares: auth, frame decoding, replies, and an outbox.

Replies are produced by store callbacks, outside any coroutine of the socket,
so they go into an outbox drained by one writer task per socket, in order. A
frame handler never waits for the store: a worker that pipelines a hundred
acks gets them into one group commit instead of a hundred round trips.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer

from consumers.limits import (
    CLOSE_TOO_MANY_SOCKETS,
    RateLimited,
    frame_cost,
    get_limiter,
    limit_key,
    too_many_sockets,
)
from dashboard.live import get_exchange
from gateway.auth import PRINCIPAL_KEY
from gateway.broadcast import get_broadcaster
from gateway.conf import GatewaySettings, gateway_settings
from gateway.engine import Engine, get_engine
from gateway.errors import Forbidden, Invalid, ProtocolError
from gateway.protocol import (
    ClientFrame,
    EnqueueFrame,
    EnqueueManyFrame,
    PublishFrame,
    Ref,
    decode_object,
    encode,
    encode_error,
    parse_frame,
    read_ref,
)
from gateway.scopes import Action, Principal
from gateway.store import Enqueue, EnqueueResult, Result

__all__ = ["CLOSE_FORBIDDEN", "CLOSE_INVALID", "CLOSE_TOO_BIG", "GatewaySocket", "int_param"]

log = logging.getLogger("leasecast.socket")

_socket_ids = itertools.count(1)

CLOSE_TOO_BIG = 1009
CLOSE_INVALID = 4400
CLOSE_FORBIDDEN = 4403


class GatewaySocket(AsyncWebsocketConsumer):
    """Base of the worker and producer sockets.

    Subclasses set :attr:`kind` and :attr:`ops`, and implement :meth:`open`
    (after auth, before accept) and :meth:`handle`.
    """

    kind = "socket"
    ops: frozenset[str] = frozenset()

    principal: Principal
    engine: Engine
    conf: GatewaySettings

    # -- lifecycle

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # These sockets are fed in-process by the engine, never through a
        # channel layer, so messages have one source. A plain loop replaces
        # Channels' await_many_dispatch, which pays a task and an
        # asyncio.wait() per frame.
        self.scope = scope
        self.channel_layer = None
        self.base_send = send
        try:
            while True:
                await self.dispatch(await receive())
        except StopConsumer:
            pass

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels runs close_old_connections() on a worker thread before
        # every message: a thread hop per frame, which dominated the hot path.
        # These sockets never use Django's connections on the loop thread
        # (the store has its own, and auth runs in database_sync_to_async,
        # which cleans up after itself), so the hop is skipped.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        self.conf = gateway_settings()
        self._outbox: list[str] = []
        self._outbox_ready = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._close_code: int | None = None
        self._open = False
        self._slot_held = False
        principal = self.scope.get(PRINCIPAL_KEY)
        if principal is None:
            await self.close()  # before accept: the handshake is refused with 403
            return
        self.principal = principal
        self.limiter = get_limiter()
        self.limit_key = limit_key(principal)
        self._rated = self.limiter.limits.limits_rate
        self.sid = next(_socket_ids)
        self.connected_at = time.time()
        self._verdicts: dict[tuple[str, str], bool] = {}
        self.engine = get_engine()
        # Every process shares its live state with the others' dashboards,
        # whether or not it serves a dashboard itself.
        get_exchange()
        try:
            await self.open(self.query())
        except ProtocolError as exc:
            # Accepted, told why in one error frame, then closed (protocol: Errors).
            await self.accept()
            await self.send(text_data=encode_error(exc.code, exc.detail))
            code = CLOSE_FORBIDDEN if isinstance(exc, Forbidden) else CLOSE_INVALID
            await self.close(code=code)
            return
        if not self.limiter.open_socket(self.limit_key).admitted:
            # Over the token's socket limit: told why, then closed (docs/protocol.md).
            await self.accept()
            refusal = too_many_sockets(principal)
            await self.send(text_data=encode_error(refusal.code, refusal.detail))
            await self.close(code=CLOSE_TOO_MANY_SOCKETS)
            return
        self._slot_held = True
        await self.accept()
        self._open = True
        self._writer = asyncio.create_task(self._write_loop())
        self.engine.sockets.add(self)
        self.opened()

    async def disconnect(self, code: int) -> None:
        if self._slot_held:
            self._slot_held = False
            self.limiter.close_socket(self.limit_key)
        if self._open:
            self._open = False
            self.engine.sockets.discard(self)
            self.closed()
        if self._writer is not None:
            self._writer.cancel()

    def query(self) -> dict[str, str]:
        """The socket URL's query parameters (last value wins)."""
        raw = self.scope.get("query_string", b"").decode("latin-1")
        return {key: values[-1] for key, values in parse_qs(raw).items()}

    async def open(self, params: dict[str, str]) -> None:
        """Check the URL and the caller's scopes; raise to refuse the socket."""

    def opened(self) -> None:
        """Called once the socket is accepted."""

    def closed(self) -> None:
        """Called once when the socket goes away."""

    # -- frames in

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not self._open:
            return
        if text_data is None:
            self.push(encode_error("bad_frame", "frames must be JSON text frames, not binary"))
            return
        if len(text_data) > self.conf.max_frame_bytes:
            # Over the transport limit: the protocol closes with 1009. Under
            # gateway.serve daphne itself enforces the limit; this is for
            # servers started without it.
            await self.close(code=CLOSE_TOO_BIG)
            return
        ref: Ref = None
        charged = False
        try:
            obj = decode_object(text_data)
            ref = read_ref(obj)
            frame = parse_frame(obj, self.ops, self.conf.limits)
            if self._rated:
                charged = True
                self._charge(frame_cost(frame))
            self.handle(frame)
        except RateLimited as exc:
            self.push(encode(exc.frame(), ref))
        except ProtocolError as exc:
            if self._rated and not charged:
                # A bad frame costs one message too, so a flood of them is
                # bounded like any other; over the rate it is told that instead.
                decision = self.limiter.admit(self.limit_key, 1)
                if not decision.admitted:
                    self.push(encode(RateLimited(self.principal, decision).frame(), ref))
                    return
            self.push(encode_error(exc.code, exc.detail, ref))
        except Exception:
            log.exception("%s socket failed on a frame", self.kind)
            self.push(encode_error("unavailable", "internal error; nothing was applied", ref))

    def _charge(self, cost: int) -> None:
        """Charge ``cost`` messages to the caller's rate, or raise :class:`RateLimited`."""
        decision = self.limiter.admit(self.limit_key, cost)
        if not decision.admitted:
            raise RateLimited(self.principal, decision)

    def handle(self, frame: ClientFrame) -> None:
        """Act on one parsed frame (raise ProtocolError to answer with an error)."""
        raise NotImplementedError

    # -- frames out

    def push(self, frame: str) -> None:
        """Queue a frame for sending, after everything queued before it."""
        if self._open:
            self._outbox.append(frame)
            self._outbox_ready.set()

    def reply(self, result: Result, ref: Ref, make: Any) -> None:
        """Push ``make(result)`` as the reply, or the error frame if ``result`` is one."""
        if isinstance(result, ProtocolError):
            self.push(encode_error(result.code, result.detail, ref))
        else:
            self.push(encode(make(result), ref))

    def identity(self) -> dict[str, Any]:
        """The fields every socket's ``describe()`` starts with."""
        client = self.scope.get("client") or ("", 0)
        return {
            "id": self.sid,
            "process": self.engine.process,
            "kind": self.kind,
            "client": f"{client[0]}:{client[1]}",
            "principal": self.principal.name,
            "connected_at": self.connected_at,
        }

    def push_close(self, code: int) -> None:
        """Close the socket with ``code`` once the frames already queued are sent."""
        if self._open and self._close_code is None:
            self._close_code = code
            self._outbox_ready.set()

    async def _write_loop(self) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            frames, self._outbox = self._outbox, []
            for frame in frames:
                await self.send(text_data=frame)
            if self._close_code is not None:
                await self.close(code=self._close_code)
                return

    # -- shared operations

    def allows(self, action: Action, name: str) -> bool:
        """The principal's verdict, remembered per socket (checked on every frame)."""
        key = (action, name)
        verdict = self._verdicts.get(key)
        if verdict is None:
            if len(self._verdicts) > 1000:
                self._verdicts.clear()
            verdict = self._verdicts[key] = self.principal.allows(action, name)
        return verdict

    def require(self, action: Action, name: str) -> None:
        """Raise ``forbidden`` unless :meth:`allows`."""
        if not self.allows(action, name):
            self.principal.require(action, name)

    def publish(self, frame: PublishFrame) -> None:
        """PUBLISH on any socket with the scope (protocol: Publish)."""
        self.require("publish", frame.topic)
        broadcaster = get_broadcaster()
        topic, ref = frame.topic, frame.ref
        seq = broadcaster.publish_now(topic, frame.body_json)
        if seq is not None:
            self.push(encode({"op": "published", "topic": topic, "seq": seq}, ref))
            return

        def landed(task: asyncio.Task[int]) -> None:
            if task.cancelled():
                return
            exc = task.exception()
            if exc is None:
                self.push(encode({"op": "published", "topic": topic, "seq": task.result()}, ref))
            else:
                log.warning("publish to %r failed: %s", topic, exc)
                self.push(encode_error("unavailable", f"publish failed: {exc}", ref))

        task = asyncio.ensure_future(broadcaster.publish(topic, frame.body_json))
        task.add_done_callback(landed)

    def enqueue(
        self, frame: EnqueueFrame | EnqueueManyFrame, default_queue: str | None = None
    ) -> None:
        """ENQUEUE (protocol: Enqueue) or the ``enqueue_many`` extension, on any socket."""
        queue = frame.queue or default_queue
        if queue is None:
            raise Invalid("field 'queue' is required on this socket")
        self.require("enqueue", queue)
        ref = frame.ref
        if isinstance(frame, EnqueueFrame):

            def landed(result: Result) -> None:
                self.reply(result, ref, _enqueued)

            self.engine.submit(Enqueue(queue, (frame.message,)), landed)
        else:

            def landed_many(result: Result) -> None:
                self.reply(result, ref, _enqueued_many)

            self.engine.submit(Enqueue(queue, frame.messages), landed_many)


def int_param(params: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter in ``low..high``, or ``invalid``."""
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise Invalid(f"{name} must be an integer, got {raw[:40]!r}") from None
    if not low <= value <= high:
        raise Invalid(f"{name} must be {low}..{high}, got {value}")
    return value


def _enqueued(results: list[EnqueueResult]) -> dict[str, Any]:
    return {"op": "enqueued", **results[0].as_json()}


def _enqueued_many(results: list[EnqueueResult]) -> dict[str, Any]:
    return {"op": "enqueued_many", "results": [r.as_json() for r in results]}
