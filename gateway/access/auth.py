"""Who is calling: bearer tokens and staff sessions (protocol: Authentication).

Stored tokens are looked up by their SHA-256 (only the hash is stored) and
cached for ``GATEWAY_TOKEN_CACHE_TTL`` seconds (default 5), so a revocation
reaches HTTP requests within that time. Signed tokens (JWT, :mod:`gateway.tokens`)
are checked on every use and never cached: nothing about them is stored. A
logged-in superuser is an admin principal; another staff user has the
operator rights of its Django permissions (protocol 1.2).

Token lifetime on sockets (protocol 1.1: Signed connection tokens and token
lifetime): a socket of a signed token closes itself at its ``exp``
(``consumers.base``); a socket of a stored token is watched by
:class:`RevocationWatch` (one per process, in its runtime), which asks the database every
``GATEWAY_TOKEN_CHECK_INTERVAL`` seconds (default 2) whether the stored tokens
of this process's sockets still stand. The database is shared by every
gateway process, so a revocation made anywhere (the admin, ``manage.py
revoke_token``) closes the sockets of every process, without Redis.

Sessions on sockets (protocol 1.2: a session socket keeps only the rights
its user still has): the same watch reads again, at the same interval, the
session and the user of every socket opened with a session
(:func:`session_principal`). A socket is closed with 4401 once its session is
gone (logged out, expired), no longer verifies (the user's password changed:
Django's session hash), or its user is inactive or lost any of the rights the
socket was opened with.

A socket without a token is a browser's, authenticated by the session
cookie, which the browser sends to the gateway whatever page opened the
socket. So it must come from an allowed origin (:func:`origin_allowed`):
otherwise any site a staff user visits could drive the gateway as them
(cross-site WebSocket hijacking). Sockets with a token need no Origin: the
token is the proof, and non-browser clients send no Origin at all.

A socket that is refused for who it is (no token, a token that is unknown,
revoked, expired or forged, no staff session) is refused in one of two ways
(protocol 1.2, "General"). A program's handshake (no ``Origin``) gets HTTP
403. A browser's (an ``Origin`` header) is accepted, told
``{"op": "error", "code": "unauthorized"}`` and closed with 4401, because a
browser shows a page a refused handshake as a bare close 1006, the same as a
network failure, and its client would retry forever
(:func:`refuse_unauthorized`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import (
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user_model,
    load_backend,
)
from django.db import DatabaseError
from django.http.request import split_domain_port, validate_host
from django.utils.crypto import constant_time_compare

from gateway.access.tokens import is_signed_token, principal_for_claims, verify_signed_token
from gateway.conf import gateway_settings
from gateway.core.errors import Unauthorized, Unavailable
from gateway.core.scopes import OPERATOR_RIGHTS, Principal, operator_principal
from gateway.core.wire import CloseCode, encode_error
from gateway.models import Token, hash_token

__all__ = [
    "PRINCIPAL_KEY",
    "RevocationWatch",
    "SessionGrant",
    "TokenAuthMiddleware",
    "Watched",
    "aprincipal_for_user",
    "forget_tokens",
    "origin_allowed",
    "principal_for_signed",
    "principal_for_token",
    "principal_for_user",
    "refuse_unauthorized",
    "refuse_unavailable",
    "session_principal",
    "token_from_headers",
]

log = logging.getLogger("leasecast.auth")

#: Where the middleware leaves the caller in the ASGI scope.
PRINCIPAL_KEY = "leasecast.principal"

#: What a refused browser socket is told: never the token, nor which check failed.
NO_TOKEN = (
    "no token: send one (Authorization: Bearer TOKEN, or ?token=), "
    "or open the socket from an allowed origin while logged in as staff"
)
BAD_TOKEN = "the token is unknown, revoked, expired or not signed with this gateway's key"
NO_SESSION = "no token, and no staff session: log in, or send a token"

_cache: dict[str, tuple[float, Principal | None]] = {}


#: When the missing signing key was last logged (once a minute at most, not once a request).
_no_key_logged = [-1e9]


def principal_for_signed(secret: str) -> Principal | None:
    """The principal of a signed token, or None if it is refused (no I/O).

    Refusals are logged at debug level with their reason (the token itself
    is never logged); a gateway without ``GATEWAY_SIGNING_KEY`` says so at
    warning level, at most once a minute.
    """
    key = gateway_settings().signing_key
    try:
        checks = gateway_settings()
        claims = verify_signed_token(
            secret,
            key.encode(),
            max_ttl=checks.signing_max_ttl,
            audience=checks.signing_audience or None,
            issuer=checks.signing_issuer or None,
        )
    except Unauthorized as exc:
        now = time.monotonic()
        if not key and now - _no_key_logged[0] > 60:
            _no_key_logged[0] = now
            log.warning(
                "refused a signed token: GATEWAY_SIGNING_KEY is not set, so signed "
                "tokens are off (set it to the key the application signs with)"
            )
        else:
            log.debug("refused a signed token: %s", exc.detail)
        return None
    return principal_for_claims(claims)


def principal_for_token(secret: str) -> Principal | None:
    """The principal of a token, or None if it is unknown, revoked or refused.

    A signed token (a JWT) is checked by :func:`principal_for_signed`; any
    other secret is a stored token, looked up by its hash (sync; hits the DB
    unless cached).

    Raises:
        Unavailable: the database could not be asked (unreachable, failing
            over): a transient failure the caller answers as such (HTTP 503,
            or a socket closed with 4503), never as an unknown token.
    """
    if is_signed_token(secret):
        return principal_for_signed(secret)
    digest = hash_token(secret)
    now = time.monotonic()
    hit = _cache.get(digest)
    if hit is not None and now - hit[0] < gateway_settings().token_cache_ttl:
        return hit[1]
    try:
        row = Token.objects.filter(token_hash=digest, revoked_at__isnull=True).first()
    except DatabaseError as exc:
        # Nothing is cached: the next attempt asks the database again.
        raise Unavailable(f"tokens cannot be checked now ({type(exc).__name__})") from exc
    principal = None if row is None else Principal.from_scopes(row.name, row.scopes, row.pk)
    if len(_cache) > 10_000:
        _cache.clear()
    _cache[digest] = (now, principal)
    return principal


def principal_for_user(user: Any) -> Principal | None:
    """The principal of a logged-in, active staff user (sync: reads permissions), or None.

    A superuser may do everything; another staff user has the operator
    rights of its Django permissions ``gateway.view_queue``,
    ``gateway.change_queue`` and ``gateway.change_topic``
    (:func:`gateway.core.scopes.operator_principal`), and none without them.
    """
    if (
        user is None
        or not getattr(user, "is_active", False)
        or not getattr(user, "is_staff", False)
    ):
        return None
    superuser = bool(getattr(user, "is_superuser", False))
    permissions: set[str] = set()
    if not superuser:
        permissions = {right for right in OPERATOR_RIGHTS if user.has_perm(f"gateway.{right}")}
    return operator_principal(
        user.get_username(), user.pk, superuser=superuser, permissions=permissions
    )


def session_principal(session_key: str) -> Principal | None:
    """Who a stored session is now: its user's principal, or None (sync; hits the DB).

    None when the session is gone or expired, names no user or a backend no
    longer configured, its hash no longer verifies (the password changed),
    or the user is not (or no longer) allowed in (:func:`principal_for_user`).
    Unlike ``django.contrib.auth.get_user`` it changes nothing: a session
    verified only by a fallback secret keeps its key (the browser still
    holds it).
    """
    engine = import_module(settings.SESSION_ENGINE)
    data = engine.SessionStore(session_key).load()
    backend_path = data.get(BACKEND_SESSION_KEY)
    if SESSION_KEY not in data or backend_path not in settings.AUTHENTICATION_BACKENDS:
        return None
    user_id = get_user_model()._meta.pk.to_python(data[SESSION_KEY])
    user = load_backend(backend_path).get_user(user_id)
    if user is None:
        return None
    if hasattr(user, "get_session_auth_hash"):
        stored = data.get(HASH_SESSION_KEY)
        hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
        if not stored or not any(constant_time_compare(stored, h) for h in hashes):
            return None
    return principal_for_user(user)


async def aprincipal_for_user(user: Any) -> Principal | None:
    """:func:`principal_for_user` from async code (it reads permissions from the database)."""
    principal: Principal | None = await database_sync_to_async(principal_for_user)(user)
    return principal


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


async def refuse_unauthorized(receive: Any, send: Any, detail: str) -> None:
    """Refuse a browser's socket so that its page can tell why (an ASGI app's body).

    Accepts the handshake, sends one ``unauthorized`` error frame and closes
    with ``CloseCode.UNAUTHORIZED``, then waits for the disconnect, ignoring
    whatever the client sends meanwhile: no consumer runs, nothing is read
    from the database.
    """
    await _refuse(receive, send, "unauthorized", detail, CloseCode.UNAUTHORIZED)


async def refuse_unavailable(receive: Any, send: Any, detail: str) -> None:
    """Refuse a socket whose credentials could not be checked (the database is
    unreachable): one ``unavailable`` error frame, then ``CloseCode.UNAVAILABLE``,
    which tells the client to retry with backoff (docs/protocol.md)."""
    await _refuse(receive, send, "unavailable", detail, CloseCode.UNAVAILABLE)


async def _refuse(receive: Any, send: Any, code: str, detail: str, close: CloseCode) -> None:
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": encode_error(code, detail)})
    # A plain int: daphne's WebSocket library refuses an int subclass as a code.
    await send({"type": "websocket.close", "code": int(close)})
    while message["type"] != "websocket.disconnect":
        message = await receive()


def _from_browser(scope: dict[str, Any]) -> bool:
    """Did a browser open this socket? Every browser sends ``Origin``; programs do not."""
    return bool(_header(scope.get("headers", ()), b"origin"))


async def _admit(
    inner: Any,
    scope: dict[str, Any],
    receive: Any,
    send: Any,
    principal: Principal | None,
    refusal: str,
) -> Any:
    """Run the socket as ``principal``; refuse a browser's without one as it can see (4401).

    A program's socket without a principal goes on to its consumer, which
    refuses the handshake (HTTP 403, as before protocol 1.2).
    """
    if principal is None and _from_browser(scope):
        return await refuse_unauthorized(receive, send, refusal)
    return await inner({**scope, PRINCIPAL_KEY: principal}, receive, send)


class _SessionPrincipal:
    """Inside Channels' session stack: the principal of a logged-in staff user."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        user = scope.get("user")
        principal = await database_sync_to_async(lambda: principal_for_user(user))()
        return await _admit(self.inner, scope, receive, send, principal, NO_SESSION)


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
                # The session is not even looked at: the socket is refused
                # (403, or 4401 for a browser).
                origin = _header(headers, b"origin")
                if origin is not None:
                    log.warning(
                        "refused a socket without a token to %s from origin %r (host %r)",
                        scope.get("path"),
                        origin[:200],
                        (_header(headers, b"host") or "")[:200],
                    )
                return await _admit(self.inner, scope, receive, send, None, NO_TOKEN)
            return await self.session_stack(scope, receive, send)
        if is_signed_token(secret):
            # Pure CPU (an HMAC): no thread hop for the database.
            principal = principal_for_signed(secret)
        else:
            try:
                principal = await database_sync_to_async(principal_for_token)(secret)
            except Unavailable as exc:
                return await refuse_unavailable(receive, send, exc.detail)
        return await _admit(self.inner, scope, receive, send, principal, BAD_TOKEN)


