"""The per-queue pump: pushes leased messages to the worker sockets that want them.

One :class:`QueuePump` per queue per process. It runs a lease round (one
``Lease`` op for the summed demand of its sockets) when the
:class:`~gateway.core.leases.LeaseScheduler` says a round is worth it: something
was woken (an enqueue, a release, the timer of the next due message) and a
socket has room under its ``prefetch``. It never polls an idle queue.

A queue's control settings (protocol 1.2) need no pump logic of their own:
the store's lease round applies them and says when to look again
(``LeaseResult.next_due``): when the next token accrues for a rate limit,
a second later for a queue at its ``max_in_flight`` (a lease that ends on
this process, or by ``NOTIFY`` on another, wakes the pump sooner), the
settings TTL later (at least a second) for a paused one (a resume wakes it
sooner the same ways). Apart from a token that accrues (and a 50 ms retry
when another transaction holds a limited queue's row out of lock order), a
waiting worker costs at most a round a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from gateway.core.errors import ProtocolError
from gateway.core.leases import LeaseScheduler
from gateway.store import Delivered, Lease, LeaseResult, Op, Release, Result

__all__ = ["QueuePump", "WorkerSink"]

log = logging.getLogger("leasecast.pump")

#: Most messages one lease round asks for.
MAX_ROUND = 1000
#: Shortest gap between timer-driven rounds, so a stream of due times coalesces.
MIN_TIMER_GAP = 0.01
#: How long after a due time its timer-driven round runs: when a lease held
#: by a socket here runs out at that moment, the socket's own expiry timer
#: (same deadline) goes first, so the round sees what it decided (a worker
#: socket may shut its room for a moment: consumers.worker.QUIET_HOLD).
AFTER_DUE = 0.02
#: Wait before retrying after the store failed a round.
RETRY_AFTER = 0.5


class WorkerSink(Protocol):
    """What the pump needs of a worker socket."""

    @property
    def demand(self) -> int:
        """How many more deliveries the socket asks for now (what rounds are run for)."""

    @property
    def visibility_timeout(self) -> float | None:
        """The lease length the socket asked for (None: the queue's)."""

    def deliver(self, items: list[Delivered]) -> None:
        """Take ownership of ``items`` (never more than ``demand``)."""


class QueuePump:
    """Feeds one queue's worker sockets.

    Args:
        queue: the queue name.
        submit: the committer's ``submit``.
        leased: told how many messages of the queue each round leased.
    """

    def __init__(
        self,
        queue: str,
        submit: Callable[[Op, Callable[[Result], None]], None],
        leased: Callable[[str, int], None] | None = None,
    ) -> None:
        self.queue = queue
        self._submit = submit
        self._leased = leased
        self._sinks: list[WorkerSink] = []
        self._scheduler = LeaseScheduler()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._rotation = 0
        # Figures for the dashboard.
        self.delivered = 0
        self.dead_lettered = 0

    @property
    def sinks(self) -> list[WorkerSink]:
        """The attached worker sockets."""
        return list(self._sinks)

    def attach(self, sink: WorkerSink) -> None:
        """Add a worker socket; it is fed from the next round."""
        self._sinks.append(sink)
        # A new socket may be the first with demand since the queue filled up.
        self._scheduler.wake()
        self.poke()

    def detach(self, sink: WorkerSink) -> None:
        """Remove a worker socket (it has closed)."""
        if sink in self._sinks:
            self._sinks.remove(sink)
        if not self._sinks:
            self._cancel_timer()

    def wake(self) -> None:
        """Something may have become visible: run a round if anyone wants work."""
        self._scheduler.wake()
        self.poke()

    def poke(self) -> None:
        """A socket's demand may have grown: run a round if one is due."""
        if self._scheduler.running or not self._sinks:
            return
        group = self._next_group()
        if not group:
            return
        timeout, sinks = group
        demand = min(MAX_ROUND, sum(s.demand for s in sinks))
        if not self._scheduler.should_run(demand):
            return
        token = self._scheduler.start()
        self._submit(
            Lease(self.queue, demand, timeout),
            lambda result: self._landed(result, token, demand, timeout),
        )

    def fold(self) -> tuple[Lease, Callable[[Result], None]] | None:
        """The round to run right after an enqueue into this queue, in its transaction.

        Returns ``(op, callback)`` for the committer to append to a batch that
        enqueues here, or None if no socket wants work or a round is already
        under way (it will look again when it lands). The round counts as
        woken by that enqueue: the store leaves the queue out of the batch's
        wake-ups when the round saw its last wake, and otherwise the wake-up
        that follows the commit runs the next round as usual.
        """
        if self._scheduler.running or not self._sinks:
            return None
        group = self._next_group()
        if not group:
            return None
        timeout, sinks = group
        demand = min(MAX_ROUND, sum(s.demand for s in sinks))
        self._scheduler.wake()
        if not self._scheduler.should_run(demand):
            return None
        token = self._scheduler.start()
        return (
            Lease(self.queue, demand, timeout),
            lambda result: self._landed(result, token, demand, timeout),
        )

    def _next_group(self) -> tuple[float | None, list[WorkerSink]] | None:
        """The sockets to feed this round: those sharing the lease length of the
        next socket (in rotation) with demand, so mixed lengths take turns."""
        n = len(self._sinks)
        for step in range(n):
            first = self._sinks[(self._rotation + step) % n]
            if first.demand > 0:
                timeout = first.visibility_timeout
                return timeout, [s for s in self._sinks if s.visibility_timeout == timeout]
        return None

    def _landed(self, result: Result, token: int, requested: int, timeout: float | None) -> None:
        if isinstance(result, ProtocolError):
            log.warning("lease round on %r failed: %s", self.queue, result.detail)
            self._scheduler.finish(token, requested, requested)  # not drained: retry
            self._arm(time.time() + RETRY_AFTER)
            return
        assert isinstance(result, LeaseResult)
        self._scheduler.finish(token, requested, len(result.delivered))
        self.delivered += len(result.delivered)
        self.dead_lettered += result.dead_lettered
        if self._leased is not None:
            self._leased(self.queue, len(result.delivered))
        leftover = self._hand_out(result.delivered, timeout)
        if leftover:
            # The sockets that asked closed, filled or paused meanwhile: hand
            # the messages straight back, undelivered, rather than wait for
            # their timeout (a paused socket's client may be cut off).
            self.delivered -= len(leftover)
            receipts = [d.receipt for d in leftover]
            self._submit(Release(self.queue, receipts, undelivered=True), self._released)
        if result.next_due is not None:
            self._arm(result.next_due)
        self.poke()

    def _hand_out(self, items: list[Delivered], timeout: float | None) -> list[Delivered]:
        """Share ``items`` one at a time across sockets with demand, in rotation."""
        sinks = [s for s in self._sinks if s.visibility_timeout == timeout]
        if not sinks:
            return items
        shares: list[list[Delivered]] = [[] for _ in sinks]
        room = [s.demand for s in sinks]
        i = self._rotation % len(sinks)
        taken = 0
        idle = 0
        while taken < len(items) and idle < len(sinks):
            if room[i] > 0:
                shares[i].append(items[taken])
                room[i] -= 1
                taken += 1
                idle = 0
            else:
                idle += 1
            i = (i + 1) % len(sinks)
        self._rotation += 1
        for sink, share in zip(sinks, shares, strict=True):
            if share:
                sink.deliver(share)
        return items[taken:]

    def _released(self, result: Result) -> None:
        if isinstance(result, ProtocolError):
            log.warning("releasing leftover leases on %r failed: %s", self.queue, result.detail)
            return
        # The committer wakes this pump: the released messages are visible.

    # -- the timer for the next due message

    def _arm(self, due: float) -> None:
        due = max(due + AFTER_DUE, time.time() + MIN_TIMER_GAP)
        if self._timer is not None and self._timer_at <= due and self._timer_at > time.time():
            return
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self._timer_at = due
        self._timer = loop.call_later(due - time.time(), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        self.wake()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = float("inf")
