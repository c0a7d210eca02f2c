"""One transaction of the store: its cursor, its clock reading, and what it touched.

Every function that applies an op takes a :class:`Txn`. Besides running SQL,
it collects what the runner must do before the commit: the groups whose head
may have left (settled once, at the end, under their locks; see
``gateway.store.groups``) and the queues in which messages may have become
visible (announced to the pumps after the commit).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gateway.core.errors import NotFound, ProtocolError
from gateway.core.leases import QueueSettings
from gateway.store.dialects import Dialect, Statement

#: The rows of ``leasecast_queue_counter`` a counter is spread over. A
#: gateway's store adds to row :data:`COUNTER_SHARD`: processes on different
#: rows do not wait for each other's commits (a scrape sums them). The store
#: commits at once, so a row is held briefly.
COUNTER_SHARDS = 16
COUNTER_SHARD = os.getpid() % COUNTER_SHARDS
#: Rows for transactions on Django's connection (``gateway.host.on_django``):
#: nested in the application's own transaction, they hold their rows until
#: the application commits, which may be much later. Each takes one of these
#: at random, so it never holds up a gateway's commits, and two application
#: transactions wait for each other only if they pick the same row.
DJANGO_SHARDS = range(COUNTER_SHARDS, COUNTER_SHARDS + 64)


def django_shard() -> int:
    """A counter row for one transaction on Django's connection (see :data:`DJANGO_SHARDS`)."""
    return random.choice(DJANGO_SHARDS)


__all__ = [
    "COUNTER_SHARD",
    "COUNTER_SHARDS",
    "DJANGO_SHARDS",
    "QueueCache",
    "QueueRow",
    "SavepointLost",
    "Txn",
    "django_shard",
]

_QUEUE_COLUMNS = (
    "id, visibility_timeout, max_deliveries, dedup_window, max_length, overflow, "
    "paused, max_in_flight, rate_limit, rate_burst"
)


@dataclass(slots=True)
class QueueRow:
    """A queue's id and settings as last read from the database."""

    id: int
    name: str
    settings: QueueSettings
    loaded_at: float
    #: when a lease round next sweeps the queue's expired messages
    #: (``gateway.store.leasing.lease``); 0: at its first round
    sweep_at: float = 0.0


class QueueCache:
    """Queue rows by name, re-read after ``ttl`` seconds (so admin edits apply).

    Args:
        defaults: settings of queues created on first use.
        ttl: seconds a row is trusted (``GATEWAY_QUEUE_SETTINGS_TTL``).
    """

    def __init__(self, defaults: QueueSettings, ttl: float) -> None:
        self.defaults = defaults
        self.ttl = ttl
        self._rows: dict[str, QueueRow] = {}
        self._names: dict[int, str] = {}
        #: queues with a max_in_flight, by id: a lease that ends there wakes
        #: the workers waiting for room (gateway.store.leasing)
        self._in_flight_limited: dict[int, str] = {}

    def clear(self) -> None:
        """Forget every row (after a failed batch, which may have rolled back a create)."""
        self._rows.clear()

    def in_flight_limited(self, queue_id: int) -> str | None:
        """The name of queue ``queue_id`` if it has a ``max_in_flight`` (as cached)."""
        return self._in_flight_limited.get(queue_id)

    def name_of(self, txn: Txn, queue_id: int) -> str:
        """The name of a queue, by id."""
        name = self._names.get(queue_id)
        if name is None:
            found = txn.exec("SELECT name FROM leasecast_queue WHERE id = %s", (queue_id,))
            name = self._names[queue_id] = found.fetchone()[0]
        return name

    def get(self, txn: Txn, name: str, *, create: bool, fresh: bool = False) -> QueueRow:
        """The row of queue ``name``, created with the defaults if ``create``.

        Args:
            fresh: read the row even if the cached one is recent.

        Raises:
            NotFound: the queue does not exist and ``create`` is false.
        """
        row = self._rows.get(name)
        if row is not None and not fresh and txn.now - row.loaded_at < self.ttl:
            return row
        select = f"SELECT {_QUEUE_COLUMNS} FROM leasecast_queue WHERE name = %s"
        found = txn.exec(select, (name,)).fetchone()
        if found is None:
            if not create:
                raise NotFound(f"queue {name!r} does not exist")
            self._insert(txn, name, self.defaults)
            found = txn.exec(select, (name,)).fetchone()
        return self._remember(txn, name, found)

    def configure(self, txn: Txn, name: str, settings: QueueSettings) -> QueueRow:
        """Store new settings for ``name`` (creating it), in force on this process at once."""
        self._insert(txn, name, settings)
        txn.exec(
            "UPDATE leasecast_queue SET visibility_timeout = %s, max_deliveries = %s, "
            "dedup_window = %s, max_length = %s, overflow = %s, paused = %s, "
            "max_in_flight = %s, rate_limit = %s, rate_burst = %s WHERE name = %s",
            (*_settings_row(settings), *_control_row(settings), name),
        )
        found = txn.exec(
            f"SELECT {_QUEUE_COLUMNS} FROM leasecast_queue WHERE name = %s", (name,)
        ).fetchone()
        # A resumed queue, or one with more room, may lease again: its workers,
        # here and (by NOTIFY) on other processes, try at once.
        txn.woken.add(name)
        return self._remember(txn, name, found)

    def _insert(self, txn: Txn, name: str, settings: QueueSettings) -> None:
        txn.exec(
            "INSERT INTO leasecast_queue (name, visibility_timeout, max_deliveries, "
            "dedup_window, max_length, overflow, created_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING",
            (name, *_settings_row(settings), txn.now),
        )

    def _remember(self, txn: Txn, name: str, found: Sequence[Any]) -> QueueRow:
        queue_id, vt, max_deliveries, dedup_window, max_length, overflow, *control = found
        paused, max_in_flight, rate_limit, rate_burst = control
        settings = QueueSettings(
            vt,
            max_deliveries,
            dedup_window,
            max_length,
            overflow,
            paused=bool(paused),  # SQLite stores 0 / 1
            max_in_flight=max_in_flight,
            rate_limit=rate_limit,
            rate_burst=rate_burst,
        )
        row = QueueRow(queue_id, name, settings, txn.now)
        known = self._rows.get(name)
        if known is not None and known.id == queue_id:
            row.sweep_at = known.sweep_at  # what the rounds learnt outlives a re-read
        self._rows[name] = row
        self._names[queue_id] = name
        self.note_control(row)
        return row

    def note_control(self, row: QueueRow) -> None:
        """Keep :meth:`in_flight_limited` in step with ``row``'s settings."""
        if row.settings.max_in_flight > 0:
            self._in_flight_limited[row.id] = row.name
        else:
            self._in_flight_limited.pop(row.id, None)


