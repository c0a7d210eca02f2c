"""One WebSocket to the gateway, with replies matched to requests by ``ref``.

Shared by :class:`~leasecast.worker.Worker`,
:class:`~leasecast.producer.Producer` and
:class:`~leasecast.subscriber.Subscriber`. Imports nothing from Django.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import random
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed as WsConnectionClosed
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI
from websockets.protocol import State

from leasecast.close_codes import CloseCode
from leasecast.errors import (
    Backpressure,
    ConnectionClosed,
    Forbidden,
    Invalid,
    LeasecastError,
    ProtocolError,
    TokenExpired,
    Unauthorized,
    error_for_code,
)
from leasecast.tokens import TokenLike, TokenSource, refresh_delay, seconds_left

__all__ = [
    "BACKPRESSURE_RETRIES",
    "PERMANENT_CLOSE_CODES",
    "Link",
    "PendingReplies",
    "backoff_delays",
    "enqueue_fields",
    "http_url",
    "name_path",
    "permanent",
    "reopen",
    "ws_url",
]

log = logging.getLogger("leasecast.client")

#: Close codes after which reconnecting cannot help (protocol: Errors), and the
#: error to raise when the server closed with one without stating an ``error`` first.
PERMANENT_CLOSE_CODES: dict[int, type[ProtocolError]] = {
    CloseCode.INVALID: Invalid,
    CloseCode.FORBIDDEN: Forbidden,
}

#: Close code of a socket whose token expired or was revoked (protocol 1.1):
#: not final, the owner reconnects with a fresh token.
TOKEN_EXPIRED_CLOSE_CODE = CloseCode.UNAUTHORIZED

#: How many times a request refused with ``backpressure`` and a ``retry_after``
#: (a per-token rate limit) is sent again, after waiting what the gateway said.
BACKPRESSURE_RETRIES = 5
#: The longest single wait for ``retry_after`` (a larger advice is capped).
BACKPRESSURE_MAX_WAIT = 30.0

#: HTTP statuses of a refused handshake that are worth retrying (the rest of 4xx is final).
_TRANSIENT_HANDSHAKE_STATUSES = frozenset({408, 425, 429})


def ws_url(base: str, path: str, params: dict[str, Any] | None = None) -> str:
    """Build a WebSocket URL from the gateway's base URL.

    Args:
        base: ``http(s)://host:port``, ``ws(s)://host:port`` or a bare ``host:port``;
            any path or query it has is replaced.
        path: the socket's path, e.g. ``/ws/produce/``.
        params: query parameters; ``None`` values are left out.

    Returns:
        ``ws://host:port/PATH?QUERY`` (``wss://`` for an ``https``/``wss`` base).
    """
    parts = urlsplit(base if "://" in base else f"http://{base}")
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    query = urlencode({k: v for k, v in (params or {}).items() if v is not None})
    return urlunsplit((scheme, parts.netloc, path, query, ""))


def http_url(base: str, path: str) -> str:
    """Build an HTTP URL from the gateway's base URL.

    Args:
        base: ``http(s)://host:port``, ``ws(s)://host:port`` or a bare ``host:port``.
        path: e.g. ``/api/stats``.

    Returns:
        ``http://host:port/PATH`` (``https://`` for an ``https``/``wss`` base).
    """
    parts = urlsplit(base if "://" in base else f"http://{base}")
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def enqueue_fields(
    *, key: str | None = None, group: str | None = None, priority: int = 0, ttl: float | None = None
) -> dict[str, Any]:
    """The optional fields of an ENQUEUE, only those that are set.

    A field left at its default is not sent at all, so a gateway that predates
    protocol 1.1 (``group``, ``priority``, ``ttl``) sees exactly the v1 frame.
    Values are not checked here: the gateway answers a bad one (``invalid``, or
    ``bad_frame`` for a wrong type).
    """
    fields: dict[str, Any] = {}
    if key is not None:
        fields["key"] = key
    if group is not None:
        fields["group"] = group
    if priority != 0:
        fields["priority"] = priority
    if ttl is not None:
        fields["ttl"] = ttl
    return fields


def name_path(prefix: str, name: str) -> str:
    """``/PREFIX/NAME/`` with ``name`` percent-quoted.

    Valid names never need quoting; quoting a bad one (``"a b"``, ``"x/y"``) makes
    the gateway answer ``invalid`` instead of the URL breaking in the client.
    """
    return f"/{prefix.strip('/')}/{quote(name, safe='')}/"


def backoff_delays(
    initial: float = 0.1, maximum: float = 5.0, rng: random.Random | None = None
) -> Iterator[float]:
    """Reconnect delays: exponential, capped, with jitter.

    The n-th delay is drawn uniformly from ``[c/2, c]`` where the ceiling ``c``
    starts at ``initial`` and doubles up to ``maximum``. The jitter spreads out
    clients that lost the gateway at the same moment; the floor of ``c/2`` keeps
    a client from hammering a gateway that refuses it over and over.

    Args:
        initial: the first ceiling, in seconds.
        maximum: the largest ceiling, in seconds.
        rng: the random source (tests pass a seeded one).
    """
    rng = rng or random.Random()
    ceiling = min(initial, maximum)
    while True:
        yield rng.uniform(ceiling / 2, ceiling)
        ceiling = min(maximum, ceiling * 2)


def permanent(exc: BaseException) -> bool:
    """True for failures a reconnect cannot cure (refused token, forbidden name, bad URL)."""
    return isinstance(exc, Unauthorized | Forbidden | Invalid)


class PendingReplies:
    """Requests and their replies, keyed by the ``ref`` this client gave them.

    Pure bookkeeping (no I/O), so the matching rules are testable on their own:
    a frame whose ``ref`` is one of ours resolves that request whatever order
    replies and pushed frames arrive in; anything else is not a reply. A reply
    is kept until its caller discards the ref: a pipelining caller sends many
    frames before it awaits the first reply, and replies that come in meanwhile
    (or just before the socket drops) must not be lost.
    """

    def __init__(self) -> None:
        self._refs = itertools.count(1)
        self._last = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def new(self) -> tuple[int, asyncio.Future[dict[str, Any]]]:
        """A fresh ref and the future its reply will resolve (needs a running loop)."""
        ref = self._last = next(self._refs)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ref] = future
        return ref, future

    def get(self, ref: int) -> asyncio.Future[dict[str, Any]] | None:
        """The future of ``ref`` (resolved or not); None if unknown or already claimed."""
        return self._pending.get(ref)

    def discard(self, ref: int) -> None:
        """Forget a request: its reply was claimed, or its frame was never sent."""
        self._pending.pop(ref, None)

    def resolve(self, frame: dict[str, Any]) -> bool:
        """Hand ``frame`` to the request it answers; False if it answers none of ours.

        Only ints this instance issued are ours. ``bool`` is excluded because
        ``True == 1`` in Python: a server echoing ``true`` must not match ref 1.
        A late reply to a request whose caller gave up is still ours: swallowed.
        """
        ref = frame.get("ref")
        if not isinstance(ref, int) or isinstance(ref, bool) or not 1 <= ref <= self._last:
            return False
        future = self._pending.get(ref)
        if future is not None and not future.done():  # done: cancelled, or a repeat
            future.set_result(frame)
        return True

    def fail_all(self, exc: BaseException) -> None:
        """Fail every request still without a reply (the socket closed).

        Replies already received stay available to :meth:`get`: those requests
        were answered, whatever happened to the socket afterwards.
        """
        for future in self._pending.values():
            if not future.done():
                future.set_exception(exc)
                # Its caller may never await it (it gave up): mark the exception
                # retrieved so asyncio does not log it as lost.
                future.exception()


def _refusal(url: str, exc: InvalidStatus) -> LeasecastError:
    """The error for a handshake the gateway answered with an HTTP status."""
    status = exc.response.status_code
    if status in (401, 403):
        # The protocol answers a missing, unknown or revoked token with 403 at
        # the handshake; retrying with the same token cannot help.
        return Unauthorized(f"the gateway refused the token for {url} (HTTP {status})")
    if 400 <= status < 500 and status not in _TRANSIENT_HANDSHAKE_STATUSES:
        # Wrong path or a gateway that does not route it: final as well.
        return Invalid(f"the gateway refused the socket {url} (HTTP {status})")
    return ConnectionClosed(f"the handshake with {url} failed (HTTP {status})")


class Link:
    """A connected socket: :meth:`request` sends a frame and awaits its reply.

    Frames that are not replies (``deliver``, ``deliveries``, ``messages``) are
    queued for :meth:`next`. When the socket closes, every waiter gets
    :class:`~leasecast.errors.ConnectionClosed`, or the protocol error the server
    stated before a 4400/4403 close (those are final: see :func:`permanent`),
    or :class:`~leasecast.errors.Unauthorized` for a token refused with 4401
    (final unless the token came from a callable, which is then asked again).
    """

    def __init__(
        self,
        conn: ClientConnection,
        token: str = "",
        tokens: TokenSource | None = None,
        *,
        direct: bool = False,
    ) -> None:
        self.conn = conn
        # With a token callable, a refused token is worth one more try with a
        # fresh one from it; with a fixed token, a refusal is final.
        self._renewable = tokens is not None and tokens.renewable
        self._pending = PendingReplies()
        self._frames: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        #: sees each pushed frame as it arrives, before it is queued for
        #: :meth:`next`; returns True to consume it (a worker's ``cancel``
        #: must reach its delivery while the owner is busy with it)
        self.on_push: Callable[[dict[str, Any]], bool] | None = None
        #: why the socket closed; None while it is open
        self.closed_with: LeasecastError | None = None
        loop = asyncio.get_running_loop()
        #: loop times (seconds) of opening and closing, for "was it healthy?"
        self.opened_at = loop.time()
        self.closed_at: float | None = None
        #: refreshes done on this socket (signed tokens)
        self.refreshes = 0
        #: frames sent on this socket, by ``op`` (what the fast path saved shows here)
        self.sent_ops: collections.Counter[str] = collections.Counter()
        self._refresher: asyncio.Task[None] | None = None
        # The refusal the gateway stated before closing (see _read).
        self._last_error: dict[str, Any] | None = None
        # Direct: next() reads the socket itself, with no reader task and no
        # queue between (a task switch and a queue hop less a frame, which a
        # subscriber of a busy topic pays per frame; docs/benchmarks.md,
        # "Fan-out"). A request's reply is then matched only while the owner
        # reads, which suits a socket that sends none but credit and refresh.
        self._reader: asyncio.Task[None] | None = (
            None if direct else asyncio.create_task(self._read())
        )
        left = seconds_left(token) if tokens is not None and tokens.renewable else None
        if left is not None:
            assert tokens is not None
            self._refresher = asyncio.create_task(self._refresh(tokens, left))

    @classmethod
    async def open(
        cls, url: str, token: TokenLike | TokenSource, *, direct: bool = False, **kwargs: Any
    ) -> Link:
        """Connect with ``Authorization: Bearer TOKEN``.

        Args:
            url: the socket's ``ws://`` URL.
            token: the token, a callable returning a fresh one (asked now), or a
                :class:`~leasecast.tokens.TokenSource`. With a callable and a
                signed token (a JWT with ``exp``), the socket sends ``refresh``
                with a fresh token before ``exp``.
            direct: :meth:`next` reads the socket itself (no reader task):
                for an owner that reads all the time and awaits no reply.
            **kwargs: passed on to :func:`websockets.asyncio.client.connect`.

        Raises:
            Unauthorized: the handshake was refused with HTTP 401/403 (final).
            Invalid: the URL is malformed or refused with another 4xx (final).
            ConnectionClosed: the gateway is unreachable or failed (transient).
        """
        tokens = token if isinstance(token, TokenSource) else TokenSource(token)
        current = await tokens.get()
        if direct:
            # Frames wait in the connection instead of a queue of the Link; an
            # unbounded buffer keeps its reading going (and pings answered)
            # while the owner is busy, as the reader task did. Credit bounds it.
            kwargs.setdefault("max_queue", None)
        try:
            conn = await connect(
                url, additional_headers={"Authorization": f"Bearer {current}"}, **kwargs
            )
        except InvalidStatus as exc:
            raise _refusal(url, exc) from exc
        except InvalidURI as exc:
            raise Invalid(f"not a WebSocket URL: {url}") from exc
        except (InvalidHandshake, OSError) as exc:
            # OSError covers refused connections and the opening timeout.
            raise ConnectionClosed(f"cannot connect to {url}: {exc}") from exc
        return cls(conn, current, tokens, direct=direct)

    async def _refresh(self, tokens: TokenSource, expires_in: float) -> None:
        """Send ``refresh`` with a fresh token before each expiry, while the socket lives.

        A refused refresh (``forbidden``: another ``sub``; ``unknown_op``: a
        gateway without signed tokens) is logged and ends refreshing: the
        gateway then closes with 4401 at expiry and the owner reconnects with
        a fresh token, which loses nothing a reconnect would not.
        """
        while self.closed_with is None:
            await asyncio.sleep(refresh_delay(expires_in))
            if self.closed_with is not None:
                return
            try:
                token = await tokens.get()
                reply = await self.request({"op": "refresh", "token": token})
            except ConnectionClosed:
                return
            except Exception as exc:  # the callable failed, or the gateway refused
                log.warning("token refresh failed (%s); the socket will close at expiry", exc)
                return
            self.refreshes += 1
            expires_in = float(reply.get("expires_in") or 0.0)
            if expires_in <= 0:
                return

    @property
    def is_open(self) -> bool:
        """True until the socket has closed (for any reason)."""
        if self._reader is None and self.conn.state is not State.OPEN:
            # Direct: no reader has seen the close yet, the connection has.
            return False
        return self.closed_with is None

    def _pushed(self, data: str | bytes) -> dict[str, Any] | None:
        """The frame in ``data`` if it is for :meth:`next`; None if it was a
        reply (resolved here), the socket's own error, consumed by
        :attr:`on_push`, or not a JSON object (logged)."""
        try:
            frame = orjson.loads(data)
        except orjson.JSONDecodeError:
            log.warning("ignored a frame that is not JSON: %.80r", data)
            return None
        if not isinstance(frame, dict):
            log.warning("ignored a frame that is not an object: %.80r", data)
        elif self._pending.resolve(frame):
            pass
        elif frame.get("op") == "error":
            # An error answering no request is the socket's own: the
            # refusal the gateway states just before closing 4400/4403.
            self._last_error = frame
        elif self.on_push is not None and self.on_push(frame):
            pass
        else:
            return frame
        return None

    async def _read(self) -> None:
        try:
            async for data in self.conn:
                frame = self._pushed(data)
                if frame is not None:
                    self._frames.put_nowait(frame)
        except WsConnectionClosed:
            pass
        finally:
            self._closed()

    def _closed(self) -> None:
        """Record why the socket closed and fail everything waiting on it."""
        if self.closed_with is not None:
            return
        self.closed_with = self._close_reason(self._last_error)
        self.closed_at = asyncio.get_running_loop().time()
        self._pending.fail_all(self.closed_with)
        self._frames.put_nowait(None)
        if self._refresher is not None:
            self._refresher.cancel()  # nothing to refresh on a closed socket

    def _close_reason(self, last_error: dict[str, Any] | None) -> LeasecastError:
        code = self.conn.close_code
        if code == TOKEN_EXPIRED_CLOSE_CODE:
            refused = last_error is not None and last_error.get("code") == Unauthorized.code
            if refused and not self._renewable:
                # Protocol 1.2: a socket with an Origin whose token is refused
                # is accepted, told ``unauthorized`` and closed with 4401.
                # The same token would be refused again: final, as a 403 is.
                assert last_error is not None
                return Unauthorized(str(last_error.get("detail") or "the token was refused"))
            return TokenExpired(
                f"the gateway closed the socket with {code}: token "
                + ("refused" if refused else "expired or revoked")
            )
        if code in PERMANENT_CLOSE_CODES:
            if last_error is not None:
                return error_for_code(
                    str(last_error.get("code", "")), str(last_error.get("detail", ""))
                )
            return PERMANENT_CLOSE_CODES[code](f"the gateway closed the socket with {code}")
        reason = f": {self.conn.close_reason}" if self.conn.close_reason else ""
        return ConnectionClosed(f"socket closed (code {code}{reason})")

    async def send(self, frame: dict[str, Any]) -> int:
        """Send ``frame`` with a fresh ``ref``; returns the ref, for :meth:`reply`.

        Raises:
            ConnectionClosed: the socket is closed (or a final error, if it closed with one).
        """
        if self.closed_with is not None:
            raise self.closed_with
        # Registered before sending, and without an await in between with the
        # check above, so a reply can never arrive before its waiter exists and
        # a close can never miss a waiter.
        ref, _ = self._pending.new()
        self.sent_ops[str(frame.get("op"))] += 1
        try:
            await self.conn.send(orjson.dumps({**frame, "ref": ref}).decode())
        except WsConnectionClosed as exc:
            self._pending.discard(ref)
            raise ConnectionClosed("socket closed while sending") from exc
        except BaseException:
            self._pending.discard(ref)
            raise
        return ref

    async def reply(self, ref: int) -> dict[str, Any]:
        """The reply to the frame sent with ``ref``.

        Raises:
            ProtocolError: the gateway answered with an ``error`` frame.
            ConnectionClosed: the socket closed first.
        """
        waiter = self._pending.get(ref)
        if waiter is None:
            raise ConnectionClosed(f"no request with ref {ref} (or its reply was taken)")
        try:
            # Registered until now, so a close meanwhile fails it (never a hang).
            frame = await waiter
        finally:
            # Claimed, or given up by a cancelled caller: a late reply to it is
            # then swallowed by PendingReplies.resolve().
            self._pending.discard(ref)
        if frame.get("op") == "error":
            retry_after = frame.get("retry_after")
            raise error_for_code(
                str(frame.get("code", "")),
                str(frame.get("detail", "")),
                retry_after=float(retry_after) if isinstance(retry_after, int | float) else None,
            )
        return frame

    def forget(self, ref: int) -> None:
        """Give up on the reply to ``ref`` without awaiting it (it is swallowed if it comes)."""
        self._pending.discard(ref)

    async def request(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send ``frame`` and return its successful reply (see :meth:`reply`).

        A refusal with ``backpressure`` that says ``retry_after`` (nothing was
        applied) is sent again after that wait, at most
        :data:`BACKPRESSURE_RETRIES` times; then, or for a ``backpressure``
        without ``retry_after`` (a full bounded queue), it is raised.
        """
        for attempt in itertools.count():
            try:
                return await self.reply(await self.send(frame))
            except Backpressure as exc:
                if exc.retry_after is None or attempt >= BACKPRESSURE_RETRIES:
                    raise
                log.info("backpressure: retrying %s in %.3f s", frame.get("op"), exc.retry_after)
                await asyncio.sleep(min(max(exc.retry_after, 0.0), BACKPRESSURE_MAX_WAIT))
        raise AssertionError("unreachable")

    async def next(self) -> dict[str, Any]:
        """The next frame that is not a reply.

        Raises:
            ConnectionClosed: the socket closed (every later call raises too).
            ProtocolError: the socket closed with a final error (4400/4403, or
                ``unauthorized`` 4401).
        """
        if self._reader is None:
            return await self._next_direct()
        frame = await self._frames.get()
        if frame is None:
            self._frames.put_nowait(None)  # later calls fail the same way
            raise self.closed_with or ConnectionClosed("socket closed")
        return frame

    async def _next_direct(self) -> dict[str, Any]:
        """:meth:`next` without a reader task: read until a frame for the owner."""
        recv = self.conn.recv
        while self.closed_with is None:
            try:
                data = await recv()
            except WsConnectionClosed:
                self._closed()
                break
            frame = self._pushed(data)
            if frame is not None:
                return frame
        raise self.closed_with or ConnectionClosed("socket closed")

    async def close(self) -> None:
        """Close the socket politely and wait for the reader to finish."""
        if self._refresher is not None:
            self._refresher.cancel()
        await self.conn.close()
        if self._reader is None:
            self._closed()
        else:
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._refresher is not None:
            await asyncio.gather(self._refresher, return_exceptions=True)


