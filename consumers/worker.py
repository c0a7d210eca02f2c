"""The worker socket ``/ws/queues/QUEUE/`` (protocol: Worker socket).

The socket holds at most ``prefetch`` unacked leases; the queue's pump pushes
deliveries while it has room. Its leases end with ack, nack, reject, their
timeout, or the socket closing, which releases them at once (design decision 5).
A lease also ends when its message is cancelled (protocol 1.2: Cancel): the
socket is told with a ``cancel`` frame, and its place under ``prefetch`` is free.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any, assert_never

from consumers.base import GatewaySocket, int_param
from gateway.core.errors import Invalid, ProtocolError, StaleReceipt
from gateway.core.leases import MAX_TIMEOUT, WorkerLeases
from gateway.core.protocol import (
    AckFrame,
    AckManyFrame,
    ClientFrame,
    CreditFrame,
    DisconnectFrame,
    EnqueueFrame,
    EnqueueManyFrame,
    ExtendFrame,
    NackFrame,
    PublishFrame,
    RejectFrame,
    check_name,
)
from gateway.core.wire import (
    ACKED,
    Ref,
    encode_acked,
    encode_acked_many,
    encode_cancel,
    encode_deliver,
    encode_deliveries,
    encode_extended,
    encode_nacked,
    encode_rejected,
)
from gateway.engine.pump import QueuePump
from gateway.store import Ack, AckResult, Delivered, Extend, Nack, Reject, Release, Result

__all__ = ["WorkerSocket"]

MAX_PREFETCH = 1000

#: Seconds a socket gets no new lease after one of its leases ran out while
#: its client had said nothing for as long (or until the client is heard
#: from): a client cut off from this process keeps a live socket here until
#: the pings give it up, and without the pause its freed room would take the
#: expired message straight back, ahead of the workers of other processes
#: (docs/reliability.md, "Partitions between hosts").
QUIET_HOLD = 1.0


class WorkerSocket(GatewaySocket):
    """A worker: receives ``deliver`` frames and ends its leases."""

    kind = "worker"
    ops = frozenset(
        {"ack", "ack_many", "nack", "reject", "extend", "enqueue", "enqueue_many", "publish"}
    )

    queue: str
    leases: WorkerLeases
    pump: QueuePump

    async def open(self, params: dict[str, str]) -> None:
        self.queue = check_name(self.scope["url_route"]["kwargs"]["queue"], "queue")
        prefetch = int_param(params, "prefetch", 10, 1, MAX_PREFETCH)
        # Extension: batch=N lets the gateway coalesce up to N deliveries into
        # one ``deliveries`` frame (design decision 8); 1 keeps v1 frames.
        self.batch = int_param(params, "batch", 1, 1, MAX_PREFETCH)
        timeout: float | None = None
        if "visibility_timeout" in params:
            try:
                timeout = float(params["visibility_timeout"])
            except ValueError:
                raise Invalid("visibility_timeout must be a number of seconds") from None
            if not 0 < timeout <= MAX_TIMEOUT:
                raise Invalid(f"visibility_timeout must be > 0 and <= {MAX_TIMEOUT:.0f}")
        self.require("consume", self.queue)
        self._timeout = timeout
        self.leases = WorkerLeases(prefetch, time.time)
        self._expiry_timer: asyncio.TimerHandle | None = None
        #: when the client's last frame arrived (time.monotonic())
        self._heard_at = time.monotonic()
        self._quiet_hold: asyncio.TimerHandle | None = None
        self.acked = self.nacked = self.rejected = self.redelivered = 0

    def opened(self) -> None:
        self.pump = self.engine.attach(self.queue, self)

    def closed(self) -> None:
        self.engine.detach(self.queue, self)
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
        if self._quiet_hold is not None:
            self._quiet_hold.cancel()
        held = self.leases.receipts()
        if held:
            # Released at once, not after their timeout (protocol: Work queue).
            self.engine.submit(Release(self.queue, held), _ignore)

    # -- the pump's side (gateway.engine.pump.WorkerSink)

    @property
    def demand(self) -> int:
        return self.leases.demand if self._open and self._quiet_hold is None else 0

    @property
    def visibility_timeout(self) -> float | None:
        return self._timeout

    def deliver(self, items: list[Delivered]) -> None:
        cancels = self.engine.cancels
        if len(cancels):
            # Cancelled between the lease round's commit and now: not ours (the
            # pump pokes after handing out, so the room is filled again).
            items = [item for item in items if not cancels.claim(self.queue, item.receipt)]
        now = time.time()
        for item in items:
            self.leases.add(item.receipt, item.expires_at)
            if item.deliveries > 1:
                self.redelivered += 1
        if self.batch == 1:
            for item in items:
                expires_in = max(0.0, item.expires_at - now)
                self.push(
                    encode_deliver(
                        self.queue,
                        item.id,
                        item.receipt,
                        item.body,
                        item.deliveries,
                        expires_in,
                        item.group,
                        item.priority,
                    )
                )
        else:
            for start in range(0, len(items), self.batch):
                chunk = items[start : start + self.batch]
                self.push(
                    encode_deliveries(
                        self.queue,
                        [
                            (
                                d.id,
                                d.receipt,
                                d.body,
                                d.deliveries,
                                max(0.0, d.expires_at - now),
                                d.group,
                                d.priority,
                            )
                            for d in chunk
                        ],
                    )
                )
        self._arm_expiry()

    def lease_cancelled(self, msg_id: str, receipt: str) -> bool:
        """The message of lease ``receipt`` was cancelled (gateway.engine.cancels):
        if this socket holds it, forget it, tell the client and take more work."""
        if not self._open or not self.leases.end(receipt):
            return False
        self.push(encode_cancel(self.queue, msg_id, receipt))
        self.pump.poke()
        return True

    def _arm_expiry(self) -> None:
        due = self.leases.next_expiry()
        if due is None or self._expiry_timer is not None:
            return
        loop = asyncio.get_running_loop()
        self._expiry_timer = loop.call_later(max(0.0, due - time.time()), self._expire)

    def _expire(self) -> None:
        self._expiry_timer = None
        if self.leases.expire():
            # Expired leases free prefetch room; the messages themselves come
            # due in the store at the same moment and the pump's timer finds them.
            if self._quiet():
                # A lease ran out and the client has been silent: maybe this
                # process is cut off from its clients. Then so is every other
                # socket of the queue here whose client has gone quiet (one
                # that acked all it had holds no lease to run out, but has
                # room): all of them stay shut a moment, so that a worker
                # elsewhere takes the message rather than a dead socket here.
                for sink in self.pump.sinks:
                    if isinstance(sink, WorkerSocket):
                        sink.hold_if_quiet()
            self.pump.poke()
        self._arm_expiry()

    def _quiet(self) -> bool:
        """Whether the client has sent nothing for :data:`QUIET_HOLD` seconds."""
        return time.monotonic() - self._heard_at >= QUIET_HOLD

    def hold_if_quiet(self) -> None:
        """Take no new lease for :data:`QUIET_HOLD` seconds, or until the client
        sends a frame, if it has been silent that long (a lease of the queue ran
        out on a silent socket of this process)."""
        if self._open and self._quiet_hold is None and self._quiet():
            loop = asyncio.get_running_loop()
            self._quiet_hold = loop.call_later(QUIET_HOLD, self._end_quiet_hold)

    def _end_quiet_hold(self) -> None:
        if self._quiet_hold is not None:
            self._quiet_hold.cancel()
            self._quiet_hold = None
        if self._open:
            self.pump.poke()

    # -- frames

    def receive_text(self, text_data: str) -> None:
        # Any frame shows the client is there: it may take work again at once.
        self._heard_at = time.monotonic()
        if self._quiet_hold is not None:
            self._end_quiet_hold()
        super().receive_text(text_data)

    def handle(self, frame: ClientFrame) -> None:
        match frame:
            case EnqueueFrame() | EnqueueManyFrame():
                self.enqueue(frame, default_queue=self.queue)
            case AckFrame():
                self._ack(frame)
            case AckManyFrame():
                self._ack_many(frame)
            case NackFrame():
                nack = Nack(self.queue, frame.receipt, frame.delay, frame.task)
                self._end(frame, nack, encode_nacked)
            case RejectFrame():
                self._end(frame, Reject(frame.receipt), encode_rejected)
            case ExtendFrame():
                self._extend(frame)
            case PublishFrame():
                self.publish(frame)
            case CreditFrame() | DisconnectFrame():
                raise AssertionError("not in this socket's ops")
            case _:
                assert_never(frame)

    def _check_held(self, receipt: str) -> None:
        if not self.leases.holds(receipt):
            raise StaleReceipt("the receipt is not a current lease of this socket")

    def _settle(self, receipt: str, result: Result, *, poke: bool = True) -> bool:
        """Forget a lease the store no longer holds for us: ended now (True) or stale.

        A refusal such as ``unavailable`` changed nothing, so the lease stays.
        """
        ended = not isinstance(result, ProtocolError)
        if ended or isinstance(result, StaleReceipt):
            self.leases.end(receipt)
            if poke:
                self.pump.poke()
        return ended

    def _ack(self, frame: AckFrame) -> None:
        self._check_held(frame.receipt)
        follow_ups = []
        for queue, spec in frame.follow_ups:
            target = queue or self.queue
            self.require("enqueue", target)
            follow_ups.append((target, spec))
        receipt, ref = frame.receipt, frame.ref

        def landed(result: Result) -> None:
            if self._settle(receipt, result):
                self.acked += 1
                if not follow_ups:
                    self.push(ACKED if ref is None else encode_acked(ref))
                    return
            self.reply(result, ref, _acked_with_follow_ups)

        self.engine.submit(Ack(frame.receipt, tuple(follow_ups), frame.task), landed)

    def _ack_many(self, frame: AckManyFrame) -> None:
        """Extension: ack many receipts in one frame; the reply lists those not acked."""
        held = [r for r in dict.fromkeys(frame.receipts) if self.leases.holds(r)]
        not_acked = [r for r in frame.receipts if r not in held]
        ref = frame.ref
        pending = len(held)

        def landed(receipt: str, result: Result) -> None:
            nonlocal pending
            pending -= 1
            if self._settle(receipt, result, poke=False):
                self.acked += 1
            else:
                not_acked.append(receipt)
            if pending == 0:
                # One poke for the whole frame, so the freed room is refilled
                # by one lease round rather than one per receipt.
                self.pump.poke()
                acked = len(held) - sum(1 for r in not_acked if r in held)
                self.push(encode_acked_many(acked, not_acked, ref))

        if not held:
            self.push(encode_acked_many(0, not_acked, ref))
            return
        for receipt in held:
            self.engine.submit(Ack(receipt), functools.partial(landed, receipt))

    def _end(
        self, frame: NackFrame | RejectFrame, op: Nack | Reject, encode_reply: Callable[[Ref], str]
    ) -> None:
        self._check_held(frame.receipt)
        ref = frame.ref

        def landed(result: Result) -> None:
            if self._settle(frame.receipt, result):
                if isinstance(op, Nack):
                    self.nacked += 1
                else:
                    self.rejected += 1
            self.reply(result, ref, lambda _, echo: encode_reply(echo))

        self.engine.submit(op, landed)

    def _extend(self, frame: ExtendFrame) -> None:
        self._check_held(frame.receipt)
        ref = frame.ref

        def landed(result: Result) -> None:
            if isinstance(result, float):  # the new expiry time
                self.leases.extend(frame.receipt, result)
                self._arm_expiry()
            else:
                self._settle(frame.receipt, result)
            self.reply(result, ref, lambda at, echo: encode_extended(at - time.time(), echo))

        self.engine.submit(Extend(frame.receipt, frame.timeout), landed)

    # -- dashboard

    def describe(self) -> dict[str, Any]:
        """This socket's live state for ``/api/stats``."""
        return {
            **self.identity(),
            "queue": self.queue,
            "prefetch": self.leases.prefetch,
            "leases": len(self.leases),
            "acked": self.acked,
            "nacked": self.nacked,
            "rejected": self.rejected,
            "redelivered": self.redelivered,
        }


def _acked_with_follow_ups(result: AckResult, ref: Ref) -> str:
    return encode_acked(ref, [r.as_json() for r in result.enqueued])


def _ignore(_: Result) -> None:
    pass
