"""CORS for what pages of other origins may read: the JavaScript client and event streams.

A page on another origin (an application at ``https://app.example`` using a
gateway at ``https://gw.example``) imports the client module from the
gateway and, later, reads event streams (``/sse/...``) from it. Browsers
allow both only with an ``Access-Control-Allow-Origin`` answer. The gateway
gives it to the exact origins of ``GATEWAY_ALLOWED_ORIGINS`` and to no
other, and never with credentials: the session cookie is not offered to
another origin (its sockets are checked on their own, ``gateway.access.auth``), a
page of another origin authenticates with a token.

:func:`cors_headers` is the rule, for any view to use; :class:`CrossOrigin`
applies it as ASGI middleware to the paths under its prefixes (the
standalone service wraps its HTTP application in it). WebSockets need none
of this: browsers do not apply CORS to them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from gateway.conf import gateway_settings

__all__ = ["CLIENT_PREFIX", "CORS_PREFIXES", "CrossOrigin", "cors_headers"]

#: Where the gateway serves its JavaScript client.
CLIENT_PREFIX = "/static/leasecast/"
#: What :class:`CrossOrigin` covers by default: the client and the event streams.
CORS_PREFIXES = (CLIENT_PREFIX, "/sse/")

#: What a preflight may ask for: reads, with a token or a resume position.
_PREFLIGHT = [
    (b"access-control-allow-methods", b"GET, HEAD, OPTIONS"),
    (b"access-control-allow-headers", b"Authorization, Last-Event-ID"),
    (b"access-control-max-age", b"600"),
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def cors_headers(
    origin: str | None, allowed: Iterable[str], *, preflight: bool = False
) -> list[tuple[bytes, bytes]]:
    """The CORS headers answering a request from ``origin``: none unless it is allowed.

    Args:
        origin: the request's ``Origin`` header, or None.
        allowed: the exact origins (``scheme://host[:port]``, lower case, no
            trailing slash) that may read, as ``GATEWAY_ALLOWED_ORIGINS`` holds them.
        preflight: answering an ``OPTIONS`` preflight: also the methods and
            headers a read may use.

    Returns:
        ``Access-Control-Allow-Origin`` naming that origin (never ``*``, never
        with credentials), plus the preflight's headers; an empty list for
        no origin, ``null``, or an origin not in ``allowed``.
    """
    if not origin or origin == "null":
        return []
    if origin.rstrip("/").lower() not in set(allowed):
        return []
    headers = [(b"access-control-allow-origin", origin.encode("latin-1"))]
    return headers + _PREFLIGHT if preflight else headers


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            text: str = value.decode("latin-1").strip()
            return text
    return None


class CrossOrigin:
    """ASGI middleware: CORS for allowed origins on HTTP paths under ``prefixes``.

    Responses there get :func:`cors_headers` and ``Vary: Origin`` (a cache
    must not hand one origin's answer to another); a preflight (``OPTIONS``
    with ``Access-Control-Request-Method``) is answered 204 here. Every other
    request passes through untouched.

    Args:
        app: the HTTP application to wrap.
        prefixes: the path prefixes covered (default: the client and ``/sse/``).
        allowed: the allowed origins; default: ``GATEWAY_ALLOWED_ORIGINS``,
            read per request.
    """

    def __init__(
        self,
        app: Any,  # any ASGI application (Django's handler types its arguments its own way)
        *,
        prefixes: Iterable[str] = CORS_PREFIXES,
        allowed: Iterable[str] | None = None,
    ) -> None:
        self.app = app
        self.prefixes = tuple(prefixes)
        self.allowed = None if allowed is None else tuple(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        allowed = self.allowed if self.allowed is not None else gateway_settings().allowed_origins
        origin = _header(scope, b"origin")
        if scope.get("method") == "OPTIONS" and _header(scope, b"access-control-request-method"):
            headers = cors_headers(origin, allowed, preflight=True)
            await send(
                {
                    "type": "http.response.start",
                    "status": 204,
                    "headers": [*headers, (b"vary", b"Origin"), (b"content-length", b"0")],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        extra = [*cors_headers(origin, allowed), (b"vary", b"Origin")]

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_cors)
