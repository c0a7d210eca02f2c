"""An async worker for a Leasecast queue.

.. code-block:: python

    async with Worker("ws://127.0.0.1:8000", "emails", token=TOKEN, prefetch=10) as worker:
        async for delivery in worker:
            await handle(delivery.body)
            await delivery.ack()

The gateway pushes deliveries while the worker holds fewer than ``prefetch``
unacked leases. If the socket drops, the worker reconnects with backoff; the
gateway released the old socket's leases at once, so their receipts are
stale (ending them raises :class:`~leasecast.errors.StaleReceipt`) and those
messages come again (``deliveries`` counts it).

The fast path is the default (``batch=True``): the worker asks the gateway for
batched deliveries (``deliveries`` frames of up to ``prefetch`` items) and
plain acks made in the same event-loop iteration go in one ``ack_many``
frame; each :meth:`Delivery.ack` still gets its own result or error, and a
lone ack is sent at once, as an ``ack``. ``batch=False`` speaks only v1
frames (one ``deliver`` and one ``ack`` per message).

A message cancelled while a worker holds it (``POST
/api/queues/QUEUE/messages/ID/cancel``) is dead-lettered by the gateway, which
tells the socket holding it with a ``cancel`` frame: its
:attr:`Delivery.cancelled` event is set at once (even while the handler is
busy with it) and the worker's ``on_cancel`` callback, if any, is called.
Its lease is over: ending it raises :class:`~leasecast.errors.StaleReceipt`.

.. code-block:: python

    async def handle(delivery):
        work = asyncio.create_task(process(delivery.body))
        stop = asyncio.create_task(delivery.cancelled.wait())
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        if delivery.cancelled.is_set():
            work.cancel()  # the gateway has dead-lettered it: nothing to ack
        else:
            stop.cancel()
            await delivery.ack()
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from leasecast.batching import Coalescer, Pending, split_acked_many
from leasecast.errors import (
    ConnectionClosed,
    LeasecastError,
    ProtocolError,
    StaleReceipt,
    UnknownOp,
)
from leasecast.link import Link, backoff_delays, enqueue_fields, name_path, reopen, ws_url
from leasecast.results import EnqueueResult
from leasecast.tokens import TokenLike, TokenSource

log = logging.getLogger("leasecast.client")

#: Most deliveries the worker asks for per frame (the protocol's limit for ``batch``).
MAX_BATCH = 1000
#: Receipts cancelled before their delivery was read, remembered so that the
#: delivery is skipped when it is (a bound: cancels are rare, receipts unique).
MAX_EARLY_CANCELS = 1000

__all__ = ["Delivery", "Worker"]


@dataclass
class Delivery:
    """One leased message. End the lease with exactly one of ack, nack or reject.

    Attributes:
        queue: the queue it came from.
        id: the message id (stable across redeliveries).
        receipt: this lease's receipt (new on each delivery).
        body: the message body, any JSON value.
        deliveries: how many times the message was delivered, this one included.
        expires_in: seconds until the lease ends unless extended (as of delivery,
            or of the last :meth:`extend`).
        group: the message's group (protocol 1.1), or None: the next message of
            the group is not delivered before this one is acked or dead-lettered.
        priority: the message's priority, -100..100 (0 unless it was given one).
        cancelled: set when the gateway cancels the message while this lease
            holds it (a ``cancel`` frame): the message is dead-lettered and the
            lease is over, so stop working on it; ending it raises
            :class:`~leasecast.errors.StaleReceipt`.
    """

    queue: str
    id: str
    receipt: str
    body: Any
    deliveries: int
    expires_in: float
    group: str | None = None
    priority: int = 0
    cancelled: asyncio.Event = field(
        default_factory=asyncio.Event, repr=False, compare=False, kw_only=True
    )
    _link: Link = field(repr=False, compare=False, kw_only=True)
    _acks: Coalescer[Link, str, None] | None = field(
        default=None, repr=False, compare=False, kw_only=True
    )

    def _check_open(self) -> None:
        if not self._link.is_open:
            # The gateway released every lease of that socket when it closed:
            # the answer is known without asking (and the new socket would
            # only say stale_receipt too).
            raise StaleReceipt(
                f"the socket that leased message {self.id} closed; the gateway released it"
            )
        if self.cancelled.is_set():
            # The gateway said so with a cancel frame: asking would only get
            # stale_receipt back.
            raise StaleReceipt(f"message {self.id} was cancelled; its lease is over")

    async def _request(self, frame: dict[str, Any]) -> dict[str, Any]:
        self._check_open()
        return await self._link.request(frame)

    async def ack(
        self, enqueue: list[dict[str, Any]] | None = None, *, task: dict[str, Any] | None = None
    ) -> list[EnqueueResult]:
        """Delete the message, and enqueue follow-ups in the same transaction.

        Args:
            enqueue: messages ``{"body", "queue"?, "key"?, "delay"?, "group"?,
                "priority"?, "ttl"?}`` to enqueue atomically with the ack (``queue``
                defaults to this one; the fields mean what they mean for
                :meth:`Worker.enqueue`).
            task: extension for task workers: the outcome of the task this
                message carries, ``{"id", "status", "worker_id", "started_at",
                "return_value"?, "error"?}``, recorded in the ack's transaction
                (docs/protocol.md, Task outcomes).

        Returns:
            The follow-ups' results, in order (empty without ``enqueue``).

        Raises:
            StaleReceipt: the lease had ended (expired, already ended, or its socket
                closed); nothing was applied.
            ProtocolError: a follow-up was invalid or forbidden; nothing was applied.
            ConnectionClosed: the socket dropped before the reply; the ack may or
                may not have been applied (if not, the message comes again).
        """
        if not enqueue and task is None and self._acks is not None:
            # The fast path: coalesced with the other acks of this iteration.
            self._check_open()
            await self._acks.submit(self._link, self.receipt)
            return []
        frame: dict[str, Any] = {"op": "ack", "receipt": self.receipt}
        if enqueue:
            frame["enqueue"] = enqueue
        if task is not None:
            frame["task"] = task
        reply = await self._request(frame)
        return [EnqueueResult.from_wire(item) for item in reply.get("enqueued", [])]

    async def nack(self, delay: float = 0.0, *, task: dict[str, Any] | None = None) -> None:
        """Release the message; it is visible again after ``delay`` seconds.

        Args:
            delay: seconds before the message is visible again (>= 0).
            task: extension for task workers: a failed attempt's outcome (status
                READY, with its ``error``), recorded in the nack's transaction.

        Raises:
            StaleReceipt: the lease had ended.
            Invalid: ``delay`` is out of range.
            ConnectionClosed: the socket dropped before the reply.
        """
        frame: dict[str, Any] = {"op": "nack", "receipt": self.receipt, "delay": delay}
        if task is not None:
            frame["task"] = task
        await self._request(frame)

    async def reject(self) -> None:
        """Dead-letter the message now.

        Raises:
            StaleReceipt: the lease had ended.
            ConnectionClosed: the socket dropped before the reply.
        """
        await self._request({"op": "reject", "receipt": self.receipt})

    async def extend(self, timeout: float) -> float:
        """Make the lease end ``timeout`` seconds from now.

        Args:
            timeout: the new lease length, in seconds from now.

        Returns:
            The lease's new ``expires_in`` (also stored on this delivery).

        Raises:
            StaleReceipt: the lease had ended.
            Invalid: ``timeout`` is out of range.
            ConnectionClosed: the socket dropped before the reply.
        """
        reply = await self._request({"op": "extend", "receipt": self.receipt, "timeout": timeout})
        self.expires_in = float(reply["expires_in"])
        return self.expires_in


class Worker:
    """Consumes one queue over a worker socket; iterate it for :class:`Delivery` objects.

    Opening (``async with`` or :meth:`connect`) fails fast: a wrong URL or a
    gateway that is down raises at once. Once connected, a dropped socket is
    reopened with exponential backoff; a refusal a retry cannot cure (bad
    token, forbidden queue, invalid parameters) raises instead.

    Args:
        url: the gateway, ``http://host:port`` or ``ws://host:port``.
        queue: the queue name.
        token: a token with ``consume`` on the queue (and ``enqueue`` for
            :meth:`enqueue` and ack follow-ups), or a function (sync or async)
            returning one: it is asked before each connection and, for a
            signed token, before its ``exp`` to ``refresh`` the open socket.
        prefetch: most unacked leases at once (1..1000).
        visibility_timeout: lease length in seconds (None: the queue's).
        reconnect: reopen the socket after it drops. Without it, a drop ends
            iteration with :class:`~leasecast.errors.ConnectionClosed`.
        backoff_initial: first reconnect delay ceiling, doubling after each failure.
        backoff_max: largest reconnect delay ceiling.
        batch: the fast path (default): batched deliveries and coalesced acks.
            False sends and asks for v1 frames only.
        on_cancel: called with a :class:`Delivery` the gateway cancelled while
            this worker held it, right after its ``cancelled`` event is set (a
            coroutine function is run as a task). Its errors are logged.
    """

    def __init__(
        self,
        url: str,
        queue: str,
        *,
        token: TokenLike,
        prefetch: int = 10,
        visibility_timeout: float | None = None,
        # -- reconnecting
        reconnect: bool = True,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        batch: bool = True,
        on_cancel: Callable[[Delivery], Awaitable[None] | None] | None = None,
    ) -> None:
        # Up to prefetch per frame: never more than the worker may hold anyway.
        # A bad prefetch is sent as given, for the gateway to refuse.
        size = min(prefetch, MAX_BATCH) if isinstance(prefetch, int) else 1
        self.url = ws_url(
            url,
            name_path("/ws/queues/", queue),
            {
                "prefetch": prefetch,
                "visibility_timeout": visibility_timeout,
                "batch": size if batch and size > 1 else None,
            },
        )
        self.queue = queue
        self._token = TokenSource(token)
        self._acks: Coalescer[Link, str, None] | None = (
            Coalescer(self._flush_acks) if batch else None
        )
        # Whether the gateway knows ack_many; False after an unknown_op.
        self._ack_many = True
        self._reconnect = reconnect
        self._backoff = (backoff_initial, backoff_max)
        self._link: Link | None = None
        # One connection attempt at a time: the iterator and enqueue() may both
        # find the socket dropped, and must share the one new socket.
        self._connecting = asyncio.Lock()
        # Set by close(); also cuts a reconnect's backoff sleep short.
        self._closed = asyncio.Event()
        # The backoff schedule in use; kept across reconnects while the gateway
        # keeps dropping us quickly, so a flapping gateway sees growing delays.
        self._delays: Iterator[float] | None = None
        #: how many times the socket was reopened after a drop
        self.reconnects = 0
        self._on_cancel = on_cancel
        # The deliveries handed out and not yet dropped by their owner, by
        # receipt: a cancel frame finds its delivery here.
        self._held: weakref.WeakValueDictionary[str, Delivery] = weakref.WeakValueDictionary()
        # Cancelled receipts whose delivery frame was still queued, unread.
        self._early_cancels: dict[str, None] = {}
        # on_cancel tasks, kept until they end (the loop keeps only weak references).
        self._callbacks: set[asyncio.Task[None]] = set()
        #: how many cancel frames arrived (for deliveries held or still unread)
        self.cancels = 0

    async def __aenter__(self) -> Worker:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        """True while the socket is open."""
        return self._link is not None and self._link.is_open

    async def connect(self) -> None:
        """Open the socket now, without retrying (``async with`` calls it).

        Raises:
            Unauthorized: the gateway refused the token.
            ConnectionClosed: the gateway is unreachable, or the worker is closed.
        """
        if self._closed.is_set():
            raise ConnectionClosed("the worker is closed")
        async with self._connecting:
            if self._link is None or not self._link.is_open:
                self._link = self._watch(await Link.open(self.url, self._token))

    async def close(self) -> None:
        """Close the socket; the gateway releases its unacked leases at once.

        Acks already asked for are sent and answered first.
        """
        self._closed.set()
        if self._acks is not None:
            await self._acks.drain()  # acks already made are sent first
        if self._link is not None:
            await self._link.close()

    async def _flush_acks(self, link: Link, batch: list[Pending[str, None]]) -> None:
        """Send the acks of one loop iteration: one ``ack_many``, or one ``ack`` if alone."""
        if not link.is_open:
            # Closed since the acks were asked: the gateway released the leases.
            for pending in batch:
                pending.fail(StaleReceipt(f"the socket that leased {pending.item} closed"))
            return
        if len(batch) > 1 and self._ack_many:
            receipts = [p.item for p in batch]
            try:
                reply = await link.request({"op": "ack_many", "receipts": receipts})
                acked, not_acked = split_acked_many(receipts, reply)
            except UnknownOp:
                self._ack_many = False  # a gateway without the extension: v1 acks
            except (ProtocolError, ValueError) as exc:
                # The frame as a whole was refused (nothing applied) or the
                # reply does not add up: each ack is asked on its own below.
                log.info("ack_many failed (%s); acking one by one", exc)
            else:
                done = set(acked)
                for pending in batch:
                    if pending.item in done:
                        pending.settle(None)
                # Not acked: stale, or left by an unavailable store; the one-by-one
                # ack below gets each caller its own answer (a stale receipt stays
                # stale: asking again changes nothing).
                batch = [p for p in batch if p.item in set(not_acked)]
        await asyncio.gather(*(self._ack_one(link, pending) for pending in batch))

    @staticmethod
    async def _ack_one(link: Link, pending: Pending[str, None]) -> None:
        try:
            await link.request({"op": "ack", "receipt": pending.item})
        except LeasecastError as exc:
            pending.fail(exc)
        else:
            pending.settle(None)

    async def _live_link(self) -> Link:
        """The open socket: opened on first use, reopened with backoff after a drop.

        Raises:
            ConnectionClosed: closed, or dropped with ``reconnect=False``.
            ProtocolError: the socket was closed with (or reopening met) a final refusal.
        """
        async with self._connecting:
            if self._closed.is_set():
                raise ConnectionClosed("the worker is closed")
            link = self._link
            if link is not None and link.is_open:
                return link
            if link is None:  # never connected: the first attempt has no delay
                self._link = self._watch(await Link.open(self.url, self._token))
                return self._link
            assert link.closed_with is not None
            if not isinstance(link.closed_with, ConnectionClosed) or not self._reconnect:
                raise link.closed_with  # a final refusal, or the caller wants no retry
            if self._delays is None or self._was_healthy(link):
                self._delays = backoff_delays(*self._backoff)
            new = await reopen(
                self.url, self._token, *self._backoff, delays=self._delays, stop=self._closed
            )
            if self._closed.is_set():  # close() ran while the handshake was under way
                await new.close()
                raise ConnectionClosed("the worker is closed")
            self._link = self._watch(new)
            self.reconnects += 1
            return new

    def _watch(self, link: Link) -> Link:
        """Have ``cancel`` frames handled as they arrive on ``link``."""
        link.on_push = self._pushed
        return link

    def _pushed(self, frame: dict[str, Any]) -> bool:
        """A frame the gateway pushed: consume ``cancel`` frames, queue the rest."""
        if frame.get("op") != "cancel":
            return False
        receipt = frame.get("receipt")
        if not isinstance(receipt, str):
            return True
        self.cancels += 1
        delivery = self._held.pop(receipt, None)
        if delivery is None:
            # Its delivery frame is still queued (or the owner dropped it):
            # remember the receipt so it is never handed out.
            self._early_cancels[receipt] = None
            while len(self._early_cancels) > MAX_EARLY_CANCELS:
                del self._early_cancels[next(iter(self._early_cancels))]
            return True
        self._cancel(delivery)
        return True

    def _cancel(self, delivery: Delivery) -> None:
        delivery.cancelled.set()
        if self._on_cancel is None:
            return
        try:
            outcome = self._on_cancel(delivery)
        except Exception:
            log.exception("on_cancel failed for message %s", delivery.id)
            return
        if inspect.isawaitable(outcome):
            task = asyncio.ensure_future(self._run_callback(outcome, delivery))
            self._callbacks.add(task)
            task.add_done_callback(self._callbacks.discard)

    @staticmethod
    async def _run_callback(outcome: Awaitable[None], delivery: Delivery) -> None:
        try:
            await outcome
        except Exception:
            log.exception("on_cancel failed for message %s", delivery.id)

    def _was_healthy(self, link: Link) -> bool:
        # A socket that stayed up longer than the longest backoff was fine:
        # the next outage starts its backoff afresh.
        closed_at = link.closed_at if link.closed_at is not None else link.opened_at
        return closed_at - link.opened_at >= self._backoff[1]

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self._deliveries()

    async def _deliveries(self) -> AsyncIterator[Delivery]:
        while not self._closed.is_set():
            try:
                link = await self._live_link()
            except ConnectionClosed:
                if self._closed.is_set():
                    return
                raise
            try:
                frame = await link.next()
            except ConnectionClosed:
                continue  # _live_link() decides: reopen, raise, or stop
            if not link.is_open:
                # Pushed before the drop but read after it: the gateway has
                # already released that lease, so it will come again.
                continue
            op = frame.get("op")
            if op == "deliver":
                items = [frame]
            elif op == "deliveries":  # the batch extension (query parameter ``batch``)
                items = [{"queue": frame["queue"], **item} for item in frame["items"]]
            else:
                continue
            for item in items:
                if item["receipt"] in self._early_cancels:
                    # Cancelled before it was read: dead-lettered, not ours.
                    del self._early_cancels[item["receipt"]]
                    continue
                yield self._delivery(link, item)

    def _delivery(self, link: Link, frame: dict[str, Any]) -> Delivery:
        delivery = Delivery(
            queue=frame["queue"],
            id=frame["id"],
            receipt=frame["receipt"],
            body=frame["body"],
            deliveries=int(frame["deliveries"]),
            expires_in=float(frame["expires_in"]),
            # Protocol 1.1: present when the message has a group or a priority.
            group=frame.get("group"),
            priority=int(frame.get("priority") or 0),
            _link=link,
            _acks=self._acks,
        )
        self._held[delivery.receipt] = delivery
        return delivery

    async def enqueue(
        self,
        body: Any,
        *,
        queue: str | None = None,
        key: str | None = None,
        delay: float = 0,
        group: str | None = None,
        priority: int = 0,
        ttl: float | None = None,
    ) -> EnqueueResult:
        """Enqueue a message on this worker's socket (reopening it if it dropped).

        ``group``, ``priority`` and ``ttl`` are sent only when set (see
        :meth:`Producer.enqueue <leasecast.producer.Producer.enqueue>`).

        Args:
            body: the message body, any JSON value.
            queue: the target queue (default: this worker's).
            key: idempotency key; a repeat within the queue's dedup window is a
                no-op that returns the first message's id with ``duplicate`` true.
            delay: seconds before the message is visible.
            group: messages of one group are delivered one at a time, in enqueue order.
            priority: -100..100; among visible messages a higher one goes first.
            ttl: seconds; a message not acked within ``ttl`` of its enqueue is
                dead-lettered with reason ``expired``.

        Returns:
            The message's id (and whether it was a duplicate) once it is stored.

        Raises:
            ProtocolError: refused (``forbidden``, ``invalid``, ``too_large``, ...).
            Backpressure: the queue is bounded (``max_length``) and full; nothing
                was applied.
            ConnectionClosed: the socket dropped before the reply (retry with a key),
                or the worker is closed.
        """
        frame: dict[str, Any] = {"op": "enqueue", "body": body, "delay": delay}
        if queue is not None:
            frame["queue"] = queue
        frame.update(enqueue_fields(key=key, group=group, priority=priority, ttl=ttl))
        reply = await (await self._live_link()).request(frame)
        return EnqueueResult.from_wire(reply)
