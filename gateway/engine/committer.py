"""Group commit: the asyncio side of the store.

Operations submitted from the event loop are queued; one batch at a time runs
on the store's own thread (not ``database_sync_to_async``'s shared thread,
design decision 3). While a batch runs, new operations pile up and become the
next batch, so under load one commit serves many sockets and, when idle, an
operation starts at once.

A batch that enqueues may take a lease round along (:attr:`Committer.fold`):
the round runs after the enqueues in the same transaction, so an idle
worker's delivery leaves with the enqueue's commit, not one transaction and
two thread hand-offs later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gateway.core.errors import Backpressure, ProtocolError, Unavailable
from gateway.store import Enqueue, Lease, Op, Result, Store

__all__ = ["Callback", "Committer"]

log = logging.getLogger("leasecast.committer")

Callback = Callable[[Result], None]
#: What a batch added to the queues' counters, by (queue, counter, label).
Counted = dict[tuple[str, str, str], int]
#: Given a batch's ops, the ops (lease rounds) to run after them in its transaction.
Fold = Callable[[list[Op]], list[tuple[Op, Callback]]]

#: How often idempotency keys past their window are swept (seconds).
KEY_SWEEP_INTERVAL = 60.0
#: Staged messages never committed are dropped after this long (seconds).
STAGING_TTL = 24 * 3600.0
#: Longest waiting batch that starts after the previous batch's callbacks
#: (so the pumps can fold their rounds into it); a longer one starts before.
FOLD_WAIT_MAX_OPS = 64
#: Finished transactions are remembered (so a replayed commit changes nothing) this long.
TXN_MEMORY = 7 * 24 * 3600.0


def _enqueues(ops: Iterable[Op]) -> bool:
    return any(type(op) is Enqueue for op in ops)


class Committer:
    """Runs store operations in batches on a dedicated thread.

    Args:
        make_store: builds the :class:`Store`; called on the store thread, so
            the database connection belongs to that thread.
        batch_max_ops: most operations in one transaction.
        max_backlog: waiting operations past which new enqueues are refused.
        on_wake: called on the event loop with the queues a committed batch
            may have made messages visible in, before the batch's callbacks.
        on_counted: called on the event loop with what a batch added to the
            queues' counters (the runtime's metrics registry).
        result_retention: seconds a finished task result is kept.
    """

    def __init__(
        self,
        make_store: Callable[[], Store],
        *,
        batch_max_ops: int = 4000,
        max_backlog: int = 100_000,
        on_wake: Callable[[set[str]], None] | None = None,
        on_counted: Callable[[Counted], None] | None = None,
        result_retention: float = 7 * 24 * 3600.0,
    ) -> None:
        self._max_backlog = max_backlog
        self._result_retention = result_retention
        self.refused = 0
        self._make_store = make_store
        self._on_wake = on_wake
        self._on_counted = on_counted
        self._store: Store | None = None
        self._batch_max_ops = batch_max_ops
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="leasecast-store")
        self._pending: list[tuple[Op, Callback]] = []
        self._running = False
        self._dispatching = False  # running callbacks: ops they submit wait for the end
        self._last_sweep = time.monotonic()
        #: set by the engine: lease rounds to fold into a batch that enqueues
        self.fold: Fold | None = None
        # Figures for the dashboard and the benchmarks.
        self.batches = 0
        self.ops = 0

    @property
    def backlog(self) -> int:
        """Operations waiting for the next batch."""
        return len(self._pending)

    def submit(self, op: Op, callback: Callback) -> None:
        """Queue ``op``; ``callback`` gets its result on the event loop after the commit.

        The result is the op's value, or a :class:`ProtocolError` if it was
        refused or the storage failed (then nothing of it was applied). New
        enqueues are refused with ``backpressure`` while more than
        ``max_backlog`` operations wait: the store is behind, and memory must
        stay bounded. Acks and the rest are always taken, since they drain it.
        """
        if isinstance(op, Enqueue) and len(self._pending) >= self._max_backlog:
            self.refused += 1
            refusal = Backpressure(
                f"the store is {len(self._pending)} operations behind; retry shortly"
            )
            asyncio.get_running_loop().call_soon(callback, refusal)
            return
        self._pending.append((op, callback))
        if not self._running and not self._dispatching:
            self._start_batch()

    async def call(self, op: Op) -> Any:
        """Submit ``op`` and wait for its result.

        Raises:
            ProtocolError: the op was refused, or ``unavailable``.
        """
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()

        def resolve(result: Result) -> None:
            if not future.done():
                future.set_result(result)

        self.submit(op, resolve)
        result = await future
        if isinstance(result, ProtocolError):
            raise result
        return result

    def close(self) -> None:
        """Stop the thread after the running batch (pending ops are not run)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _start_batch(self) -> None:
        batch = self._pending[: self._batch_max_ops]
        del self._pending[: self._batch_max_ops]
        ops = [op for op, _ in batch]
        if self.fold is not None and _enqueues(ops):
            # The pumps of the queues enqueued to may run their next round in
            # this transaction, after the enqueues (beyond batch_max_ops: a
            # few ops at most, one per queue).
            folded = self.fold(ops)
            if folded:
                batch += folded
                ops += [op for op, _ in folded]
        order: list[int] | None = None
        if len(ops) > 1 and any(type(op) is Lease for op in ops[:-1]):
            # Lease rounds run last in their transaction, so they see what the
            # batch's other ops made visible; the results keep the batch's
            # order (so do the callbacks, and the frames they push).
            order = sorted(range(len(ops)), key=lambda i: type(ops[i]) is Lease)
            ops = [ops[i] for i in order]
        self._running = True
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._run, ops, order)
        future.add_done_callback(lambda f: self._finish(batch, f))

    def _waits_for_callbacks(self) -> bool:
        """Whether the next batch should start after this one's callbacks.

        Yes for a short one that enqueues (moderate load, where latency is
        the point): a pump whose round landed in this batch is busy until its
        callback runs, and could not fold its next round into the enqueues'
        transaction (their deliveries would wait for another transaction).
        Under a backlog the store thread keeps working instead.
        """
        return (
            self.fold is not None
            and len(self._pending) <= FOLD_WAIT_MAX_OPS
            and _enqueues(op for op, _ in self._pending)
        )

    def _run(
        self, ops: list[Op], order: list[int] | None = None
    ) -> tuple[list[Result], set[str], Counted]:
        # On the store thread.
        if self._store is None:
            try:
                self._store = self._make_store()
            except Exception as exc:
                log.warning("cannot open the store: %s", exc)
                failed = Unavailable(f"storage unavailable: {type(exc).__name__}")
                return [failed] * len(ops), set(), {}
        results = self._store.run(ops)
        if order is not None:
            ran = results
            results = [None] * len(ran)
            for i, result in zip(order, ran, strict=True):
                results[i] = result
        # A queue whose lease round ran after its last wake in this batch
        # needs no wake-up: the round's own result tells its pump the rest.
        woken, counted = self._store.woken - self._store.caught_up, self._store.counted
        if time.monotonic() - self._last_sweep > KEY_SWEEP_INTERVAL:
            self._last_sweep = time.monotonic()
            try:
                self._store.forget_expired_keys()
                self._store.forget_stale_staging(STAGING_TTL, TXN_MEMORY)
                self._store.forget_old_results(self._result_retention)
            except Exception as exc:  # housekeeping must never fail the hot path
                log.warning("housekeeping failed: %s", exc)
        return results, woken, counted

    def _finish(
        self,
        batch: list[tuple[Op, Callback]],
        future: asyncio.Future[tuple[list[Result], set[str], Counted]],
    ) -> None:
        self._running = False
        self.batches += 1
        self.ops += len(batch)
        woken: set[str] = set()
        counted: Counted = {}
        try:
            results, woken, counted = future.result()
        except BaseException as exc:  # the thread pool itself failed
            log.exception("store batch crashed")
            results = [Unavailable(f"storage failed: {type(exc).__name__}")] * len(batch)
        if self._pending and not self._waits_for_callbacks():
            # Start the next batch before running callbacks: the store thread
            # works while the loop turns results into frames.
            self._start_batch()
        self._dispatching = True
        try:
            if counted and self._on_counted is not None:
                self._on_counted(counted)
            if woken and self._on_wake is not None:
                self._on_wake(woken)
            for (_, callback), result in zip(batch, results, strict=True):
                try:
                    callback(result)
                except Exception:
                    log.exception("store callback failed")
        finally:
            self._dispatching = False
        if self._pending and not self._running:
            self._start_batch()
