"""The schedules' loop of one gateway process (protocol 1.2: Schedules).

Every gateway process runs one :class:`Scheduler`; none leads. Each turn
reads the enabled schedules, works out which have a tick due
(``gateway.core.schedule_ticks.due_tick``: the oldest tick later than the
schedule's ``last_tick`` that passed while this process ran, or, for the time
before it ran, only the most recent) and fires those in one transaction
(``gateway.store.schedules.fire``), whose compare-and-set lets exactly one
process enqueue each tick. Then it sleeps until the next tick of any
schedule, at most :data:`REFRESH` seconds, so a schedule created or changed
on another process (or in the admin) is seen within that.

The scheduler has its own store connection and thread: a turn never waits
behind the work queue's batches, nor they behind it. The HTTP API's
schedule calls run on the same thread (:meth:`Scheduler.call`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client.core import CounterMetricFamily, Metric

from gateway.core.errors import ProtocolError
from gateway.core.schedule_ticks import TickRule, due_tick
from gateway.core.schedules import ScheduleRow
from gateway.store.dialects import SQLITE
from gateway.store.schedules import FireOutcome, all_schedules, fire_many

if TYPE_CHECKING:
    from gateway.store import Store
    from gateway.store.txn import Txn

__all__ = ["REFRESH", "Scheduler", "schedule_fired_family"]

log = logging.getLogger("leasecast.schedules")

T = TypeVar("T")

#: Longest sleep between two turns: how soon a schedule changed elsewhere is
#: seen. Ticks themselves wake the loop on time (protocol: within 2 s).
REFRESH = 1.0
#: A turn that failed (the database away) is tried again after this.
RETRY = 1.0
#: A tick into a full ``block`` queue is tried again after this.
_RETRY_FULL = 0.25
#: Woken this much after a tick, so the clock reads at or past it.
_LATE = 0.002

#: What a committed store call did, handed back to the loop.
Counted = dict[tuple[str, str, str], int]


@dataclass(slots=True)
class _Watch:
    """What the loop knows of one schedule between turns: its rule, and the
    first tick after the last time it was checked (nothing is due before)."""

    rule: TickRule
    since: float
    last_tick: float | None
    next_tick: float | None


@dataclass(slots=True)
class TurnResult:
    """One turn's outcome: fired ticks by schedule, and when to look again."""

    outcomes: dict[str, FireOutcome] = field(default_factory=dict)
    next_at: float | None = None