def websocket_auth_stack(inner: Any) -> Any:
    """Token auth, falling back to session auth (for staff in a browser)."""
    return TokenAuthMiddleware(inner)


# -- revocation of stored tokens (protocol 1.1: token lifetime)


class Watched(Protocol):
    """A socket a :class:`RevocationWatch` watches: told once when its credentials are gone."""

    def token_revoked(self) -> None:
        """Close the socket (4401): its stored token was revoked or deleted, or
        its session ended or lost rights the socket was opened with."""


@dataclass(frozen=True, slots=True)
class SessionGrant:
    """What a session socket was opened with: the session and the principal it gave."""

    session_key: str
    principal: Principal

    def stands(self, now: Principal | None) -> bool:
        """Does the session, read again as ``now``, still give everything it gave?"""
        return (
            now is not None and now.user_id == self.principal.user_id and now.covers(self.principal)
        )


def forget_tokens(token_ids: Iterable[int]) -> None:
    """Drop these stored tokens from the lookup cache, so HTTP refuses them at once."""
    gone = set(token_ids)
    for digest, (_at, principal) in list(_cache.items()):
        if principal is not None and principal.token_id in gone:
            _cache.pop(digest, None)


def _session_principals(session_keys: list[str]) -> dict[str, Principal | None]:
    """:func:`session_principal` of each session (one session and one user read each)."""
    return {key: session_principal(key) for key in session_keys}


