"""Limits the server layer puts on clients before the application sees them.

``python -m gateway.serve`` installs these under daphne and under uvicorn
alike (docs/operations.md, Limits on anonymous clients):

- **Request bodies** (``GATEWAY_MAX_REQUEST_BYTES``, default 16 MiB). A body
  over the limit is answered 413 ``too_large`` in the gateway's error JSON
  while it arrives, before authentication: a declared ``Content-Length`` over
  the limit at once, a chunked body as it passes the limit. A client that
  sends more costs the gateway no more than the limit in memory. daphne
  (through Twisted) would otherwise take the whole body, then hand it to the
  application in one go: a 500 MB body took the process from 121 MB to 647 MB
  of memory, and it kept it.

- **Request heads** (``GATEWAY_REQUEST_HEAD_TIMEOUT``, default 20 s). A
  connection must complete each request head (request line and headers;
  a WebSocket handshake is one) within this many seconds of starting it,
  however often it sends a line: otherwise it is answered 408 and closed.
  An idle timeout alone is reset by every line, so a client sending one
  header line every 5 s kept a connection for ever.
- **Connections per address** (``GATEWAY_MAX_PENDING_PER_ADDRESS``, default
  a quarter of the process's file limit, between 64 and 1,024). At most this
  many connections from one client address may be waiting for their request
  head to end (unauthenticated: nothing is known of who they are yet); one
  more is answered 503 ``unavailable`` and closed. 1,009 slow connections
  from one address had used up a 1,024 file limit and ``/healthz`` failed.
  The serving process first raises its soft file limit to the hard one
  (:func:`raise_file_limit`), so on most machines the default is 1,024: a
  load balancer's burst of handshakes (all from its one address) passes,
  and one address still cannot use up the files.

Pure parts (the settings, the response) import neither server: importing
``daphne.server`` installs Twisted's asyncio reactor, which a uvicorn
process must not do, so the daphne classes are built on first use.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gateway.conf import environ_settings

__all__ = [
    "BodyLimit",
    "PendingHeads",
    "default_max_pending_per_address",
    "head_timeout",
    "max_pending_per_address",
    "max_request_bytes",
    "raise_file_limit",
    "too_large_body",
]

logger = logging.getLogger("leasecast.server")

#: ``GATEWAY_MAX_PENDING_PER_ADDRESS``'s default is this share of the file
#: limit, clamped to the bounds below.
PENDING_SHARE_OF_FILE_LIMIT = 4
MIN_DEFAULT_PENDING = 64
MAX_DEFAULT_PENDING = 1024
#: Seconds a connection whose body was refused is still read (and the bytes
#: dropped) after the 413 went out, so the client reads the answer instead of
#: a reset; then it is closed.
LINGER_SECONDS = 5.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# The settings below are read through the one settings object
# (gateway.conf.environ_settings), which holds their defaults and checks.


def max_request_bytes() -> int:
    """The largest request body accepted (``GATEWAY_MAX_REQUEST_BYTES``, 16 MiB)."""
    return environ_settings().max_request_bytes


def head_timeout() -> float:
    """Seconds a request head may take (``GATEWAY_REQUEST_HEAD_TIMEOUT``, 20; 0: no deadline)."""
    return environ_settings().request_head_timeout


def raise_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit.

    Returns the soft limit in force afterwards. Servers do this (nginx's
    ``worker_rlimit_nofile``, systemd's services): a default soft limit of
    1,024 is a few hundred clients.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # a container may refuse: keep the soft limit
            pass
    return _finite(soft)


def _finite(limit: int) -> int:
    import resource

    return 1 << 20 if limit == resource.RLIM_INFINITY else int(limit)


def default_max_pending_per_address(file_limit: int) -> int:
    """A quarter of ``file_limit``, between 64 and 1,024: one address can
    never hold more than a quarter of the process's files with unfinished
    heads, and a balancer's burst of a few hundred handshakes still passes."""
    share = file_limit // PENDING_SHARE_OF_FILE_LIMIT
    return max(MIN_DEFAULT_PENDING, min(MAX_DEFAULT_PENDING, share))


def max_pending_per_address() -> int:
    """Connections one address may have waiting for their head to end.

    ``GATEWAY_MAX_PENDING_PER_ADDRESS``; 0 is no cap. Unset, a quarter of the
    process's file limit (between 64 and 1,024), read after
    :func:`raise_file_limit`.
    """
    cap = environ_settings().max_pending_per_address
    if cap is None:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return default_max_pending_per_address(_finite(soft))
    return cap