class Scheduler:
    """Fires the ticks of every enabled schedule, as one of any number of peers.

    Args:
        make_store: opens a store (a database connection of its own); called
            on the scheduler's thread.
        on_wake: called on the loop with the queues a committed call enqueued to
            (this process's pumps; other processes hear of them from the store).
        on_counted: called on the loop with what a call added to queue counters.
        block_wait: seconds a tick into a full ``block`` queue is retried
            before it is refused (``GATEWAY_BLOCK_WAIT``).
        clock: the current Unix time.
        start: run the loop (tests of :meth:`turn` alone pass false).
    """

    def __init__(
        self,
        make_store: Callable[[], Store],
        *,
        on_wake: Callable[[set[str]], None] | None = None,
        on_counted: Callable[[Counted], None] | None = None,
        block_wait: float = 10.0,
        clock: Callable[[], float] = time.time,
        start: bool = True,
    ) -> None:
        self._make_store = make_store
        self._store: Store | None = None
        self._on_wake = on_wake
        self._on_counted = on_counted
        self.block_wait = block_wait
        self._clock = clock
        #: Ticks from here on passed while this process ran: each is fired,
        #: even if the loop was late for it (only earlier ones are catch-up).
        self.running_since = clock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="leasecast-schedules")
        self._watches: dict[int, _Watch] = {}
        self._poke = asyncio.Event()
        self._closed = False
        #: ticks this process fired (enqueued), refused and found fired by another
        self.fired = 0
        self.refused = 0
        self.taken = 0
        self._task: asyncio.Task[None] | None = None
        if start:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    # -- the loop

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            # Cleared before the turn: a schedule changed during it is looked at again.
            self._poke.clear()
            delay = RETRY
            try:
                result, woken, counted = await loop.run_in_executor(self._executor, self._turn)
                self._after_commit(woken, counted)
                if result.next_at is not None:
                    delay = result.next_at - self._clock() + _LATE
                delay = max(0.0, min(delay, REFRESH))
            except Exception as exc:  # the database away: the next turn tries again
                log.warning("schedules: turn failed (%s: %s)", type(exc).__name__, exc)
                self._drop_store()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), delay)

    def poke(self) -> None:
        """Look at the schedules now (one was changed on this process)."""
        self._poke.set()

    def close(self) -> None:
        """Stop the loop and the thread (a turn running finishes on its own)."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        self._executor.submit(self._drop_store)
        self._executor.shutdown(wait=False, cancel_futures=False)

    async def aclose(self, wait: float = 10.0) -> None:
        """:meth:`close`, then wait (at most ``wait`` seconds) for the thread to
        finish its turn and close its connection. A runtime closed before its
        database goes (tests, a process shutting down) must not leave the
        thread running a statement on a connection torn down under it: on an
        in-memory SQLite database that crashed the process."""
        self.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(self._executor.shutdown, wait=True), wait)

    # -- on the scheduler's thread

    def _open(self) -> Store:
        if self._store is None:
            self._store = self._make_store()
        return self._store

    def _drop_store(self) -> None:
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.close()
            self._store = None

    def _in_transaction(self, work: Callable[[Txn], T]) -> tuple[T, set[str], Counted]:
        store = self._open()
        store.woken, store.counted = set(), {}
        try:
            with store.transaction() as txn:
                value = work(txn)
        except ProtocolError:
            raise  # a refusal: rolled back, the connection is fine
        except Exception:
            self._drop_store()  # a fresh connection for the next call
            raise
        return value, store.woken, store.counted

    def _turn(self) -> tuple[TurnResult, set[str], Counted]:
        return self._in_transaction(self.turn)

    def turn(self, txn: Txn) -> TurnResult:
        """One turn in ``txn``: fire every due tick; returns when the next is due."""
        now = txn.now
        result = TurnResult()
        rows = all_schedules(txn, enabled_only=True)
        seen: set[int] = set()
        due: list[tuple[ScheduleRow, float]] = []
        for row in rows:
            seen.add(row.id)
            watch = self._watches.get(row.id)
            rule = row.spec.rule
            if (
                watch is not None
                and watch.rule == rule
                and watch.since == row.active_since
                and watch.last_tick == row.last_tick
                and watch.next_tick is not None
                and now < watch.next_tick
            ):
                # Nothing changed, and its next tick has not come: not due.
                result.next_at = _earliest(result.next_at, watch.next_tick)
                continue
            tick = due_tick(
                rule,
                now,
                last_tick=row.last_tick,
                since=row.active_since,
                running_since=self.running_since,
            )
            next_tick = rule.next_after(now)
            if tick is not None:
                due.append((row, tick))
                latest = rule.latest_at(now)
                if latest is not None and tick < latest:
                    next_tick = now  # behind: the next missed tick is due at once
            self._watches[row.id] = _Watch(rule, row.active_since, row.last_tick, next_tick)
            result.next_at = _earliest(result.next_at, next_tick)
        for gone in self._watches.keys() - seen:
            del self._watches[gone]
        if not due:
            return result
        result.outcomes = fire_many(txn, due, block_wait=self.block_wait)
        for row, tick in due:
            outcome = result.outcomes.get(row.name)
            watch = self._watches[row.id]
            if outcome == "fired":
                self.fired += 1
            elif outcome == "refused":
                self.refused += 1
            elif outcome == "taken":
                self.taken += 1
            if outcome in ("waiting", "failed"):
                # Not fired: a full block queue is tried again soon, a failure
                # after a while (it was logged).
                watch.next_tick = now + (_RETRY_FULL if outcome == "waiting" else RETRY)
                result.next_at = _earliest(result.next_at, watch.next_tick)
            else:
                watch.last_tick = tick
        return result

    # -- the HTTP API's calls

    async def call(self, work: Callable[[Txn], T]) -> T:
        """Run ``work`` in one transaction on the scheduler's thread; wake the
        loop after, so a changed schedule is looked at at once."""
        loop = asyncio.get_running_loop()
        value, woken, counted = await loop.run_in_executor(
            self._executor, self._in_transaction, work
        )
        self._after_commit(woken, counted)
        self.poke()
        return value

    def _after_commit(self, woken: set[str], counted: Counted) -> None:
        if counted and self._on_counted is not None:
            self._on_counted(counted)
        if woken:
            if self._on_wake is not None:
                self._on_wake(woken)
            store = self._store
            if store is not None and store.dialect is SQLITE:
                # Other processes on this SQLite file hear of it as datagrams
                # (on PostgreSQL, the store's NOTIFY told them at the commit).
                from gateway.engine.notify import announce_local

                with contextlib.suppress(OSError):
                    announce_local(woken)


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def schedule_fired_family(cursor: Any) -> Metric:
    """``leasecast_schedule_fired_total{schedule}``: messages each schedule enqueued.

    Read from the rows (``fired``), so it is the deployment's count whichever
    process fired, and survives restarts; ``cursor`` is any DB-API cursor.
    """
    family = CounterMetricFamily(
        "leasecast_schedule_fired",
        "Messages a schedule enqueued, one per tick (a duplicate tick is not counted).",
        labels=["schedule"],
    )
    cursor.execute("SELECT name, fired FROM leasecast_schedule ORDER BY name")
    for name, fired in cursor.fetchall():
        family.add_metric([name], int(fired))
    return family
