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

Pure parts (the settings, the response) import neither server: importing
``daphne.server`` installs Twisted's asyncio reactor, which a uvicorn
process must not do, so the daphne classes are built on first use.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "BodyLimit",
    "max_request_bytes",
    "too_large_body",
]

logger = logging.getLogger("leasecast.server")

#: ``GATEWAY_MAX_REQUEST_BYTES``'s default: 16 MiB.
DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
#: Seconds a connection whose body was refused is still read (and the bytes
#: dropped) after the 413 went out, so the client reads the answer instead of
#: a reset; then it is closed.
LINGER_SECONDS = 5.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _positive_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: not a whole number") from None
    if number < 1:
        raise ValueError(f"{name}={value!r}: must be 1 or more")
    return number


def max_request_bytes() -> int:
    """The largest request body accepted (``GATEWAY_MAX_REQUEST_BYTES``, 16 MiB)."""
    return _positive_int("GATEWAY_MAX_REQUEST_BYTES", DEFAULT_MAX_REQUEST_BYTES)


def too_large_body(limit: int) -> bytes:
    """The 413 answer's JSON, in the gateway's error shape (``{"error", "detail"}``)."""
    detail = f"request body over {limit} bytes (GATEWAY_MAX_REQUEST_BYTES)"
    return json.dumps({"error": "too_large", "detail": detail}).encode()


def too_large_response(limit: int) -> bytes:
    """The whole HTTP/1.1 413 answer, for a server that writes it itself (daphne)."""
    body = too_large_body(limit)
    head = (
        "HTTP/1.1 413 Request Entity Too Large\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


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


def daphne_http_factory(base: type[Any], limit: int) -> type[Any]:
    """A subclass of daphne's ``HTTPFactory`` whose requests refuse bodies over ``limit``.

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

    class CappedHTTPFactory(base):  # type: ignore[misc]
        """daphne's HTTP factory, with :class:`CappedRequest` requests."""

        def buildProtocol(self, addr: Any) -> Any:
            protocol = super().buildProtocol(addr)
            if protocol is not None:
                protocol.requestFactory = CappedRequest
            return protocol

    return CappedHTTPFactory


def _abort(transport: Any) -> None:
    """End a lingering connection (a no-op once it is gone)."""
    transport.abortConnection()
