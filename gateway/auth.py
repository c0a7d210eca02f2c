"""Who is calling: bearer tokens and staff sessions (protocol: Authentication).

Tokens are looked up by their SHA-256 (only the hash is stored) and cached for
``GATEWAY_TOKEN_CACHE_TTL`` seconds, so a revocation takes effect within that
time. A logged-in staff user is an admin principal.

A socket without a token is a browser's, authenticated by the session
cookie, which the browser sends to the gateway whatever page opened the
socket. So it must come from an allowed origin (:func:`origin_allowed`):
otherwise any site a staff user visits could drive the gateway as them
(cross-site WebSocket hijacking). Sockets with a token need no Origin: the
token is the proof, and non-browser clients send no Origin at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.http.request import split_domain_port, validate_host

from gateway.conf import gateway_settings
from gateway.models import Token, hash_token
from gateway.scopes import Principal

__all__ = [
    "PRINCIPAL_KEY",
    "TokenAuthMiddleware",
    "origin_allowed",
    "principal_for_token",
    "principal_for_user",
    "token_from_headers",
]

log = logging.getLogger("leasecast.auth")

#: Where the middleware leaves the caller in the ASGI scope.
PRINCIPAL_KEY = "leasecast.principal"

_cache: dict[str, tuple[float, Principal | None]] = {}


def principal_for_token(secret: str) -> Principal | None:
    """The principal of a token, or None if it is unknown or revoked (sync; hits the DB)."""
    digest = hash_token(secret)
    now = time.monotonic()
    hit = _cache.get(digest)
    if hit is not None and now - hit[0] < gateway_settings().token_cache_ttl:
        return hit[1]
    row = Token.objects.filter(token_hash=digest, revoked_at__isnull=True).first()
    principal = None if row is None else Principal.from_scopes(row.name, row.scopes, row.pk)
    if len(_cache) > 10_000:
        _cache.clear()
    _cache[digest] = (now, principal)
    return principal


def principal_for_user(user: Any) -> Principal | None:
    """A logged-in, active staff user may use every endpoint."""
    if user is not None and getattr(user, "is_active", False) and getattr(user, "is_staff", False):
        return Principal(name=f"staff:{user.get_username()}", is_admin=True, user_id=user.pk)
    return None


def token_from_headers(headers: Any) -> str | None:
    """The bearer token of an ``Authorization`` header, from ASGI header pairs."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            secret: str = token.strip()
            if scheme.lower() == "bearer" and secret:
                return secret
    return None


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None


def origin_allowed(
    headers: Iterable[tuple[bytes, bytes]],
    allowed_origins: Iterable[str],
    allowed_hosts: list[str],
) -> bool:
    """May a browser socket with these handshake headers use the session cookie?

    Yes if its ``Origin`` is one of ``allowed_origins`` (exact
    ``scheme://host[:port]``, ``GATEWAY_ALLOWED_ORIGINS``), or if it is the
    gateway's own origin: the same ``host[:port]`` as the ``Host`` header (the
    scheme may differ: TLS may end at a proxy), with that host in
    ``ALLOWED_HOSTS``. No ``Origin`` at all is refused: every browser sends one.
    """
    pairs = list(headers)
    origin = _header(pairs, b"origin")
    if not origin or origin == "null":
        return False
    origin = origin.rstrip("/").lower()
    if origin in allowed_origins:
        return True
    parts = urlsplit(origin)
    host = _header(pairs, b"host")
    if parts.scheme not in ("http", "https") or not parts.netloc or not host:
        return False
    if parts.netloc != host.lower():
        return False
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed_hosts)


def _token_in_scope(scope: dict[str, Any]) -> str | None:
    secret = token_from_headers(scope.get("headers", ()))
    if secret is None:
        values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token")
        secret = values[0] if values else None
    return secret


class _SessionPrincipal:
    """Inside Channels' session stack: the principal of a logged-in staff user."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        user = scope.get("user")
        principal = await database_sync_to_async(lambda: principal_for_user(user))()
        return await self.inner({**scope, PRINCIPAL_KEY: principal}, receive, send)


class TokenAuthMiddleware:
    """ASGI middleware for sockets: puts the caller's :class:`Principal` (or None) in the scope.

    A socket with a token skips Channels' session and cookie middleware: that
    stack wraps every frame the socket sends, which a worker or subscriber
    pays thousands of times a second for nothing. Sockets without a token
    (a staff user's browser) go through it to find the session user.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.session_stack = AuthMiddlewareStack(_SessionPrincipal(inner))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        secret = _token_in_scope(scope)
        if secret is None:
            conf = gateway_settings()
            headers = scope.get("headers", ())
            if not origin_allowed(headers, conf.allowed_origins, list(conf.allowed_hosts)):
                # The session is not even looked at: the socket is refused (403).
                origin = _header(headers, b"origin")
                if origin is not None:
                    log.warning(
                        "refused a socket without a token to %s from origin %r (host %r)",
                        scope.get("path"),
                        origin[:200],
                        (_header(headers, b"host") or "")[:200],
                    )
                return await self.inner({**scope, PRINCIPAL_KEY: None}, receive, send)
            return await self.session_stack(scope, receive, send)
        principal = await database_sync_to_async(principal_for_token)(secret)
        return await self.inner({**scope, PRINCIPAL_KEY: principal}, receive, send)


def websocket_auth_stack(inner: Any) -> Any:
    """Token auth, falling back to session auth (for staff in a browser)."""
    return TokenAuthMiddleware(inner)