def _standing(token_ids: list[int]) -> set[int]:
    """Which of these stored tokens still exist and are not revoked (one query)."""
    rows = Token.objects.filter(pk__in=token_ids, revoked_at__isnull=True).values_list(
        "pk", flat=True
    )
    return set(rows)


class RevocationWatch:
    """Closes this process's sockets whose stored token was revoked or deleted,
    or whose session ended or lost rights.

    One task per process runs while at least one socket of a stored token or
    a session is open: every ``GATEWAY_TOKEN_CHECK_INTERVAL`` seconds it asks
    the database, in one query, which of those tokens still stand, reads each
    of those sessions and its user again (:class:`SessionGrant`), and tells
    the sockets of the others (:meth:`Watched.token_revoked`). The task stops when the last
    such socket goes, so a process at rest, or shutting down (its sockets
    close first), has no task left. A failed check (database down) is logged
    and tried again at the next interval; sockets stay open meanwhile.
    :class:`gateway.runtime.Runtime` owns the process's watch.

    Args:
        interval: seconds between checks (``GATEWAY_TOKEN_CHECK_INTERVAL``).
    """

    def __init__(self, interval: float = 2.0) -> None:
        self.interval = max(0.1, interval)
        self._sockets: dict[int, set[Watched]] = {}
        self._sessions: dict[SessionGrant, set[Watched]] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, token_id: int, socket: Watched) -> None:
        """Watch ``socket``, opened with stored token ``token_id`` (on the event loop)."""
        self._sockets.setdefault(token_id, set()).add(socket)
        self._start()

    def add_session(self, grant: SessionGrant, socket: Watched) -> None:
        """Watch ``socket``, opened with a session (on the event loop)."""
        self._sessions.setdefault(grant, set()).add(socket)
        self._start()

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._run())

    def discard(self, token_id: int, socket: Watched) -> None:
        """Stop watching ``socket``; the task stops with the last socket."""
        sockets = self._sockets.get(token_id)
        if sockets is not None:
            sockets.discard(socket)
            if not sockets:
                del self._sockets[token_id]
        self._stop_when_idle()

    def discard_session(self, grant: SessionGrant, socket: Watched) -> None:
        """Stop watching a session ``socket``; the task stops with the last socket."""
        sockets = self._sessions.get(grant)
        if sockets is not None:
            sockets.discard(socket)
            if not sockets:
                del self._sessions[grant]
        self._stop_when_idle()

    def _stop_when_idle(self) -> None:
        if not self._sockets and not self._sessions and self._task is not None:
            self._task.cancel()
            self._task = None

    def stop(self) -> None:
        """Stop the task and forget every socket (process shutdown; idempotent)."""
        self._sockets.clear()
        self._sessions.clear()
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def running(self) -> bool:
        """Is the check task running (for tests: none without a watched socket)?"""
        return self._task is not None and not self._task.done()

    def watched(self) -> int:
        """How many sockets are watched (for tests and stats)."""
        return sum(len(sockets) for sockets in [*self._sockets.values(), *self._sessions.values()])

    async def check(self) -> set[int]:
        """Check once now; returns the ids of the tokens found revoked.

        Session sockets are checked too (:meth:`check_sessions`).
        """
        await self.check_sessions()
        ids = list(self._sockets)
        if not ids:
            return set()
        standing = await database_sync_to_async(_standing)(ids)
        revoked = {token_id for token_id in ids if token_id not in standing}
        if revoked:
            forget_tokens(revoked)
        for token_id in revoked:
            for socket in self._sockets.pop(token_id, set()):
                socket.token_revoked()
        if revoked:
            log.info("closed the sockets of revoked tokens %s", sorted(revoked))
        return revoked

    async def check_sessions(self) -> int:
        """Close the session sockets whose session no longer gives what it gave; how many."""
        if not self._sessions:
            return 0
        keys = sorted({grant.session_key for grant in self._sessions})
        now = await database_sync_to_async(_session_principals)(keys)
        closed = 0
        for grant in [g for g in self._sessions if not g.stands(now.get(g.session_key))]:
            for socket in self._sessions.pop(grant, set()):
                socket.token_revoked()
                closed += 1
            log.info(
                "closed the sockets of %s: its session ended or lost rights",
                grant.principal.name,
            )
        return closed

    async def _run(self) -> None:
        while self._sockets or self._sessions:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "could not check for revoked tokens or ended sessions (trying again): %s", exc
                )