class PendingHeads:
    """Per client address, the connections whose request head has not ended yet.

    Args:
        cap: most such connections per address; 0 is no cap.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.counts: dict[str, int] = {}

    def acquire(self, address: str) -> bool:
        """Count one more for ``address``; False (and nothing counted) if it is at the cap."""
        count = self.counts.get(address, 0)
        if self.cap and count >= self.cap:
            return False
        self.counts[address] = count + 1
        return True

    def release(self, address: str) -> None:
        """One connection of ``address`` ended its head or closed."""
        count = self.counts.get(address, 0) - 1
        if count > 0:
            self.counts[address] = count
        else:
            self.counts.pop(address, None)


def _error_json(code: str, detail: str) -> bytes:
    return json.dumps({"error": code, "detail": detail}).encode()


def _raw_response(status: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def head_timeout_response(seconds: float) -> bytes:
    """408: the request head did not end within the deadline."""
    detail = f"request head not complete within {seconds:g} s (GATEWAY_REQUEST_HEAD_TIMEOUT)"
    return _raw_response("408 Request Timeout", _error_json("invalid", detail))


def too_many_pending_response(cap: int) -> bytes:
    """503: the address has too many connections waiting for their head to end."""
    detail = (
        f"more than {cap} connections from this address have not sent their request "
        "(GATEWAY_MAX_PENDING_PER_ADDRESS)"
    )
    return _raw_response("503 Service Unavailable", _error_json("unavailable", detail))


def too_large_body(limit: int) -> bytes:
    """The 413 answer's JSON, in the gateway's error shape (``{"error", "detail"}``)."""
    detail = f"request body over {limit} bytes (GATEWAY_MAX_REQUEST_BYTES)"
    return json.dumps({"error": "too_large", "detail": detail}).encode()


def too_large_response(limit: int) -> bytes:
    """The whole HTTP/1.1 413 answer, for a server that writes it itself (daphne)."""
    return _raw_response("413 Request Entity Too Large", too_large_body(limit))


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed length itself
    return None


class BodyLimit:
    """ASGI middleware: an HTTP request body over ``limit`` bytes is answered 413.

    Used under uvicorn, which hands the body to the application as it
    arrives (and holds at most 64 KiB of it unread): a declared length over
    the limit is refused before the application is called; a body that
    passes the limit while the application reads it is answered 413 then,
    and the application is told the client went away
    (``http.disconnect``), so it stops. Whatever it sends after that is
    dropped.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.limit:
            await self._refuse(send)
            return
        received = 0
        refused = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    refused = True
                    if not started:
                        await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            if message.get("type") == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited_receive, guarded_send)

    async def _refuse(self, send: Send) -> None:
        body = too_large_body(self.limit)
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _discard(data: bytes) -> None:
    """A refused request's connection: what still arrives is dropped unread."""


def daphne_http_factory(
    base: type[Any], limit: int, *, head_seconds: float, pending: PendingHeads
) -> type[Any]:
    """A subclass of daphne's ``HTTPFactory`` with the limits of this module.

    Its connections keep the head deadline (``head_seconds``, 0 for none)
    and count themselves in ``pending`` while a request head is under way:
    from the connection (or the previous response on a kept-alive one) to
    the end of the head. A WebSocket's head ends its HTTP life; a refused
    one closes the connection.

    Its requests refuse bodies over ``limit``.

    Twisted reads a request's whole body (to memory, or a temporary file
    from 100 kB) before daphne sees the request, and daphne then queues all
    of it for the application at once. The request class here counts the
    body as Twisted decodes it: a declared length over the limit is
    answered at once (and no ``100 Continue`` is sent), a chunked body as it
    passes the limit. The 413 is written to the connection directly, its
    write side closed, and whatever the client still sends is dropped for
    :data:`LINGER_SECONDS`, so it reads the answer rather than a reset; the
    application is never called.
    """
    from daphne.http_protocol import WebRequest
    from twisted.internet import reactor as _reactor
    from twisted.web.http import HTTPChannel, _GenericHTTPChannelProtocol

    # Twisted's global reactor, untyped (its interfaces do not type-check as a
    # module attribute).
    reactor: Any = _reactor

    class CappedRequest(WebRequest):  # type: ignore[misc]
        """daphne's request, refusing a body over the limit as it arrives."""

        _body_bytes = 0
        _refused = False

        def gotLength(self, length: int | None) -> None:
            if length is not None and length > limit:
                # Twisted sends "100 Continue" after this when asked: not
                # for a body that will be refused.
                self.requestHeaders.removeHeader(b"expect")
                super().gotLength(0)
                self._refuse()
                return
            super().gotLength(length)

        def handleContentChunk(self, data: bytes) -> None:
            if self._refused:
                return
            self._body_bytes += len(data)
            if self._body_bytes > limit:
                self._refuse()
                return
            super().handleContentChunk(data)

        def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
            if self._refused:
                return  # the application never sees a refused request
            super().requestReceived(command, path, version)

        def _refuse(self) -> None:
            self._refused = True
            if self.content is not None:
                self.content.close()  # what was kept of the body (a temporary file)
            channel = self.channel
            transport = channel.transport
            logger.info("refused a request body over %d bytes from %s", limit, transport.getPeer())
            transport.write(too_large_response(limit))
            # Read on and drop: closing a socket with unread data resets it,
            # and the client would lose the answer.
            channel.dataReceived = _discard
            channel.setTimeout(None)
            close_write = getattr(transport, "loseWriteConnection", None)
            if close_write is not None:
                close_write()
            reactor.callLater(LINGER_SECONDS, _abort, transport)

    # Twisted's own annotations do not describe a subclass's transport.
    channel_base: Any = HTTPChannel

    class GuardedChannel(channel_base):  # type: ignore[misc]
        """Twisted's HTTP connection: a deadline on each request head, a per-address count."""

        _lc_in_head = False
        _lc_timer: Any = None
        _lc_address = ""

        def connectionMade(self) -> None:
            super().connectionMade()
            self._lc_address = str(getattr(self.transport.getPeer(), "host", ""))
            self._lc_begin_head()

        def allHeadersReceived(self) -> None:
            self._lc_end_head()
            super().allHeadersReceived()

        def requestDone(self, request: Any) -> None:
            if self.persistent:
                # The next request's head starts now (its deadline too): an
                # idle kept-alive connection is held no longer than one head.
                self._lc_begin_head()
            super().requestDone(request)

        def connectionLost(self, reason: Any) -> None:
            self._lc_end_head()
            super().connectionLost(reason)

        def _lc_begin_head(self) -> None:
            if self._lc_in_head:
                return
            if not pending.acquire(self._lc_address):
                logger.warning(
                    "refused a connection from %s: %d already waiting for their request head",
                    self._lc_address,
                    pending.cap,
                )
                self.transport.write(too_many_pending_response(pending.cap))
                self.transport.loseConnection()
                return
            self._lc_in_head = True
            if head_seconds:
                self._lc_timer = reactor.callLater(head_seconds, self._lc_expired)

        def _lc_end_head(self) -> None:
            if not self._lc_in_head:
                return
            self._lc_in_head = False
            pending.release(self._lc_address)
            if self._lc_timer is not None and self._lc_timer.active():
                self._lc_timer.cancel()
            self._lc_timer = None

        def _lc_expired(self) -> None:
            self._lc_timer = None
            if self._lc_in_head:
                logger.info("closed a connection from %s: request head too slow", self._lc_address)
                self.transport.write(head_timeout_response(head_seconds))
                self.transport.loseConnection()

    class CappedHTTPFactory(base):  # type: ignore[misc]
        """daphne's HTTP factory: guarded connections, capped requests."""

        def protocol(self) -> Any:
            # What Twisted's own factory builds, around the guarded channel.
            return _GenericHTTPChannelProtocol(GuardedChannel())

        def buildProtocol(self, addr: Any) -> Any:
            protocol = super().buildProtocol(addr)
            if protocol is not None:
                protocol.requestFactory = CappedRequest
            return protocol

    return CappedHTTPFactory


