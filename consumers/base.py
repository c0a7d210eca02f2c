"""What every Leasecast socket shares: auth, frame decoding, rate charging, replies.

Replies are produced by store callbacks, outside any coroutine of the socket,
so they go into the socket's :class:`~consumers.outbox.Outbox`, sent by one
writer task in order. A frame handler never waits for the store: a worker
that pipelines a hundred acks gets them into one group commit instead of a
hundred round trips.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Hashable
from typing import Any, cast
from urllib.parse import parse_qs

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer

from consumers.limits import RateLimited, frame_cost, limit_key, too_many_sockets
from consumers.outbox import Outbox
from gateway.access.auth import PRINCIPAL_KEY, SessionGrant, principal_for_signed
from gateway.conf import GatewaySettings, gateway_settings
from gateway.core.errors import Forbidden, Invalid, ProtocolError, Unavailable
from gateway.core.protocol import (
    REFRESH_OP,
    SUBSCRIPTION_OPS,
    ClientFrame,
    EnqueueFrame,
    EnqueueManyFrame,
    PublishFrame,
    RefreshFrame,
    SubscriptionFrame,
    decode_object,
    parse_frame,
    parse_refresh,
    parse_subscription_frame,
    read_ref,
)
from gateway.core.ratelimit import TokenLimiter
from gateway.core.scopes import Action, Principal
from gateway.core.subscribe import SubscribeOptions
from gateway.core.wire import (
    CloseCode,
    Ref,
    encode_enqueued,
    encode_enqueued_many,
    encode_error,
    encode_published,
    encode_refreshed,
)
from gateway.engine import Engine
from gateway.runtime import Runtime, current_runtime
from gateway.server.transport import transport_flow
from gateway.store import Enqueue, EnqueueResult, Result
from gateway.topics.broadcast import Published
from gateway.topics.subscription import TopicSubscription

__all__ = [
    "GatewaySocket",
    "int_param",
]

log = logging.getLogger("leasecast.socket")

_socket_ids = itertools.count(1)


class GatewaySocket(AsyncWebsocketConsumer):
    """Base of the worker and producer sockets.

    Subclasses set :attr:`kind` and :attr:`ops`, and implement :meth:`open`
    (after auth, before accept) and :meth:`handle`.
    """

    kind = "socket"
    ops: frozenset[str] = frozenset()

    # -- set by connect(), from the caller and the process's runtime
    conf: GatewaySettings
    principal: Principal
    runtime: Runtime
    engine: Engine
    limiter: TokenLimiter
    #: what the token's rate and socket limits are counted under
    limit_key: Hashable
    sid: int
    connected_at: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: accepted and not gone yet: frames are taken and sent
        self._open = False
        #: in open(): require() records what the URL is checked for
        self._opening = True
        #: counted in the token's socket limit (given back when it closes)
        self._slot_held = False
        #: the token's rate applies to every frame
        self._rated = False
        self._outbox = Outbox(close=self.close, writable_changed=self.writable_changed)
        # What the socket's URL was checked for while opening (require() during
        # open()): a refreshed token must still allow all of it.
        self._url_checks: set[tuple[Action, str]] = set()
        #: the principal's verdicts, remembered (checked on every frame)
        self._verdicts: dict[tuple[str, str], bool] = {}
        # -- token lifetime: a signed token's exp, a stored token, a session
        self._expiry: asyncio.TimerHandle | None = None
        self._watched_token: int | None = None
        self._watched_session: SessionGrant | None = None

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
        if message["type"] == "websocket.receive":
            # The hot path, one call per frame: Channels would look the handler
            # up by name and pass through websocket_receive() and receive().
            text = message.get("text")
            if text is not None and self._open and len(text) <= self.conf.max_frame_bytes:
                self.receive_text(text)
                return
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        self.conf = gateway_settings()
        self._limits = self.conf.limits
        principal = self.scope.get(PRINCIPAL_KEY)
        if principal is None:
            await self.close()  # before accept: the handshake is refused with 403
            return
        self.principal = principal
        self.runtime = current_runtime()
        self.limiter = self.runtime.limiter
        self.limit_key = limit_key(principal)
        self._rated = self.limiter.limits.limits_rate
        self.sid = next(_socket_ids)
        self.connected_at = time.time()
        self.engine = self.runtime.engine
        try:
            await self.open(self.query())
            self._opening = False
        except ProtocolError as exc:
            # Accepted, told why in one error frame, then closed (protocol: Errors).
            await self.accept()
            await self.send(text_data=encode_error(exc.code, exc.detail))
            if isinstance(exc, Forbidden):
                code = CloseCode.FORBIDDEN
            elif isinstance(exc, Unavailable):
                code = CloseCode.UNAVAILABLE  # transient: the client retries
            else:
                code = CloseCode.INVALID
            await self.close(code=code)
            return
        if not self.limiter.open_socket(self.limit_key).admitted:
            # Over the token's socket limit: told why, then closed (docs/protocol.md).
            await self.accept()
            refusal = too_many_sockets(principal, self.limiter.limits.max_sockets)
            await self.send(text_data=encode_error(refusal.code, refusal.detail))
            await self.close(code=CloseCode.TOO_MANY_SOCKETS)
            return
        self._slot_held = True
        await self.accept()
        self._open = True
        # The server's send: Channels' send() adds two calls a frame.
        self._outbox.start(self.base_send)
        flow = transport_flow(self.scope)  # daphne: its transport's pause/resume
        if flow is not None:
            flow.listen(self._outbox.window.transport_changed)
        self.engine.sockets.add(self)
        self.runtime.metrics.registry.socket_opened(self.kind)
        self._watch_token()
        self.opened()

    async def disconnect(self, code: int) -> None:
        self._unwatch_token()
        if self._slot_held:
            self._slot_held = False
            self.limiter.close_socket(self.limit_key)
        if self._open:
            self._open = False
            self.engine.sockets.discard(self)
            self.runtime.metrics.registry.socket_closed(self.kind)
            self.closed()
        self._outbox.stop()

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
            await self.close(code=CloseCode.MESSAGE_TOO_BIG)
            return
        self.receive_text(text_data)

    def receive_text(self, text_data: str) -> None:
        """Act on one text frame of an open socket, within the size limit."""
        obj: dict[str, Any] | None = None
        charged = False
        try:
            obj = decode_object(text_data)
            frame: ClientFrame | RefreshFrame | SubscriptionFrame
            op = obj.get("op")
            if op == REFRESH_OP:
                # Every socket kind takes refresh (protocol 1.1: token
                # lifetime), so it is handled here, whatever the subclass's ops.
                frame = parse_refresh(obj)
            elif isinstance(op, str) and op in SUBSCRIPTION_OPS and op in self.ops:
                # subscribe / unsubscribe: the multiplexed socket's own frames.
                frame = parse_subscription_frame(obj)
            else:
                frame = parse_frame(obj, self.ops, self._limits)
            if self._rated:
                charged = True
                self._charge(
                    frame_cost(frame)
                    if not isinstance(frame, RefreshFrame | SubscriptionFrame)
                    else 1
                )
            if isinstance(frame, RefreshFrame):
                self.refresh(frame)
            elif isinstance(frame, SubscriptionFrame):
                self.handle_subscription(frame)
            else:
                self.handle(frame)
        except RateLimited as exc:
            self.push(exc.error_frame(_ref_of(obj)))
        except ProtocolError as exc:
            ref = _ref_of(obj)
            if self._rated and not charged:
                # A bad frame costs one message too, so a flood of them is
                # bounded like any other; over the rate it is told that instead.
                decision = self.limiter.admit(self.limit_key, 1)
                if not decision.admitted:
                    limited = RateLimited(self.principal, decision, self.limiter.limits.rate)
                    self.push(limited.error_frame(ref))
                    return
            self.push(encode_error(exc.code, exc.detail, ref))
        except Exception:
            log.exception("%s socket failed on a frame", self.kind)
            self.push(
                encode_error("unavailable", "internal error; nothing was applied", _ref_of(obj))
            )

    def _charge(self, cost: int) -> None:
        """Charge ``cost`` messages to the caller's rate, or raise :class:`RateLimited`."""
        decision = self.limiter.admit(self.limit_key, cost)
        if not decision.admitted:
            raise RateLimited(self.principal, decision, self.limiter.limits.rate)

    def handle(self, frame: ClientFrame) -> None:
        """Act on one parsed frame (raise ProtocolError to answer with an error)."""
        raise NotImplementedError

    def handle_subscription(self, frame: SubscriptionFrame) -> None:
        """Act on ``subscribe`` / ``unsubscribe`` (only sockets with those ``ops``)."""
        raise NotImplementedError

    def subscribe(self, topic: str, options: SubscribeOptions) -> TopicSubscription:
        """A subscription to ``topic`` for this socket's caller, not prepared yet.

        Presence lists the caller as the signed token's ``sub``, the stored
        token's name or the session user's username, with the signed token's
        ``info`` claim (protocol 1.2: Presence).
        """
        principal = self.principal
        return TopicSubscription(
            self.runtime.broadcaster,
            self.runtime.broadcaster.presence,
            topic,
            options,
            user=principal.subject or principal.name,
            info=principal.info,
        )

    # -- frames out

    def push(self, frame: str) -> None:
        """Queue a frame for sending, after everything queued before it."""
        if self._open:
            self._outbox.push(frame)

    def writable_changed(self, writable: bool) -> None:
        """The socket started (``writable``) or stopped taking frames: a few are
        pending already, or its transport's write buffer is full (design decision 14)."""

    def reply(self, result: Result, ref: Ref, encode_reply: Callable[[Any, Ref], str]) -> None:
        """Push ``encode_reply(result, ref)``, or the error frame if ``result`` is one."""
        if isinstance(result, ProtocolError):
            self.push(encode_error(result.code, result.detail, ref))
        else:
            self.push(encode_reply(result, ref))

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

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        """Close the socket with ``code`` (a :class:`CloseCode`) now."""
        # A plain int: daphne's WebSocket library refuses an int subclass such
        # as CloseCode and drops the connection (1006) instead of closing.
        await super().close(int(code) if isinstance(code, CloseCode) else code, reason)

    def push_close(self, code: int) -> None:
        """Close the socket with ``code`` once the frames already queued are sent."""
        if self._open:
            # A plain int: daphne's WebSocket library refuses a subclass such
            # as CloseCode and drops the connection (1006) instead of closing.
            self._outbox.close_after(int(code))

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
        if self._opening:
            self._url_checks.add((action, name))
        if not self.allows(action, name):
            self.principal.require(action, name)

    # -- token lifetime (protocol 1.1: Signed connection tokens and token lifetime)

    def _watch_token(self) -> None:
        """Close at a signed token's ``exp``; watch a stored token for revocation,
        and a session for its end or a loss of rights (protocol 1.2)."""
        principal = self.principal
        if principal.expires_at is not None:
            self._arm_token_expiry(principal.expires_at)
        if principal.token_id is not None:
            self._watched_token = principal.token_id
            self.runtime.revocations.add(principal.token_id, self)
        session = self.scope.get("session")
        session_key = getattr(session, "session_key", None) if principal.user_id else None
        if session_key:
            self._watched_session = SessionGrant(session_key, principal)
            self.runtime.revocations.add_session(self._watched_session, self)

    def _unwatch_token(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._watched_token is not None:
            self.runtime.revocations.discard(self._watched_token, self)
            self._watched_token = None
        if self._watched_session is not None:
            self.runtime.revocations.discard_session(self._watched_session, self)
            self._watched_session = None

    def _arm_token_expiry(self, expires_at: float) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        # A little after exp, never before it: asyncio may run a timer up to
        # its clock resolution early.
        delay = max(0.0, expires_at - time.time()) + 0.05
        self._expiry = asyncio.get_running_loop().call_later(delay, self._token_expired)

    def _token_expired(self) -> None:
        self._expiry = None
        self.push_close(CloseCode.UNAUTHORIZED)

    def token_revoked(self) -> None:
        """The stored token of this socket was revoked or deleted, or its session
        ended or lost rights the socket was opened with: close with 4401."""
        self._watched_token = None
        self._watched_session = None
        self.push_close(CloseCode.UNAUTHORIZED)

    def refresh(self, frame: RefreshFrame) -> None:
        """``refresh``: go on under a new signed token of the same ``sub``.

        The new token's scopes apply from now on, and the socket closes at
        its ``exp`` instead. Refused with ``forbidden``, changing nothing: a
        socket not opened with a signed token, a new token that is invalid
        or of another ``sub``, or one whose scopes no longer cover what the
        socket's URL was opened for (its queue or topic; the dashboard needs
        ``admin``).
        """
        old = self.principal
        if old.subject is None:
            raise Forbidden("only a socket opened with a signed token can be refreshed")
        new = principal_for_signed(frame.token)
        if new is None:
            raise Forbidden("the new token is not a valid signed token")
        if new.subject != old.subject:
            raise Forbidden("the new token is for another subject")
        lost = sorted(
            f"{action} on {name!r}"
            for action, name in self._url_checks
            if not new.allows(action, name)
        )
        if self.kind == "dashboard" and not new.allows("view_queue"):
            lost.append("admin")
        if lost:
            raise Forbidden("the new token does not allow this socket's " + ", ".join(lost))
        assert new.expires_at is not None  # every signed token has one
        self.principal = new
        self._verdicts.clear()
        self._arm_token_expiry(new.expires_at)
        expires_in = max(0, int(new.expires_at - time.time()))
        self.push(encode_refreshed(expires_in, frame.ref))

    def publish(self, frame: PublishFrame) -> None:
        """PUBLISH on any socket with the scope (protocol: Publish)."""
        self.require("publish", frame.topic)
        broadcaster = self.runtime.broadcaster
        topic, ref = frame.topic, frame.ref
        done = broadcaster.publish_now(topic, frame.body_json)
        if done is not None:
            self.push(encode_published(topic, done.offset, done.epoch, ref))
            return

        def landed(task: asyncio.Future[Published]) -> None:
            if task.cancelled():
                return
            exc = task.exception()
            if exc is None:
                done = task.result()
                self.push(encode_published(topic, done.offset, done.epoch, ref))
            elif isinstance(exc, ProtocolError):  # backpressure, or unavailable storage
                self.push(encode_error(exc.code, exc.detail, ref))
            else:
                log.warning("publish to %r failed: %s", topic, exc)
                self.push(encode_error("unavailable", f"publish failed: {exc}", ref))

        task = broadcaster.publish(topic, [frame.body_json])
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
                if isinstance(result, ProtocolError):
                    self.push(encode_error(result.code, result.detail, ref))
                else:
                    (enqueued,) = cast(list[EnqueueResult], result)
                    self.push(encode_enqueued(enqueued.id, enqueued.duplicate, ref))

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


def _ref_of(obj: dict[str, Any] | None) -> Ref:
    """The ``ref`` to echo in an error reply: read only when one is needed."""
    return None if obj is None else read_ref(obj)


def _enqueued_many(results: list[EnqueueResult], ref: Ref) -> str:
    return encode_enqueued_many([r.as_json() for r in results], ref)