class SavepointLost(Exception):
    """Rolling back to a savepoint failed: the whole transaction is lost (the
    database ended it, or the connection is gone)."""


def _settings_row(s: QueueSettings) -> tuple[Any, ...]:
    return (s.visibility_timeout, s.max_deliveries, s.dedup_window, s.max_length, s.overflow)


def _control_row(s: QueueSettings) -> tuple[Any, ...]:
    return (s.paused, s.max_in_flight, s.rate_limit, s.rate_burst)


class Txn:
    """An open transaction.

    Args:
        cursor: a DB-API cursor inside ``BEGIN``.
        dialect: the database's SQL.
        now: the time of the whole transaction (one clock reading per batch).
        queues: the store's queue cache.
    """

    def __init__(self, cursor: Any, dialect: Dialect, now: float, queues: QueueCache) -> None:
        self.cursor = cursor
        self.dialect = dialect
        self.now = now
        self.queues = queues
        #: (queue id, group) whose head may have left: settled before the commit
        self.unsettled: set[tuple[int, str]] = set()
        #: groups that took back an earlier message (requeue, redrive): a head
        #: not yet leased steps back for it (see gateway.store.groups)
        self.reordered: set[tuple[int, str]] = set()
        #: queues in which messages may have become visible
        self.woken: set[str] = set()
        #: bounded queues: how many messages count against max_length (visible
        #: or delayed) as of this transaction, kept up to date by enqueues and
        #: overflow; any other op that moves messages in or out of those states
        #: calls :meth:`forget_length` (see gateway.store.enqueue)
        self.lengths: dict[int, int] = {}
        #: bounded queues: ids of the oldest counted messages, oldest first
        self.oldest: dict[int, list[int]] = {}
        #: queues whose expired messages this transaction has dead-lettered
        #: (its clock does not move, so once is enough)
        self.swept: set[int] = set()
        #: queues whose control row this transaction holds (gateway.store.leasing)
        self.control_locked: set[int] = set()
        #: this transaction's counter increments by (queue id, counter, label),
        #: written with one statement before the commit (:meth:`write_counts`)
        self.counts: dict[tuple[int, str, str], int] = {}
        self._savepoints = 0

    def exec(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement; returns the cursor."""
        self.cursor.execute(self.dialect.sql(sql), params)
        return self.cursor

    def queue(self, name: str, *, create: bool) -> QueueRow:
        """The queue's row (see :meth:`QueueCache.get`)."""
        return self.queues.get(self, name, create=create)

    def unsettle(self, queue_id: int, group: str | None, *, reordered: bool = False) -> None:
        """Note that ``group``'s head may have left (no-op for messages without a group).

        Args:
            reordered: a message went back into the group (WAITING) and may be
                earlier than its current head.
        """
        if group is not None:
            self.unsettled.add((queue_id, group))
            if reordered:
                self.reordered.add((queue_id, group))

    def leased(self, queue_id: int, ids: list[int]) -> None:
        """These messages of ``queue_id`` were counted and are in flight now."""
        if queue_id in self.lengths:
            self.lengths[queue_id] -= len(ids)
        oldest = self.oldest.get(queue_id)
        if oldest:
            gone = set(ids)
            self.oldest[queue_id] = [i for i in oldest if i not in gone]

    def forget_length(self, queue_id: int) -> None:
        """Messages of ``queue_id`` entered or left the counted states: count again."""
        self.lengths.pop(queue_id, None)
        self.oldest.pop(queue_id, None)

    def count(self, queue_id: int, name: str, n: int = 1, label: str = "") -> None:
        """Add ``n`` to counter ``name`` (enqueued, delivered, redelivered, acked,
        dead_lettered with the reason as ``label``) of ``queue_id``, at commit."""
        if n:
            key = (queue_id, name, label)
            self.counts[key] = self.counts.get(key, 0) + n

    def write_counts(self, shard: int) -> dict[tuple[str, str, str], int]:
        """Add :attr:`counts` to ``leasecast_queue_counter`` (row ``shard`` of each
        counter); returns them by queue name, for this process's dashboard.

        Called last before the commit, so a counter row stays locked briefly.
        """
        statement, named = self.counts_statement(shard)
        if statement is not None:
            self.exec(*statement)
        return named

    def counts_statement(
        self, shard: int
    ) -> tuple[Statement | None, dict[tuple[str, str, str], int]]:
        """:meth:`write_counts`'s statement (None if nothing was counted), not run,
        and the counts by queue name; :attr:`counts` starts again from nothing.

        One statement per transaction, its rows in key order: transactions of
        two processes never wait on each other's rows in opposite orders.
        """
        if not self.counts:
            return None, {}
        keys = sorted(self.counts)
        params: list[Any] = []
        for queue_id, name, label in keys:
            params += [queue_id, name, label, shard, self.counts[(queue_id, name, label)]]
        statement = (
            "INSERT INTO leasecast_queue_counter (queue_id, name, label, shard, value) VALUES "
            + ",".join(["(%s, %s, %s, %s, %s)"] * len(keys))
            + " ON CONFLICT (queue_id, name, label, shard) DO UPDATE "
            "SET value = leasecast_queue_counter.value + excluded.value",
            params,
        )
        named = {
            (self.queues.name_of(self, queue_id), name, label): n
            for (queue_id, name, label), n in self.counts.items()
        }
        self.counts = {}
        return statement, named

    @contextmanager
    def savepoint(
        self, catch: type[Exception] | tuple[type[Exception], ...] = ProtocolError
    ) -> Iterator[None]:
        """Undo what the block did if it raises ``catch`` (re-raised), by default a
        :class:`ProtocolError`.

        For ops that check a rule only after writing (a bounded queue counts
        after inserting): a refusal must change nothing, and its neighbours in
        the batch must keep what they did. The runner also wraps each operator
        op in one with ``catch=Exception``, so that its failure fails it alone.

        Raises:
            SavepointLost: the rollback to the savepoint failed.
        """
        self._savepoints += 1
        name = f"lc_op_{self._savepoints}"
        unsettled, reordered, woken = set(self.unsettled), set(self.reordered), set(self.woken)
        lengths, swept = dict(self.lengths), set(self.swept)
        counts = dict(self.counts)
        oldest = {queue_id: list(ids) for queue_id, ids in self.oldest.items()}
        self.cursor.execute(f"SAVEPOINT {name}")
        try:
            yield
        except catch:
            try:
                self.cursor.execute(f"ROLLBACK TO SAVEPOINT {name}")
                self.cursor.execute(f"RELEASE SAVEPOINT {name}")
            except Exception as lost:
                raise SavepointLost(f"{type(lost).__name__}: {lost}") from lost
            self.unsettled, self.reordered, self.woken = unsettled, reordered, woken
            self.lengths, self.oldest, self.swept = lengths, oldest, swept
            self.counts = counts
            self.queues.clear()  # a queue created in the block is gone again
            raise
        self.cursor.execute(f"RELEASE SAVEPOINT {name}")
