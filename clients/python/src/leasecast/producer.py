"""An async producer: enqueues and publishes over ``/ws/produce/``.

.. code-block:: python

    async with Producer("http://127.0.0.1:8000", token=TOKEN) as producer:
        await producer.enqueue("emails", {"to": "ada@example.com"}, key="signup-42")
        await producer.enqueue("orders", {"step": 2}, group="order-7", priority=5, ttl=3600)
        await producer.enqueue_many("emails", [{"body": i} for i in range(10_000)])
        await producer.publish("prices", {"EURUSD": 1.09})

The fast path is the default (``batch=True``): :meth:`Producer.enqueue` calls
made in the same event-loop iteration (concurrent tasks, ``asyncio.gather``)
to one queue go in one ``enqueue_many`` frame; each call still gets its own
result or error (a frame the gateway refuses as a whole is sent again one
message per frame), and a lone call is sent at once, as an ``enqueue``.
``batch=False`` sends one ``enqueue`` frame per call.

A call in flight when the socket drops raises
:class:`~leasecast.errors.ConnectionClosed`: it may or may not have been
applied, so retry it, with an idempotency key to make the retry safe. The
next call reconnects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from leasecast.batching import Coalescer, Pending
from leasecast.errors import (
    Backpressure,
    ConnectionClosed,
    LeasecastError,
    ProtocolError,
    UnknownOp,
)
from leasecast.link import Link, enqueue_fields, ws_url
from leasecast.results import EnqueueResult, PublishResult
from leasecast.tokens import TokenLike, TokenSource

log = logging.getLogger("leasecast.client")

__all__ = ["CHUNK", "Producer"]

#: Messages per ``enqueue_many`` frame (the protocol allows 10,000; smaller frames
#: keep each store transaction and each reply short, and still pipeline).
CHUNK = 1000


class Producer:
    """Enqueues to any queue, and publishes to any topic, its token allows.

    Args:
        url: the gateway, ``http://host:port`` or ``ws://host:port``.
        token: a token with ``enqueue`` (and/or ``publish``) scopes, or a
            function (sync or async) returning one (see :class:`~leasecast.Worker`).
        batch: the fast path (default): concurrent :meth:`enqueue` calls to one
            queue share an ``enqueue_many`` frame. False: one frame per call.
    """

    def __init__(self, url: str, *, token: TokenLike, batch: bool = True) -> None:
        self.url = ws_url(url, "/ws/produce/")
        self._token = TokenSource(token)
        self._enqueues: Coalescer[str, dict[str, Any], EnqueueResult] | None = (
            Coalescer(self._flush_enqueues) if batch else None
        )
        self._link: Link | None = None
        self._connecting = asyncio.Lock()
        self._closed = False
        # Whether the gateway knows the ``enqueue_many`` extension; None until a
        # call finds out (a v1-only gateway answers ``unknown_op``).
        self._batch_op: bool | None = None

    async def __aenter__(self) -> Producer:
        await self._connected()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        """True while the socket is open."""
        return self._link is not None and self._link.is_open

    async def close(self) -> None:
        """Close the socket; later calls raise :class:`~leasecast.errors.ConnectionClosed`.

        Calls already made are sent and answered first (the socket closes after
        their replies, or when it drops).
        """
        if self._enqueues is not None:
            await self._enqueues.drain()  # calls already made are answered first
        self._closed = True
        if self._link is not None:
            await self._link.close()

    async def _connected(self) -> Link:
        # One attempt per call, no backoff: a producer's caller is waiting on
        # this call and decides itself whether and when to retry.
        async with self._connecting:
            if self._closed:
                raise ConnectionClosed("the producer is closed")
            if self._link is None or not self._link.is_open:
                self._link = await Link.open(self.url, self._token)
            return self._link

    async def enqueue(
        self,
        queue: str,
        body: Any,
        *,
        key: str | None = None,
        delay: float = 0,
        group: str | None = None,
        priority: int = 0,
        ttl: float | None = None,
    ) -> EnqueueResult:
        """Enqueue one message.

        ``group``, ``priority`` and ``ttl`` are protocol 1.1 fields, sent only
        when set: a gateway that predates them sees the v1 frame.

        Args:
            queue: the queue name.
            body: the message body, any JSON value.
            key: idempotency key; a repeat within the queue's dedup window is a
                no-op that returns the first message's id with ``duplicate`` true.
            delay: seconds before the message is visible.
            group: messages of one group are delivered one at a time, in enqueue
                order (1-200 characters).
            priority: -100..100; among visible messages a higher one goes first.
            ttl: seconds (> 0, at most a year); a message not acked within ``ttl``
                of its enqueue is dead-lettered with reason ``expired``.

        Returns:
            The message's id (and whether it was a duplicate) once it is stored.

        Raises:
            ProtocolError: refused (``invalid``, ``forbidden``, ``too_large``, ...).
            Backpressure: the queue is bounded (``max_length``) and full; nothing
                was applied.
            Unauthorized: the gateway refused the token.
            ConnectionClosed: the socket dropped first; retry (with a key).
        """
        message: dict[str, Any] = {"body": body, "delay": delay}
        message.update(enqueue_fields(key=key, group=group, priority=priority, ttl=ttl))
        if self._enqueues is not None:
            if self._closed:
                raise ConnectionClosed("the producer is closed")
            return await self._enqueues.submit(queue, message)
        return await self._enqueue_one(await self._connected(), queue, message)

    @staticmethod
    async def _enqueue_one(link: Link, queue: str, message: dict[str, Any]) -> EnqueueResult:
        reply = await link.request({**message, "op": "enqueue", "queue": queue})
        return EnqueueResult.from_wire(reply)

    async def _flush_enqueues(
        self, queue: str, batch: list[Pending[dict[str, Any], EnqueueResult]]
    ) -> None:
        """Send the enqueues of one loop iteration to ``queue``: one frame for all if it can.

        ``enqueue_many`` is all or nothing, so when the gateway refuses it as a
        whole nothing was applied, and each message is sent again on its own
        frame: every caller gets the answer it would have got alone.
        """
        link = await self._connected()
        if len(batch) > 1 and self._batch_op is not False:
            messages = [p.item for p in batch]
            try:
                replies = await self._pipeline(
                    [
                        {"op": "enqueue_many", "queue": queue, "messages": messages[i : i + CHUNK]}
                        for i in range(0, len(messages), CHUNK)
                    ],
                    [len(messages[i : i + CHUNK]) for i in range(0, len(messages), CHUNK)],
                )
            except UnknownOp:
                self._batch_op = False
            except ProtocolError as exc:
                log.info("enqueue_many to %s refused (%s); enqueuing one by one", queue, exc)
                if len(batch) > CHUNK:
                    # Several frames: some may have been applied. Only a
                    # refusal of one frame of one chunk is safe to split.
                    raise
            else:
                self._batch_op = True
                results = [item for reply in replies for item in reply["results"]]
                for pending, result in zip(batch, results, strict=True):
                    pending.settle(EnqueueResult.from_wire(result))
                return

        async def one(pending: Pending[dict[str, Any], EnqueueResult]) -> None:
            try:
                pending.settle(await self._enqueue_one(link, queue, pending.item))
            except LeasecastError as exc:
                pending.fail(exc)

        await asyncio.gather(*(one(pending) for pending in batch))

    async def enqueue_many(
        self,
        queue: str,
        messages: Iterable[Mapping[str, Any]],
        *,
        group: str | None = None,
        priority: int = 0,
        ttl: float | None = None,
    ) -> list[EnqueueResult]:
        """Enqueue many messages, pipelined: every frame is sent before any reply is awaited.

        Messages go in ``enqueue_many`` frames of :data:`CHUNK` (each frame is
        all or nothing), or, if the gateway does not know that extension, in one
        ``enqueue`` frame each.

        Args:
            queue: the queue name.
            messages: ``{"body", "key"?, "delay"?, "group"?, "priority"?, "ttl"?}``
                each (see :meth:`enqueue`).
            group: the group of every message that does not name its own.
            priority: the priority of every message that does not give its own.
            ttl: the ttl of every message that does not give its own.

        Returns:
            One result per message, in order.

        Raises:
            ProtocolError: some messages were refused. Other frames are independent
                and may have been applied; the exception's notes say which part
                failed. Retrying with idempotency keys is safe.
            ConnectionClosed: the socket dropped before every reply came.
        """
        defaults = enqueue_fields(group=group, priority=priority, ttl=ttl)
        batch = [{**defaults, **message} for message in messages]
        if not batch:
            return []
        if self._batch_op is not False:
            chunks = [batch[i : i + CHUNK] for i in range(0, len(batch), CHUNK)]
            frames = [{"op": "enqueue_many", "queue": queue, "messages": c} for c in chunks]
            try:
                replies = await self._pipeline(frames, [len(c) for c in chunks])
            except UnknownOp:
                # Every frame was refused the same way, so nothing was applied:
                # fall back to single enqueues (and remember, for later calls).
                self._batch_op = False
            else:
                self._batch_op = True
                results = [result for reply in replies for result in reply["results"]]
                return [EnqueueResult.from_wire(result) for result in results]
        frames = [{**message, "op": "enqueue", "queue": queue} for message in batch]
        replies = await self._pipeline(frames, [1] * len(frames))
        return [EnqueueResult.from_wire(reply) for reply in replies]

    async def _pipeline(
        self, frames: list[dict[str, Any]], sizes: list[int]
    ) -> list[dict[str, Any]]:
        """Send every frame, then collect every reply, in order.

        Args:
            frames: the request frames.
            sizes: how many messages each frame carries (for the error note).

        Raises:
            LeasecastError: the first failure, once every reply has settled, so
                no request is still unanswered when the caller sees it.
        """
        link = await self._connected()
        # Sending does not wait for replies: the reader task matches them by
        # ref as they come, so the socket stays full in both directions.
        refs: list[int] = []
        replies: list[dict[str, Any]] = []
        failed: list[tuple[int, LeasecastError]] = []
        try:
            for frame in frames:
                refs.append(await link.send(frame))
            for index, ref in enumerate(refs):
                try:
                    replies.append(await link.reply(ref))
                except Backpressure as exc:
                    if exc.retry_after is None:
                        failed.append((index, exc))
                        continue
                    # Over the token's rate: nothing of this frame was applied;
                    # send it again after the advised wait (bounded, in request()).
                    try:
                        replies.append(await link.request(frames[index]))
                    except LeasecastError as again:
                        failed.append((index, again))
                except LeasecastError as exc:
                    failed.append((index, exc))
        finally:
            # A send that failed, or a cancelled caller, leaves replies nobody
            # will claim: forget them (the socket may live on for other calls).
            for ref in refs[len(replies) + len(failed) :]:
                link.forget(ref)
        if not failed:
            return replies
        index, first = failed[0]
        start = sum(sizes[:index])
        what = "were refused" if isinstance(first, ProtocolError) else "got no reply"
        first.add_note(
            f"enqueue_many: messages {start}..{start + sizes[index] - 1} {what}; "
            f"{len(failed)} of {len(frames)} frames failed, the others were applied"
        )
        raise first

    async def publish(self, topic: str, body: Any) -> PublishResult:
        """Publish to a broadcast topic.

        Returns once the gateway accepted it for delivery: every subscriber
        buffer of the gateway took it (or dropped it by its policy) and it was
        handed on to the other gateway processes.

        Args:
            topic: the topic name.
            body: the message body, any JSON value.

        Returns:
            The message's ``seq`` (and ``offset`` and ``epoch`` from a gateway
            with topic history).

        Raises:
            Forbidden: the token may not publish to ``topic``.
            ConnectionClosed: the socket dropped before the reply.
        """
        reply = await (await self._connected()).request(
            {"op": "publish", "topic": topic, "body": body}
        )
        return PublishResult.from_wire(topic, reply)