async def reopen(
    url: str,
    token: TokenLike | TokenSource,
    initial: float,
    maximum: float,
    *,
    delays: Iterator[float] | None = None,
    stop: asyncio.Event | None = None,
    direct: bool = False,
) -> Link:
    """Connect again after a drop, waiting out a backoff delay before each attempt.

    Args:
        url: the socket's URL.
        token: the token, or its source (asked afresh for each attempt).
        initial: first backoff ceiling (used when ``delays`` is not given).
        maximum: largest backoff ceiling (used when ``delays`` is not given).
        delays: the backoff schedule to continue (so a flapping gateway sees
            growing delays across reconnects, not a fresh schedule each time).
        stop: set to give up at once, even in the middle of a delay.
        direct: open the :class:`Link` with ``direct`` (see :meth:`Link.open`).

    Raises:
        LeasecastError: a permanent refusal (bad token, forbidden name, bad URL).
        ConnectionClosed: given up because ``stop`` was set.
    """
    schedule = delays if delays is not None else backoff_delays(initial, maximum)
    for delay in schedule:
        if stop is not None:
            # Sleep the delay, but wake at once if the owner closes meanwhile.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        else:
            await asyncio.sleep(delay)
        if stop is not None and stop.is_set():
            raise ConnectionClosed("closed while reconnecting")
        try:
            return await Link.open(url, token, direct=direct)
        except LeasecastError as exc:
            if permanent(exc):
                raise
            log.info("reconnecting to %s failed (%s); retrying", url, exc)
    raise AssertionError("backoff_delays never ends")
