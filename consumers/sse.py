"""Server-sent events: ``GET /sse/topics/TOPIC/`` (protocol 1.2: Server-sent events).

An event stream is a topic subscription like a subscriber socket's, in the
same broadcaster: the same bounded buffer, ``on_full`` policy, resume
(``since`` + ``epoch``, ``recover=latest``, or the ``Last-Event-ID`` header
an ``EventSource`` sends when it reconnects) and presence (design decision
17). Only the adapter differs: there is no credit. The stream takes what
the dispatcher sends while its response is *writable*, as a socket does
(design decision 14): a few chunks queued here at most, and, under daphne,
the connection's write buffer not full (its request carries a
:class:`~gateway.server.transport.TransportFlow`); under uvicorn the server's
``send`` waits while the buffer is full, so the chunks pile up here and
are counted. A client that stops reading therefore fills its own buffer,
and its policy applies: ``drop_oldest`` / ``drop_newest`` drop and tell
``event: dropped``; ``block`` holds the topic up to the block wait, then
the stream ends.

The broadcaster pushes the frames a subscriber socket would get; each is
written out as events here:

- ``messages`` -> ``event: dropped`` (``{"dropped": n}``) when some were
  dropped, then per message ``id: EPOCH:OFFSET``, ``event: message``,
  ``data: BODY``;
- ``subscribed`` -> ``event: subscribed`` (``{"epoch", "offset", "recovered"}``);
- ``join`` / ``leave`` / ``presence`` -> ``event: join`` / ``event: leave``
  (a ``presence`` frame is one event per member).

A comment line goes out every ``GATEWAY_SSE_KEEPALIVE`` seconds (at most
15), so proxies do not close an idle stream. The stream ends (the response
ends; an ``EventSource`` reconnects by itself, resuming with
``Last-Event-ID``) when a ``block`` buffer stays full past the block wait,
when the topic's offsets restart, when its token expires or is revoked, when
an operator disconnects it, or when the process stops. Streams are listed
with the process's sockets (``/api/stats``, the dashboard: kind ``sse``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from consumers.limits import RateLimited, limit_key, too_many_sockets
from gateway.access.auth import principal_for_signed, principal_for_token, token_from_headers
from gateway.access.tokens import is_signed_token
from gateway.conf import gateway_settings
from gateway.core.errors import Invalid, ProtocolError, Unauthorized
from gateway.core.fanout import MAX_CREDIT
from gateway.core.protocol import check_name
from gateway.core.scopes import Principal
from gateway.core.subscribe import SubscribeOptions, options_from_query
from gateway.core.wire import CloseCode
from gateway.runtime import Runtime, current_runtime
from gateway.server.transport import SocketWindow, TransportFlow, transport_flow
from gateway.topics.subscription import TopicSubscription

__all__ = ["EventStream", "parse_last_event_id", "topic_events"]

log = logging.getLogger("leasecast.sse")

#: The longest gap between two keep-alive comments the protocol allows.
MAX_KEEPALIVE = 15.0
#: Where the response starts: a comment, so the headers leave at once (daphne
#: writes them with the first body bytes) and a page's ``onopen`` fires.
OPENING = b": leasecast event stream\n\n"
KEEPALIVE = b": keep-alive\n\n"
#: Stream ids, counted apart from the sockets' (which count from 1), so that
#: ``/api/stats`` and the dashboard can name either kind by id in one process.
_stream_ids = itertools.count(1 << 40)
#: Why a stream ends when it is closed like a socket (its last comment).
_CLOSE_REASONS: dict[int, str] = {
    CloseCode.GOING_AWAY: "shutdown",
    CloseCode.DISCONNECTED_BY_OPERATOR: "disconnected by an operator",
}

#: The epoch a malformed ``Last-Event-ID`` resumes from: never a topic's (they
#: are hex), so the stream starts at the head, told ``recovered: false``.
NO_EPOCH = "-"


def parse_last_event_id(value: str | None) -> tuple[int, str] | None:
    """``Last-Event-ID: EPOCH:OFFSET`` as ``(offset, epoch)``; None if absent or malformed.

    A malformed one (not ours, cut, out of range) is no error: the stream
    starts fresh, and says so with ``recovered: false``.
    """
    if value is None:
        return None
    epoch, sep, raw_offset = value.strip().rpartition(":")
    if not sep or not 1 <= len(epoch) <= 64 or not epoch.isprintable():
        return None
    if not raw_offset.isascii() or not raw_offset.isdigit() or len(raw_offset) > 19:
        return None
    offset = int(raw_offset)
    if offset > 2**63 - 1:
        return None
    return offset, epoch


class EventStream:
    """One event stream: a subscription's sink, and the bytes on their way to the response.

    Built by :func:`topic_events` once the request is authorized; after
    :meth:`prepare` and :meth:`attach`, iterating it (Django's streaming
    response does) yields the stream's chunks until it ends. :meth:`close`
    (Django calls it when the response is done, from any thread) and the
    iterator's end both release the subscription; the second is a no-op.

    Args:
        runtime: the process's runtime (broadcaster, presence, limiter,
            revocations, metrics).
        principal: who reads the stream.
        topic: its topic.
        options: the subscription's options (its credit is not the client's:
            an event stream has none, the stream keeps it topped up).
        flow: the daphne request's transport flow, or None (uvicorn).
        keepalive: seconds between keep-alive comments.
        client: the reader's address (``host:port``), for the stats.
    """

    kind = "sse"

    def __init__(
        self,
        *,
        runtime: Runtime,
        principal: Principal,
        topic: str,
        options: SubscribeOptions,
        flow: TransportFlow | None,
        keepalive: float,
        client: str = "",
    ) -> None:
        self.runtime = runtime
        self.principal = principal
        self.topic = topic
        self.keepalive = keepalive
        self.subscription = TopicSubscription(
            runtime.broadcaster,
            runtime.broadcaster.presence,
            topic,
            dataclasses.replace(options, credit=MAX_CREDIT),
            user=principal.subject or principal.name,
            info=principal.info,
        )
        self._loop = asyncio.get_running_loop()
        self._flow = flow
        self._chunks: list[bytes] = []
        self._ready = asyncio.Event()
        #: why the stream ends (a comment on its last line), once it must
        self._ended: str | None = None
        self._closed = False
        self._counted = False
        self._epoch = ""
        self._expiry: asyncio.TimerHandle | None = None
        self._watched_token: int | None = None
        self._keepalive_timer: asyncio.TimerHandle | None = None
        self._comment_due = False
        #: as a socket's: this stream's id in ``/api/stats`` and the dashboard
        self.sid = next(_stream_ids)
        self.connected_at = time.time()
        self.client = client
        self._listed = False
        #: chunks queued and the transport's room: the stream's writability
        self.window = SocketWindow(self._writable_changed)
        if flow is not None:
            flow.listen(self.window.transport_changed)

    # -- lifecycle

    async def prepare(self) -> None:
        """The topic's head and the resume decided (:meth:`TopicSubscription.prepare`).

        Raises:
            Invalid: ``presence`` on a topic without presence.
            Unavailable: the shared streams could not be read.
        """
        await self.subscription.prepare()

    def attach(self) -> None:
        """Start the subscription: ``subscribed`` (on a resume), replay, then live."""
        sub = self.subscription
        # The epoch its events' ids carry: the one prepare() followed (if the
        # topic's offsets restart, the stream ends).
        self._epoch = self.runtime.broadcaster.epoch_of(self.topic) or ""
        sub.attach(self)
        if sub.state is None:
            return  # the topic restarted meanwhile: ended already
        if not self.window.writable:
            sub.set_writable(False)
        self.runtime.metrics.registry.socket_opened(self.kind)
        self._counted = True
        # Listed with the process's sockets: /api/stats and the dashboard show
        # it (an operator may disconnect it), and a shutdown closes it.
        self.runtime.engine.sockets.add(self)
        self._listed = True
        principal = self.principal
        if principal.expires_at is not None:
            delay = max(0.0, principal.expires_at - time.time()) + 0.05
            self._expiry = self._loop.call_later(delay, self.end, "token expired")
        if principal.token_id is not None:
            self._watched_token = principal.token_id
            self.runtime.revocations.add(principal.token_id, self)

    def close(self) -> None:
        """Release the subscription (idempotent; callable from any thread)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._release()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._release)

    def _release(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.subscription.close()
        if self._listed:
            self.runtime.engine.sockets.discard(self)
        if self._counted:
            self.runtime.metrics.registry.socket_closed(self.kind)
        self.runtime.limiter.close_socket(limit_key(self.principal))
        if self._expiry is not None:
            self._expiry.cancel()
        if self._watched_token is not None:
            self.runtime.revocations.discard(self._watched_token, self)
        if self._flow is not None:
            self._flow.detach()

    def end(self, reason: str) -> None:
        """End the stream once what is queued is sent (the first reason wins)."""
        if self._ended is None:
            self._ended = reason
            self._ready.set()

    def push_close(self, code: int) -> None:
        """What closes a socket ends a stream: a shutdown (1001), an operator (4000)."""
        self.end(_CLOSE_REASONS.get(code, f"closed ({int(code)})"))

    def describe(self) -> dict[str, Any]:
        """This stream's live state, as a socket's, for ``/api/stats`` and the dashboard."""
        return {
            "id": self.sid,
            "process": self.runtime.engine.process,
            "kind": self.kind,
            "client": self.client,
            "principal": self.principal.name,
            "connected_at": self.connected_at,
            **self.subscription.describe(),
        }

    # -- what the subscription calls (its SubscriptionSink), and the revocation watch

    def push(self, frame: str) -> None:
        """A frame a subscriber socket would get: queued as its events."""
        if self._closed or self._ended is not None:
            return
        try:
            chunk = self._events(frame)
        except Exception:
            # Never into the broadcaster's sender, which serves every subscriber.
            log.exception("event stream of %r: could not write a frame as events", self.topic)
            self.end("internal error")
            return
        if chunk:
            self._chunks.append(chunk)
            self.window.queued()
            self._ready.set()

    def slow_consumer(self) -> None:
        """A ``block`` buffer stayed full past the block wait: the stream ends."""
        self.end("slow_consumer")

    def stream_restarted(self) -> None:
        """The topic's offsets restarted: the stream ends (a reconnect starts afresh)."""
        self.end("stream_restarted")

    def token_revoked(self) -> None:
        """Its stored token was revoked or deleted: the stream ends."""
        self._watched_token = None
        self.end("token revoked")

    def _writable_changed(self, writable: bool) -> None:
        if not self._closed:
            self.subscription.set_writable(writable)

    # -- frames to events

    def _events(self, frame: str) -> bytes:
        obj = orjson.loads(frame)
        op = obj.get("op")
        if op == "messages":
            out = []
            dropped = obj.get("dropped") or 0
            if dropped:
                out.append(_event("dropped", {"dropped": dropped}))
            prefix = f"id: {self._epoch}:".encode()
            for item in obj["items"]:
                out.append(
                    b"%s%d\nevent: message\ndata: %s\n\n"
                    % (prefix, item["offset"], orjson.dumps(item["body"]))
                )
            return b"".join(out)
        if op == "subscribed":
            fields = {k: obj.get(k) for k in ("epoch", "offset", "recovered")}
            return _event("subscribed", fields)
        if op in ("join", "leave"):
            return _event(op, {k: v for k, v in obj.items() if k != "op"})
        if op == "presence":
            topic = obj.get("topic", self.topic)
            joins = [_event("join", {"topic": topic, **m}) for m in obj.get("joins") or ()]
            leaves = [_event("leave", {"topic": topic, **m}) for m in obj.get("leaves") or ()]
            return b"".join(joins + leaves)
        log.debug("event stream of %r: no event for a %r frame", self.topic, op)
        return b""

    # -- the response's body

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._body()

    async def _body(self) -> AsyncIterator[bytes]:
        loop = self._loop
        window = self.window
        try:
            yield OPENING
            # One timer for the keep-alive, rather than a timed wait (a task
            # and a timer) each time the stream waits for events.
            self._keepalive_timer = loop.call_later(self.keepalive, self._keepalive_due)
            while True:
                if window.transport_paused:
                    # daphne's write buffer is full: nothing more is taken from
                    # the buffer until it drains (the policy acts meanwhile).
                    await window.transport_ready.wait()
                if not self._chunks and self._ended is None and not self._comment_due:
                    await self._ready.wait()
                self._ready.clear()
                chunks, self._chunks = self._chunks, []
                out = b"".join(chunks)
                if self._comment_due:
                    self._comment_due = False
                    out += KEEPALIVE
                    self._keepalive_timer = loop.call_later(self.keepalive, self._keepalive_due)
                if self._ended is not None:
                    yield out + b": end (%s)\n\n" % self._ended.encode()
                    return
                if out:
                    yield out
                for _ in chunks:
                    window.sent()
                self._top_up()
        finally:
            if self._keepalive_timer is not None:
                self._keepalive_timer.cancel()
            self._release()

    def _keepalive_due(self) -> None:
        self._comment_due = True
        self._ready.set()

    def _top_up(self) -> None:
        """Keep the subscription's credit full: an event stream has no credit of its own."""
        state = self.subscription.state
        if state is not None and state.credit < MAX_CREDIT // 2:
            self.subscription.grant(MAX_CREDIT - state.credit)


def _client_of(request: HttpRequest) -> str:
    """``host:port`` of the reader, as a socket's ``client`` reads."""
    client = getattr(request, "scope", {}).get("client") or ("", 0)
    return f"{client[0]}:{client[1]}"


def _event(name: str, data: Any) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (name.encode(), orjson.dumps(data))


def _error(exc: ProtocolError) -> JsonResponse:
    response = JsonResponse({"error": exc.code, "detail": exc.detail}, status=exc.http_status)
    if isinstance(exc, RateLimited):
        response["Retry-After"] = exc.retry_after_header()
    return response


async def _principal(request: HttpRequest) -> Principal:
    """The token's principal: ``Authorization: Bearer`` first, else ``?token=``."""
    headers = ((k.lower().encode(), v.encode("latin-1")) for k, v in request.headers.items())
    secret = token_from_headers(headers) or request.GET.get("token") or None
    if secret is None:
        raise Unauthorized("send 'Authorization: Bearer TOKEN' or ?token=TOKEN")
    if is_signed_token(secret):
        principal = principal_for_signed(secret)  # an HMAC: no thread hop
    else:
        principal = await database_sync_to_async(principal_for_token)(secret)
    if principal is None:
        raise Unauthorized("unknown, revoked or expired token")
    return principal


def _options(params: Mapping[str, str], last_event_id: str | None) -> SubscribeOptions:
    """The subscription's options.

    ``Last-Event-ID`` (what an ``EventSource`` sends when it reconnects) is
    more recent than the URL it reconnects to: a valid one resumes from it
    whatever ``since``/``epoch``/``recover`` the URL says; a malformed one
    starts a fresh subscription told ``recovered: false`` (a resume from an
    epoch no topic has: nothing is replayed, and the head is where it starts).
    """
    options = options_from_query(params)
    if options.credit != 256 and "credit" in params:
        raise Invalid("an event stream has no credit: leave out the credit parameter")
    if last_event_id is None:
        return options
    since, epoch = parse_last_event_id(last_event_id) or (0, NO_EPOCH)
    return dataclasses.replace(options, since=since, epoch=epoch, recover_latest=False)


@csrf_exempt  # a token, never a session: there is nothing to forge
async def topic_events(request: HttpRequest, topic: str) -> HttpResponseBase:
    """``GET /sse/topics/TOPIC/``: the topic's messages as ``text/event-stream``.

    Refusals are JSON, as for the HTTP API: 401 ``unauthorized`` without a
    valid token, 400 ``invalid`` for bad parameters, 403 ``forbidden``
    without ``subscribe`` on the topic, 429 ``backpressure`` over the
    token's rate or socket limit (an event stream counts as a socket).
    """
    runtime = current_runtime()
    # daphne: the request's transport flow (gateway.server.transport); taken
    # off the request again whenever no stream uses it.
    flow = transport_flow(request.scope) if hasattr(request, "scope") else None
    try:
        principal = await _principal(request)
        if request.method != "GET":
            refused = _error(Invalid(f"use GET, not {request.method}"))
            refused.status_code = 405
            refused["Allow"] = "GET"
            if flow is not None:
                flow.detach()
            return refused
        key = limit_key(principal)
        decision = runtime.limiter.admit(key, 1)
        if not decision.admitted:
            raise RateLimited(principal, decision, runtime.limiter.limits.rate)
        topic = check_name(topic, "topic")
        params = {k: request.GET.getlist(k)[-1] for k in request.GET if k != "token"}
        options = _options(params, request.headers.get("Last-Event-ID"))
        principal.require("subscribe", topic)
        if not runtime.limiter.open_socket(key).admitted:
            raise too_many_sockets(principal, runtime.limiter.limits.max_sockets)
    except BaseException as exc:
        if flow is not None:
            flow.detach()
        if isinstance(exc, ProtocolError):
            return _error(exc)
        raise
    stream = EventStream(
        runtime=runtime,
        principal=principal,
        topic=topic,
        options=options,
        flow=flow,
        keepalive=min(MAX_KEEPALIVE, max(0.05, gateway_settings().sse_keepalive)),
        client=_client_of(request),
    )
    try:
        await stream.prepare()
        stream.attach()
    except BaseException as exc:
        stream.close()  # the flow too
        if isinstance(exc, ProtocolError):
            return _error(exc)
        raise
    response = StreamingHttpResponse(stream, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache, no-store"
    # nginx buffers responses by default: an event stream must pass at once.
    response["X-Accel-Buffering"] = "no"
    return response