def guarded_uvicorn_protocol(
    base: type[Any], *, head_seconds: float, pending: PendingHeads
) -> type[Any]:
    """A subclass of uvicorn's HTTP/1.1 protocol class with the head deadline and per-address count.

    uvicorn arms no timer while a head arrives (its keep-alive timeout is
    cancelled by the first byte), so a connection sending a line now and
    then was held for ever. A head starts with the connection, or with the
    first byte after a finished response; it ends when uvicorn hands the
    request to the application (a new request cycle) or upgrades the
    connection to a WebSocket.
    """

    class GuardedProtocol(base):  # type: ignore[misc]
        """uvicorn's protocol, with a deadline on each request head and a per-address count."""

        _lc_in_head = False
        _lc_timer: Any = None
        _lc_cycle: Any = None
        _lc_address = ""

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            self._lc_address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
            self._lc_begin_head()

        def data_received(self, data: bytes) -> None:
            cycle = getattr(self, "cycle", None)
            if not self._lc_in_head and cycle is not None and cycle.response_complete:
                self._lc_begin_head()  # the next request on a kept-alive connection
            super().data_received(data)
            if self._lc_in_head and (
                getattr(self, "cycle", None) is not self._lc_cycle
                or self.transport.get_protocol() is not self
            ):
                self._lc_end_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._lc_end_head()
            super().connection_lost(exc)

        def _lc_begin_head(self) -> None:
            self._lc_cycle = getattr(self, "cycle", None)
            if not pending.acquire(self._lc_address):
                logger.warning(
                    "refused a connection from %s: %d already waiting for their request head",
                    self._lc_address,
                    pending.cap,
                )
                self.transport.write(too_many_pending_response(pending.cap))
                self.transport.close()
                return
            self._lc_in_head = True
            if head_seconds:
                self._lc_timer = self.loop.call_later(head_seconds, self._lc_expired)

        def _lc_end_head(self) -> None:
            if not self._lc_in_head:
                return
            self._lc_in_head = False
            pending.release(self._lc_address)
            if self._lc_timer is not None:
                self._lc_timer.cancel()
                self._lc_timer = None

        def _lc_expired(self) -> None:
            self._lc_timer = None
            if self._lc_in_head and not self.transport.is_closing():
                logger.info("closed a connection from %s: request head too slow", self._lc_address)
                self.transport.write(head_timeout_response(head_seconds))
                self.transport.close()

    GuardedProtocol.__name__ = GuardedProtocol.__qualname__ = f"Guarded{base.__name__}"
    return GuardedProtocol


def _abort(transport: Any) -> None:
    """End a lingering connection (a no-op once it is gone)."""
    transport.abortConnection()
