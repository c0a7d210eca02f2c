"""An async subscriber for a Leasecast broadcast topic.

.. code-block:: python

    async with Subscriber("ws://127.0.0.1:8000", "prices", token=TOKEN) as subscriber:
        async for message in subscriber:
            print(message.seq, message.body, subscriber.dropped)

Credit is automatic: the subscriber grants more as the caller consumes, so
the gateway never sends more than the caller has room for, and the topic's
buffer policy (``on_full``) applies in the gateway when the caller is slow.
After a reconnect the stream starts again from what is published then
(topics are not durable); ``seq`` restarts with the new socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from gateway.client.link import Link, name_path, reopen, ws_url
from gateway.errors import ConnectionClosed

__all__ = ["Message", "Subscriber"]


@dataclass(frozen=True)
class Message:
    """One broadcast message."""

    topic: str
    seq: int
    body: Any


class Subscriber:
    """Receives every message published to one topic.

    Args:
        url: the gateway, ``ws://host:port`` or ``http://host:port``.
        topic: the topic name.
        token: a token with ``subscribe`` on the topic.
        capacity: the socket's buffer in the gateway (1..1,000,000).
        on_full: ``drop_oldest``, ``drop_newest`` or ``block``.
        priority: share of the gateway's send capacity under contention.
        credit: the window of messages in flight to this client.
        reconnect: reconnect after the socket drops (never after a refusal).
    """

    def __init__(
        self,
        url: str,
        topic: str,
        *,
        token: str,
        capacity: int = 1024,
        on_full: str = "drop_oldest",
        priority: int = 1,
        credit: int = 256,
        # -- reconnecting
        reconnect: bool = True,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
    ) -> None:
        self.url = ws_url(
            url,
            name_path("/ws/topics/", topic),
            {"capacity": capacity, "on_full": on_full, "priority": priority, "credit": credit},
        )
        self.topic = topic
        self._token = token
        self._window = credit
        self._reconnect = reconnect
        self._backoff = (backoff_initial, backoff_max)
        self._link: Link | None = None
        self._opened = False  # a socket was opened once: later ones are reconnects
        self._closing = False
        # Set by close(), so a reconnect in its backoff sleep gives up at once.
        self._stop = asyncio.Event()
        self._consumed = 0  # since the last grant
        #: messages this subscriber lost to its policy, as the gateway reported
        self.dropped = 0
        self.reconnects = 0

    async def __aenter__(self) -> Subscriber:
        await self._open_first()
        return self

    async def _open_first(self) -> None:
        # The first connection fails fast (no backoff, no retry) and is not a
        # reconnect, whether ``async with`` or the first iteration makes it.
        link = await Link.open(self.url, self._token)
        if self._closing:  # close() ran while the handshake was under way
            await link.close()
            raise ConnectionClosed("the subscriber is closed")
        self._link = link
        self._opened = True

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the socket."""
        self._closing = True
        self._stop.set()
        if self._link is not None:
            await self._link.close()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Message]:
        while not self._closing:
            if self._link is None:
                try:
                    if self._opened:
                        await self._reconnect_with_backoff()
                    else:
                        await self._open_first()
                except ConnectionClosed:
                    if self._closing:
                        return
                    raise
            link = self._link
            assert link is not None
            try:
                frame = await link.next()
            except ConnectionClosed:
                if self._closing or not self._reconnect:
                    return
                self._link = None
                continue
            if frame.get("op") != "messages":
                continue
            self.dropped += int(frame.get("dropped", 0))
            for item in frame["items"]:
                yield Message(frame["topic"], item["seq"], item["body"])
                await self._consumed_one(link)

    async def _consumed_one(self, link: Link) -> None:
        # Refill the window in halves: few credit frames, never a stall.
        self._consumed += 1
        if self._consumed >= max(1, self._window // 2):
            grant, self._consumed = self._consumed, 0
            # If the socket is closing, the reconnect starts a new window.
            with contextlib.suppress(Exception):
                await link.conn.send(f'{{"op":"credit","n":{grant}}}')

    async def _reconnect_with_backoff(self) -> None:
        link = await reopen(self.url, self._token, *self._backoff, stop=self._stop)
        if self._closing:  # close() ran while the handshake was under way
            await link.close()
            raise ConnectionClosed("the subscriber is closed")
        self._link = link
        self._consumed = 0
        self.reconnects += 1
