"""Coalescing: requests made in the same event-loop iteration go in one frame.

The gateway's cost is per frame (design decision 8), so the client's fast
path puts concurrent acks in one ``ack_many`` and concurrent enqueues to one
queue in one ``enqueue_many``. Nothing waits for company: the first request
of an iteration starts a flush task, which runs at the start of the next
iteration and takes whatever the current one added; a lone request goes out
one iteration later than it would alone, as its own frame.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["Coalescer", "Pending", "split_acked_many"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Pending(Generic[T, R]):
    """One caller's request waiting in a batch, and the future its caller awaits."""

    item: T
    future: asyncio.Future[R] = field(repr=False)

    @property
    def wanted(self) -> bool:
        """False once the caller gave up (cancelled) or the request was settled."""
        return not self.future.done()

    def settle(self, result: R) -> None:
        """Hand the caller its result (ignored if it gave up meanwhile)."""
        if not self.future.done():
            self.future.set_result(result)

    def fail(self, exc: BaseException) -> None:
        """Hand the caller its error (ignored if it gave up meanwhile)."""
        if not self.future.done():
            self.future.set_exception(exc)


class Coalescer(Generic[K, T, R]):
    """Collects requests per key and flushes each key's batch once per loop iteration.

    Args:
        flush: ``await flush(key, batch)`` sends a batch and settles every
            :class:`Pending` of it; an exception it raises fails the requests it
            left unsettled.
    """

    def __init__(self, flush: Callable[[K, list[Pending[T, R]]], Awaitable[None]]) -> None:
        self._flush = flush
        self._batches: dict[K, list[Pending[T, R]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, key: K, item: T) -> asyncio.Future[R]:
        """Add a request to ``key``'s batch; returns the future of its result."""
        loop = asyncio.get_running_loop()
        pending: Pending[T, R] = Pending(item, loop.create_future())
        batch = self._batches.get(key)
        if batch is None:
            self._batches[key] = [pending]
            # A task's first step is scheduled like loop.call_soon: it runs
            # after everything already ready in this iteration, so it takes
            # every request made meanwhile, and never waits longer.
            task = loop.create_task(self._run(key))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            batch.append(pending)
        return pending.future

    async def _run(self, key: K) -> None:
        batch = [p for p in self._batches.pop(key, []) if p.wanted]
        if not batch:
            return
        try:
            await self._flush(key, batch)
        except BaseException as exc:
            for pending in batch:
                pending.fail(exc)
            if not isinstance(exc, Exception):
                raise

    async def drain(self) -> None:
        """Wait for every flush under way (on close)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def split_acked_many(receipts: list[str], reply: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Which receipts an ``acked_many`` reply acked, and which it did not.

    Args:
        receipts: the receipts sent, in order.
        reply: ``{"op": "acked_many", "acked": n, "stale": [R, ...]}``.

    Returns:
        ``(acked, not_acked)``, each in the order sent. ``not_acked`` holds the
        receipts the reply lists as ``stale`` (stale, or left unapplied by an
        unavailable store: the gateway does not say which).

    Raises:
        ValueError: the reply's count does not match (a gateway bug; the caller
            then asks about each receipt on its own).
    """
    stale = {str(r) for r in reply.get("stale", [])}
    acked = [r for r in receipts if r not in stale]
    not_acked = [r for r in receipts if r in stale]
    if int(reply.get("acked", -1)) != len(acked):
        count = reply.get("acked")
        raise ValueError(f"acked_many says {count} acked, the receipts say {len(acked)}")
    return acked, not_acked
