"""Many topics on one socket: the multiplexed socket ``/ws/`` (protocol 1.2).

.. code-block:: python

    async with Multiplexer("ws://127.0.0.1:8000", token=TOKEN) as mux:
        prices = await mux.subscribe("prices")
        news = await mux.subscribe("news", on_full="drop_newest", presence=True)
        async for message in prices:
            print(message.topic, message.seq, message.body)

Each :class:`Subscription` is what a :class:`~leasecast.subscriber.Subscriber`
is on a socket of its own: its own buffer and policy in the gateway, its own
credit (granted as the caller consumes), its own ``seq`` and resume position.
When the socket drops, the multiplexer reconnects (with backoff) and
subscribes every topic again from its position (``since``/``epoch``), so a
topic that keeps history loses nothing; one that cannot be recovered counts
a gap (:attr:`Subscription.gaps`). A subscription the gateway ends
(``unsubscribed`` with ``slow_consumer`` or ``stream_restarted``) is
subscribed again the same way.

Presence: with ``presence=True`` the subscription keeps the topic's
:attr:`Subscription.members` up to date and calls ``on_join`` / ``on_leave``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from leasecast.api import http_get
from leasecast.errors import ConnectionClosed, Invalid
from leasecast.link import Link, backoff_delays, reopen, ws_url
from leasecast.results import Subscribed
from leasecast.subscriber import Message, ResumePosition, is_gap
from leasecast.tokens import TokenLike, TokenSource

__all__ = ["Member", "Multiplexer", "Subscription"]

log = logging.getLogger("leasecast.client")

#: A member of a topic's presence: ``{"client", "user", "info"}``.
Member = dict[str, Any]
#: A presence callback: plain or ``async``.
PresenceCallback = Callable[[Member], Awaitable[None] | None]

_END = object()


class Subscription:
    """One topic on a :class:`Multiplexer`: async-iterate it for its :class:`Message` s.

    Attributes:
        topic: the topic.
        position: where it resumes from after a reconnect.
        subscribed: the last ``subscribed`` frame.
        dropped: messages its gateway buffer dropped by its policy.
        gaps: resumes the gateway could not recover (messages were missed).
        members: the topic's members by client id (with ``presence=True``).
    """

    def __init__(
        self,
        mux: Multiplexer,
        topic: str,
        options: dict[str, Any],
        *,
        on_join: PresenceCallback | None,
        on_leave: PresenceCallback | None,
    ) -> None:
        self._mux = mux
        self.topic = topic
        self._options = options
        self._window = int(options.get("credit", 256))
        self._on_join = on_join
        self._on_leave = on_leave
        self.position = ResumePosition(options.pop("since", None), options.pop("epoch", None))
        self.subscribed: Subscribed | None = None
        self.dropped = 0
        self.gaps = 0
        self.members: dict[str, Member] = {}
        self._items: asyncio.Queue[Any] = asyncio.Queue()
        self._consumed = 0
        self._asked: dict[str, Any] = {}
        self.closed = False

    def frame(self) -> dict[str, Any]:
        """The ``subscribe`` frame for (re)subscribing from the current position."""
        self._asked = self.position.params()
        return {"op": "subscribe", "topic": self.topic, **self._options, **self._asked}

    async def started(self, reply: dict[str, Any]) -> None:
        """Take the ``subscribed`` reply."""
        frame = Subscribed.from_wire(self.topic, reply)
        self.subscribed = frame
        self._consumed = 0  # a new window on the gateway's side
        self.position.subscribed(frame, asked=bool(self._asked))
        if is_gap(frame, self._asked):
            self.gaps += 1
            log.warning("topic %s: resume not recovered; messages were missed", self.topic)

    async def take(self, frame: dict[str, Any]) -> None:
        """A frame for this topic, from the multiplexer's reader."""
        op = frame.get("op")
        if op == "messages":
            self.dropped += int(frame.get("dropped", 0))
            for item in frame["items"]:
                self._items.put_nowait(item)
        elif op == "presence":
            for member in frame.get("joins", []):
                await self._joined(member)
            for member in frame.get("leaves", []):
                await self._left(member)
        elif op == "join":
            await self._joined({k: frame.get(k) for k in ("client", "user", "info")})
        elif op == "leave":
            await self._left({k: frame.get(k) for k in ("client", "user")})

    async def _joined(self, member: Member) -> None:
        self.members[str(member.get("client"))] = member
        await _call(self._on_join, member)

    async def _left(self, member: Member) -> None:
        self.members.pop(str(member.get("client")), None)
        await _call(self._on_leave, member)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Message]:
        while True:
            item = await self._items.get()
            if item is _END:
                self._items.put_nowait(_END)
                return
            offset = item.get("offset")
            offset = int(offset) if offset is not None else None
            if not self.position.seen(offset):  # else: had before a resubscription
                # Counted before the yield: a message handed to the caller is consumed.
                self.position.consumed(offset)
                yield Message(self.topic, int(item["seq"]), item["body"], offset)
            await self._granted_one()

    async def _granted_one(self) -> None:
        # Refill the window in halves: few credit frames, never a stall.
        self._consumed += 1
        if self._consumed >= max(1, self._window // 2):
            grant, self._consumed = self._consumed, 0
            await self._mux.credit(self.topic, grant)

    async def unsubscribe(self) -> None:
        """Stop receiving the topic; iteration ends after what arrived before."""
        await self._mux.unsubscribe(self.topic)

    def end(self) -> None:
        """End iteration (unsubscribed, or the multiplexer closed)."""
        self.closed = True
        self._items.put_nowait(_END)


class Multiplexer:
    """One ``/ws/`` socket carrying many topic subscriptions.

    Args:
        url: the gateway, ``ws://host:port`` or ``http://host:port``.
        token: a token with ``subscribe`` on the topics (a callable for fresh
            signed tokens: the socket refreshes them).
        reconnect: reconnect and resubscribe after the socket drops.
    """

    def __init__(
        self,
        url: str,
        *,
        token: TokenLike,
        reconnect: bool = True,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
    ) -> None:
        self._base = url
        self.url = ws_url(url, "/ws/")
        self._token = TokenSource(token)
        self._reconnect = reconnect
        self._backoff = (backoff_initial, backoff_max)
        self._link: Link | None = None
        self._subs: dict[str, Subscription] = {}
        self._reader: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # resubscriptions under way
        self._closing = False
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()  # set while a socket is open and subscribed
        #: sockets opened again after a drop
        self.reconnects = 0

    async def __aenter__(self) -> Multiplexer:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the socket (the first one fails fast: no retry)."""
        self._link = await Link.open(self.url, self._token)
        self._ready.set()
        self._reader = asyncio.create_task(self._read())

    @property
    def link(self) -> Link:
        """The current socket (for its statistics)."""
        if self._link is None:
            raise ConnectionClosed("the multiplexer is not open")
        return self._link

    async def subscribe(
        self,
        topic: str,
        *,
        capacity: int = 1024,
        on_full: str = "drop_oldest",
        priority: int = 1,
        credit: int = 256,
        since: int | None = None,
        epoch: str | None = None,
        presence: bool = False,
        on_join: PresenceCallback | None = None,
        on_leave: PresenceCallback | None = None,
    ) -> Subscription:
        """Subscribe to ``topic`` on this socket.

        Raises:
            Invalid: subscribed already, bad options, or over the gateway's
                subscriptions per socket.
            Forbidden: the token may not subscribe to the topic.
        """
        if topic in self._subs:
            raise Invalid(f"topic {topic!r} is subscribed on this multiplexer already")
        options: dict[str, Any] = {
            "capacity": capacity,
            "on_full": on_full,
            "priority": priority,
            "credit": credit,
            "since": since,
            "epoch": epoch,
        }
        if presence:
            options["presence"] = True
        sub = Subscription(self, topic, options, on_join=on_join, on_leave=on_leave)
        self._subs[topic] = sub
        try:
            await self._ready.wait()
            await sub.started(await self.link.request(sub.frame()))
        except BaseException:
            self._subs.pop(topic, None)
            raise
        return sub

    async def unsubscribe(self, topic: str) -> None:
        """Stop receiving ``topic``."""
        sub = self._subs.pop(topic, None)
        if sub is None:
            return
        with contextlib.suppress(ConnectionClosed):
            await self.link.request({"op": "unsubscribe", "topic": topic})
        sub.end()

    async def credit(self, topic: str, n: int) -> None:
        """Grant ``n`` more messages of ``topic`` (the subscriptions do it as they are read)."""
        link = self._link
        if link is None or not link.is_open:
            return  # a resubscription starts a new window
        frame = orjson.dumps({"op": "credit", "topic": topic, "n": n}).decode()
        with contextlib.suppress(Exception):
            await link.conn.send(frame)

    async def presence(self, topic: str) -> dict[str, Any]:
        """``GET /api/topics/TOPIC/presence``: every subscription of the topic, everywhere."""
        token = await self._token.get()
        return await asyncio.to_thread(http_get, self._base, f"/api/topics/{topic}/presence", token)

    async def _read(self) -> None:
        delays = backoff_delays(*self._backoff)
        while not self._closing:
            link = self._link
            assert link is not None
            try:
                frame = await link.next()
            except ConnectionClosed:
                if self._closing or not self._reconnect:
                    break
                self._ready.clear()
                try:
                    await self._reopen(delays)
                except ConnectionClosed:
                    break
                continue
            topic = frame.get("topic")
            sub = self._subs.get(topic) if isinstance(topic, str) else None
            if sub is None:
                continue
            if frame.get("op") == "unsubscribed":
                # The gateway ended it (slow consumer, stream restarted): again
                # from its position, as a subscriber socket reconnects.
                log.warning("topic %s: unsubscribed (%s); subscribing again", topic, frame)
                task = asyncio.create_task(self._resubscribe(sub))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                continue
            await sub.take(frame)
        for sub in self._subs.values():
            sub.end()

    async def _reopen(self, delays: Any) -> None:
        self._link = await reopen(
            self.url, self._token, *self._backoff, delays=delays, stop=self._stop
        )
        self.reconnects += 1
        # Every topic again, from its position: resumed together.
        for sub in list(self._subs.values()):
            await self._resubscribe(sub)
        self._ready.set()

    async def _resubscribe(self, sub: Subscription) -> None:
        try:
            await sub.started(await self.link.request(sub.frame()))
        except ConnectionClosed:
            pass  # the reader reconnects and tries again
        except Exception as exc:
            log.warning("topic %s: could not subscribe again (%s)", sub.topic, exc)
            self._subs.pop(sub.topic, None)
            sub.end()

    async def close(self) -> None:
        """Close the socket; every subscription's iteration ends."""
        self._closing = True
        self._stop.set()
        if self._link is not None:
            await self._link.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        for sub in self._subs.values():
            sub.end()


async def _call(callback: PresenceCallback | None, member: Member) -> None:
    if callback is None:
        return
    result = callback(member)
    if inspect.isawaitable(result):
        await result
