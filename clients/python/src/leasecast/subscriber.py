"""An async subscriber for a Leasecast broadcast topic.

.. code-block:: python

    async with Subscriber("ws://127.0.0.1:8000", "prices", token=TOKEN) as subscriber:
        async for message in subscriber:
            print(message.seq, message.body, subscriber.dropped)

Credit is automatic: the subscriber grants more as the caller consumes, so
the gateway never sends more than the caller has room for, and the topic's
buffer policy (``on_full``) applies in the gateway when the caller is slow.

Resume (protocol 1.1, "Topics: history, offsets and resume"): the subscriber
keeps the last ``offset`` it yielded and the topic's ``epoch`` (from the
gateway's ``subscribed`` frames, or ``messages`` frames that carry one) and
reconnects with ``since=OFFSET&epoch=EPOCH``: with a topic that keeps
history, the messages missed while disconnected come first, with no gap and
no duplicate. When the gateway cannot recover that position (another epoch,
or older than its history), it says so (``recovered: false``): the
subscriber logs a warning, counts it in :attr:`Subscriber.gaps`, keeps the
frame in :attr:`Subscriber.subscribed` and calls ``on_gap``; live messages
follow. To learn the epoch from the start, a socket opened without a
position asks ``recover=latest``: the gateway answers ``subscribed`` (the
epoch and latest offset) and the latest message it keeps, which the
subscriber skips (it was published before the subscription), so the caller
sees only what is published afterwards, as in v1. Any message at or below
the position is skipped likewise (never a duplicate). A gateway without topic
history sends no ``subscribed`` frame and no offsets: the subscriber then
reconnects without resuming, as in v1 (``seq`` restarts with each socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from leasecast.errors import ConnectionClosed
from leasecast.link import Link, name_path, reopen, ws_url
from leasecast.results import Subscribed
from leasecast.tokens import TokenLike, TokenSource

__all__ = ["Message", "ResumePosition", "Subscriber", "is_gap"]

log = logging.getLogger("leasecast.client")


@dataclass(frozen=True)
class Message:
    """One broadcast message.

    Attributes:
        topic: the topic.
        seq: its number on this socket (restarts at 1 with each socket).
        body: the message body.
        offset: its offset in the topic (protocol 1.1), or None from a gateway
            without topic history.
    """

    topic: str
    seq: int
    body: Any
    offset: int | None = None


@dataclass
class ResumePosition:
    """Where a subscriber is in its topic: pure bookkeeping for resuming.

    ``offset`` is the last offset yielded to the caller (a message received but
    not yet consumed is not counted: it comes again after a reconnect), and
    ``epoch`` the epoch those offsets belong to. Both are needed to resume.
    """

    offset: int | None = None
    epoch: str | None = None

    def params(self) -> dict[str, Any]:
        """The query parameters to resume from here (none unless both are known)."""
        if self.offset is None or self.epoch is None:
            return {}
        return {"since": self.offset, "epoch": self.epoch}

    def subscribed(self, frame: Subscribed, *, asked: bool) -> None:
        """Take a ``subscribed`` frame.

        Args:
            frame: the frame.
            asked: whether this socket asked to resume from this position.
        """
        if frame.epoch != self.epoch or not (asked and frame.recovered):
            # Another epoch, or a position the gateway could not recover: the
            # stream goes on from the topic's latest offset.
            self.offset = frame.offset
        self.epoch = frame.epoch

    def messages(self, frame: dict[str, Any]) -> None:
        """Take the ``epoch`` of a ``messages`` frame, if it carries one."""
        epoch = frame.get("epoch")
        if isinstance(epoch, str):
            self.epoch = epoch

    def seen(self, offset: int | None) -> bool:
        """Whether a message at ``offset`` is at or before the position (not to yield)."""
        return offset is not None and self.offset is not None and offset <= self.offset

    def consumed(self, offset: int | None) -> None:
        """A message with ``offset`` was yielded to the caller."""
        if offset is not None:
            self.offset = offset


#: How :meth:`Subscriber._messages` makes a :class:`Message`: without the
#: frozen dataclass's ``__init__`` (one checked field assignment at a time),
#: which was a visible part of a subscriber's CPU per message. The same
#: object, equal and frozen; its fields dict must name every field.
_NEW: Any = object.__new__
_SET: Any = object.__setattr__


def is_gap(frame: Subscribed, asked: dict[str, Any]) -> bool:
    """Whether a ``subscribed`` frame means messages were missed.

    Args:
        frame: the frame.
        asked: the ``since`` and ``epoch`` the socket asked for ({} if none).

    Returns:
        True when a resume was asked and not recovered, unless the topic is
        still at the position asked (same epoch and offset: nothing to miss).
    """
    if not asked or frame.recovered:
        return False
    return not (frame.epoch == asked.get("epoch") and frame.offset == asked.get("since"))


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
        since: resume from this offset (with ``epoch``): e.g. a position saved
            by an earlier run (:attr:`position`).
        epoch: the epoch of ``since``.
        on_gap: called (plain or ``async``) with the :class:`~leasecast.results.Subscribed`
            frame when the gateway could not recover the position asked for:
            messages were missed.
        resume: keep the position across reconnects (default). False: every
            socket starts from what is published then (v1).
    """

    def __init__(
        self,
        url: str,
        topic: str,
        *,
        token: TokenLike,
        capacity: int = 1024,
        on_full: str = "drop_oldest",
        priority: int = 1,
        credit: int = 256,
        # -- reconnecting
        reconnect: bool = True,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        # -- resuming
        since: int | None = None,
        epoch: str | None = None,
        on_gap: Callable[[Subscribed], Awaitable[None] | None] | None = None,
        resume: bool = True,
    ) -> None:
        self._base = url
        self._params: dict[str, Any] = {
            "capacity": capacity,
            "on_full": on_full,
            "priority": priority,
            "credit": credit,
        }
        self.topic = topic
        self.url = ws_url(url, name_path("/ws/topics/", topic), self._params)
        #: the position resumed from after a reconnect
        self.position = ResumePosition(since, epoch)
        self._resume = resume
        self._on_gap = on_gap
        #: the last ``subscribed`` frame (None before one came)
        self.subscribed: Subscribed | None = None
        #: how many times a resume could not be recovered (messages were missed)
        self.gaps = 0
        # The position the current socket asked for ({} if none).
        self._asked: dict[str, Any] = {}
        self._token = TokenSource(token)
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

    def _url(self) -> str:
        """The socket's URL, with the resume position when there is one."""
        resume = self.position.params() if self._resume else {}
        self._asked = resume
        # Without a position, ask the gateway for one: the subscribed frame
        # gives the epoch, and the one message replayed is skipped (seen()).
        learn = {"recover": "latest"} if self._resume and not resume else {}
        return ws_url(
            self._base, name_path("/ws/topics/", self.topic), {**self._params, **resume, **learn}
        )

    async def _open_first(self) -> None:
        # The first connection fails fast (no backoff, no retry) and is not a
        # reconnect, whether ``async with`` or the first iteration makes it.
        link = await Link.open(self._url(), self._token, direct=True)
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
            op = frame.get("op")
            if op == "subscribed":
                await self._subscribed(Subscribed.from_wire(self.topic, frame))
                continue
            if op != "messages":
                continue
            position = self.position
            position.messages(frame)
            dropped = frame.get("dropped")
            if dropped:
                self.dropped += int(dropped)
            topic = frame["topic"]
            # The per-message work is inlined below (no call per message but
            # the yield): a subscriber's CPU per message is what limits it
            # beside a fast gateway (docs/benchmarks.md, "Fan-out").
            half = max(1, self._window // 2)
            new, fill = _NEW, _SET
            for item in frame["items"]:
                offset = item.get("offset")
                if offset is not None:
                    if type(offset) is not int:
                        item["offset"] = offset = int(offset)
                    last = position.offset
                    if last is not None and offset <= last:
                        # Published before this subscription started (the
                        # latest message recover=latest replays), or already
                        # yielded: position.seen(offset).
                        self._consumed += 1
                        if self._consumed >= half:
                            await self._grant(link)
                        continue
                    # Counted before the yield (position.consumed(offset)): a
                    # message handed to the caller is consumed, even if the
                    # caller stops iterating right after.
                    position.offset = offset
                message = new(Message)
                if offset is not None and len(item) == 3:
                    # The item is exactly seq, offset and body, in a dict of
                    # its own (just parsed): it becomes the message's fields,
                    # with the topic added, instead of a copy.
                    item["topic"] = topic
                    fill(message, "__dict__", item)
                else:
                    fields = {
                        "topic": topic,
                        "seq": item["seq"],
                        "body": item["body"],
                        "offset": offset,
                    }
                    fill(message, "__dict__", fields)
                yield message
                self._consumed += 1
                if self._consumed >= half:
                    await self._grant(link)

    async def _subscribed(self, frame: Subscribed) -> None:
        self.subscribed = frame
        asked = self._asked
        self.position.subscribed(frame, asked=bool(asked))
        if is_gap(frame, asked):
            self.gaps += 1
            log.warning(
                "topic %s: the gateway could not resume the subscription (recovered: false); "
                "messages published while disconnected were missed",
                self.topic,
            )
            if self._on_gap is not None:
                result = self._on_gap(frame)
                if inspect.isawaitable(result):
                    await result

    async def _grant(self, link: Link) -> None:
        # The window is refilled in halves: few credit frames, never a stall.
        grant, self._consumed = self._consumed, 0
        # If the socket is closing, the reconnect starts a new window.
        with contextlib.suppress(Exception):
            await link.conn.send(f'{{"op":"credit","n":{grant}}}')

    async def _reconnect_with_backoff(self) -> None:
        link = await reopen(self._url(), self._token, *self._backoff, stop=self._stop, direct=True)
        if self._closing:  # close() ran while the handshake was under way
            await link.close()
            raise ConnectionClosed("the subscriber is closed")
        self._link = link
        self._consumed = 0
        self.reconnects += 1
