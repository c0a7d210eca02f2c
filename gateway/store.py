"""The work-queue store: every durable read and write of the hot path.

A :class:`Store` owns one database connection and is used from one thread
(the group-commit thread of ``gateway.committer``). :meth:`Store.run` applies a
batch of operations in one transaction, so a burst of enqueues, acks and lease
rounds from many sockets costs one commit (DESIGN decision 3). Consecutive
plain enqueues become one multi-row INSERT and consecutive plain acks one
DELETE, so the number of statements does not grow with the number of messages.

Leasing is one atomic statement (DESIGN decision 2): on SQLite an
``UPDATE ... WHERE id IN (SELECT ... LIMIT n) RETURNING`` inside ``BEGIN
IMMEDIATE``; on PostgreSQL the same with ``FOR UPDATE SKIP LOCKED``, so several
gateway processes can lease from one queue without blocking each other.

Business refusals (a stale receipt, an unknown queue) are returned as that
operation's result and change nothing; any other failure rolls the whole batch
back, and :meth:`Store.run` then retries the operations one by one so that a
single poisoned operation cannot fail its neighbours.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from gateway.errors import Invalid, NotFound, ProtocolError, StaleReceipt, Unavailable
from gateway.leases import (
    DEFAULT_QUEUE_SETTINGS,
    Clock,
    QueueSettings,
    StoredState,
    format_receipt,
    lease_outcome,
    parse_receipt,
    release_state,
)
from gateway.protocol import EnqueueSpec

__all__ = [
    "AbortTxn",
    "Ack",
    "AckResult",
    "CommitTxn",
    "Delivered",
    "Enqueue",
    "EnqueueResult",
    "EnsureQueue",
    "Extend",
    "Lease",
    "LeaseResult",
    "Nack",
    "Op",
    "Purge",
    "Redrive",
    "Reject",
    "Release",
    "Stage",
    "Stats",
    "Store",
    "TxnResult",
    "woken_queues",
]

log = logging.getLogger("leasecast.store")

READY, LEASED, DEAD, DELAYED = (int(s) for s in StoredState)
#: The PostgreSQL NOTIFY channel on which woken queues are announced.
NOTIFY_CHANNEL = "leasecast_wake"
_INSERT_CHUNK = 500  # rows per INSERT statement: well under SQLite's variable limit
_ACK_CHUNK = 500


# -- operations and results ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Enqueue:
    """Enqueue messages to one queue, all or nothing."""

    queue: str
    messages: Sequence[EnqueueSpec]


@dataclass(frozen=True, slots=True)
class Lease:
    """Lease up to ``n`` visible messages for ``visibility_timeout`` (None: the queue's)."""

    queue: str
    n: int
    visibility_timeout: float | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    """Delete a leased message, and enqueue ``follow_ups`` in the same transaction."""

    receipt: str
    follow_ups: Sequence[tuple[str, EnqueueSpec]] = ()


@dataclass(frozen=True, slots=True)
class Nack:
    """Release a leased message of ``queue``, visible again after ``delay`` seconds."""

    queue: str
    receipt: str
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class Reject:
    """Dead-letter a leased message now."""

    receipt: str


@dataclass(frozen=True, slots=True)
class Extend:
    """Make a lease end ``timeout`` seconds from now."""

    receipt: str
    timeout: float


@dataclass(frozen=True, slots=True)
class Release:
    """Release leases of ``queue`` at once (receipts that went stale are skipped)."""

    queue: str
    receipts: Sequence[str]


@dataclass(frozen=True, slots=True)
class EnsureQueue:
    """Create a queue with the default settings if it does not exist; returns its settings."""

    queue: str


@dataclass(frozen=True, slots=True)
class Stats:
    """Counts per state of one queue (NotFound if never used), or of all queues if None."""

    queue: str | None = None


@dataclass(frozen=True, slots=True)
class Purge:
    """Delete every message of a queue that is not in flight."""

    queue: str


@dataclass(frozen=True, slots=True)
class Redrive:
    """Move every dead message of a queue back to visible with its delivery count reset."""

    queue: str


@dataclass(frozen=True, slots=True)
class Stage:
    """Replace partition ``partition`` of transaction ``txn`` with ``messages`` for ``queue``."""

    txn: str
    partition: int
    queue: str
    messages: Sequence[EnqueueSpec]


@dataclass(frozen=True, slots=True)
class CommitTxn:
    """Enqueue everything staged under ``txn`` at once; a second commit changes nothing.

    With ``partitions``, only those partitions are enqueued and any other staging
    of ``txn`` is discarded: what an earlier, differently partitioned attempt of
    the same batch left behind must not be committed with it.
    """

    txn: str
    partitions: frozenset[int] | None = None


@dataclass(frozen=True, slots=True)
class AbortTxn:
    """Discard what is staged under ``txn``."""

    txn: str


@dataclass(frozen=True, slots=True)
class TxnResult:
    """What a staging operation did: ``state`` is staged, committed or aborted."""

    state: str
    messages: int
    already: bool = False


Op: TypeAlias = (
    Enqueue
    | Lease
    | Ack
    | Nack
    | Reject
    | Extend
    | Release
    | EnsureQueue
    | Stats
    | Purge
    | Redrive
    | Stage
    | CommitTxn
    | AbortTxn
)


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """The id given to an enqueued message, or the existing id of a duplicate key."""

    id: str
    duplicate: bool

    def as_json(self) -> dict[str, Any]:
        """The wire form ``{"id", "duplicate"}``."""
        return {"id": self.id, "duplicate": self.duplicate}


@dataclass(frozen=True, slots=True)
class Delivered:
    """One leased message, ready to be sent as a ``deliver`` frame."""

    id: str
    receipt: str
    body: str
    deliveries: int
    expires_at: float


@dataclass(slots=True)
class LeaseResult:
    """What a lease round got: deliveries in queue order, and when to look again."""

    delivered: list[Delivered] = field(default_factory=list)
    dead_lettered: int = 0
    #: earliest ``visible_at`` of a leased or delayed message still to come due
    next_due: float | None = None


@dataclass(frozen=True, slots=True)
class AckResult:
    """An ack's follow-up results, in order."""

    enqueued: list[EnqueueResult]


Result: TypeAlias = Any  # one of the results above, a float, a dict, or a ProtocolError


# -- SQL dialects ----------------------------------------------------------------

_LEASE_PICK = """
    SELECT id FROM (
        SELECT id FROM leasecast_message
        WHERE queue_id = %s AND state = 0 ORDER BY id LIMIT %s
    ) AS ready
    UNION ALL
    SELECT id FROM (
        SELECT id FROM leasecast_message
        WHERE queue_id = %s AND state IN (1, 3) AND visible_at <= %s ORDER BY id LIMIT %s
    ) AS due
    ORDER BY id LIMIT %s
"""


@dataclass(frozen=True, slots=True)
class Dialect:
    """SQL that differs between SQLite and PostgreSQL."""

    name: str
    begin: str
    lease: str
    placeholder: str = "%s"

    def sql(self, text: str) -> str:
        """Adapt ``%s`` placeholders to the driver's style."""
        return text if self.placeholder == "%s" else text.replace("%s", self.placeholder)


SQLITE = Dialect(
    name="sqlite",
    begin="BEGIN IMMEDIATE",
    placeholder="?",
    lease=f"""
        UPDATE leasecast_message
        SET state = 1, visible_at = %s, deliveries = deliveries + 1, lease_token = %s
        WHERE id IN ({_LEASE_PICK})
        RETURNING id, body, deliveries
    """,
)

POSTGRESQL = Dialect(
    name="postgresql",
    begin="BEGIN",
    lease="""
        WITH ready AS (
            SELECT id FROM leasecast_message
            WHERE queue_id = %s AND state = 0 ORDER BY id LIMIT %s
            FOR UPDATE SKIP LOCKED
        ), due AS (
            SELECT id FROM leasecast_message
            WHERE queue_id = %s AND state IN (1, 3) AND visible_at <= %s ORDER BY id LIMIT %s
            FOR UPDATE SKIP LOCKED
        ), picked AS (
            SELECT id FROM ready UNION ALL SELECT id FROM due ORDER BY id LIMIT %s
        )
        UPDATE leasecast_message AS m
        SET state = 1, visible_at = %s, deliveries = m.deliveries + 1, lease_token = %s
        FROM picked WHERE m.id = picked.id
        RETURNING m.id, m.body, m.deliveries
    """,
)


# -- the store -------------------------------------------------------------------


@dataclass(slots=True)
class _QueueRow:
    id: int
    settings: QueueSettings
    loaded_at: float


class Store:
    """Applies batches of operations to the database in single transactions.

    Args:
        connect: returns a fresh DB-API connection in autocommit mode; called
            again after a failure, so a restarted database is reconnected.
        dialect: :data:`SQLITE` or :data:`POSTGRESQL`.
        clock: the current time in seconds.
        defaults: settings of queues created on first use.
        settings_ttl: seconds a queue's settings are cached before re-reading
            (so edits in the admin take effect without a restart).
        announce_as: on PostgreSQL, announce woken queues to the other gateway
            processes with ``NOTIFY`` (see ``gateway.notify``), signed with
            this process name so its own listener can skip them.
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        dialect: Dialect,
        *,
        clock: Clock,
        defaults: QueueSettings = DEFAULT_QUEUE_SETTINGS,
        settings_ttl: float = 2.0,
        announce_as: str | None = None,
    ) -> None:
        self._connect = connect
        self._conn: Any = None
        self.dialect = dialect
        self._clock = clock
        self._defaults = defaults
        self._settings_ttl = settings_ttl
        self._queues: dict[str, _QueueRow] = {}
        self._sql_cache: dict[str, str] = {}
        self._announce_as = announce_as if dialect is POSTGRESQL else None
        #: queues woken by the last :meth:`run` (read by the committer)
        self.woken: set[str] = set()
        self._committed_queues: set[str] = set()  # filled by transaction commits

    # -- plumbing

    def close(self) -> None:
        """Close the connection (a later call reconnects)."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def _sql(self, text: str) -> str:
        cached = self._sql_cache.get(text)
        if cached is None:
            cached = self._sql_cache[text] = self.dialect.sql(text)
        return cached

    def _cursor(self) -> Any:
        if self._conn is None:
            self._conn = self._connect()
        return self._conn.cursor()

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        cur = self._cursor()
        cur.execute(self.dialect.begin)
        try:
            yield cur
        except BaseException:
            try:
                cur.execute("ROLLBACK")
            except Exception:  # the connection itself may be gone
                self.close()
            raise
        cur.execute("COMMIT")

    def _exec(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        cur.execute(self._sql(sql), params)
        return cur

    # -- batches

    def run(self, ops: Sequence[Op]) -> list[Result]:
        """Apply ``ops`` in one transaction; returns one result per op, in order.

        A result is the op's value or the :class:`ProtocolError` that refused it
        (which changed nothing). If the batch fails for any other reason it is
        rolled back and retried one op at a time; an op that still fails gets
        :class:`Unavailable`.
        """
        self.woken = set()
        self._committed_queues.clear()
        try:
            return self._run_batch(ops)
        except Exception as exc:
            log.warning("batch of %d ops failed (%s: %s)", len(ops), type(exc).__name__, exc)
            self._queues.clear()
            self.close()
            if len(ops) == 1:
                return [Unavailable(f"storage failed: {type(exc).__name__}")]
        results: list[Result] = []
        for op in ops:
            try:
                results.extend(self._run_batch([op]))
            except Exception as exc:
                log.warning("op %s failed (%s: %s)", type(op).__name__, type(exc).__name__, exc)
                self.close()
                results.append(Unavailable(f"storage failed: {type(exc).__name__}"))
        return results

    def _run_batch(self, ops: Sequence[Op]) -> list[Result]:
        now = self._clock()
        results: list[Result] = [None] * len(ops)
        with self._transaction() as cur:
            if self.dialect is POSTGRESQL and all(isinstance(op, Lease | Release) for op in ops):
                # Losing a lease round in a crash loses nothing: the messages
                # are simply visible again (at-least-once). So these commits
                # need not wait for the WAL flush; every confirmed write does.
                cur.execute("SET LOCAL synchronous_commit TO OFF")
            i = 0
            while i < len(ops):
                # Runs of plain enqueues (no key) and plain acks share one statement.
                j = i
                if _is_plain_enqueue(ops[i]):
                    while j < len(ops) and _is_plain_enqueue(ops[j]):
                        j += 1
                    self._enqueue_plain(cur, ops[i:j], results, i, now)  # type: ignore[arg-type]
                elif _is_plain_ack(ops[i]):
                    while j < len(ops) and _is_plain_ack(ops[j]):
                        j += 1
                    self._ack_plain(cur, ops[i:j], results, i, now)  # type: ignore[arg-type]
                else:
                    j = i + 1
                    results[i] = self._apply_one(cur, ops[i], now)
                i = j
            woken: set[str] = set(self._committed_queues)
            self._committed_queues.clear()
            for op, result in zip(ops, results, strict=True):
                woken.update(woken_queues(op, result))
            if self._announce_as is not None:
                for queue in sorted(woken):
                    # Delivered to listeners on commit, and only then.
                    self._exec(
                        cur,
                        "SELECT pg_notify(%s, %s)",
                        (NOTIFY_CHANNEL, f"{self._announce_as} {queue}"),
                    )
        self.woken |= woken
        return results

    def _apply_one(self, cur: Any, op: Op, now: float) -> Result:
        try:
            match op:
                case Enqueue():
                    return self._enqueue(cur, op.queue, op.messages, now)
                case Lease():
                    return self._lease(cur, op, now)
                case Ack():
                    return self._ack(cur, op, now)
                case Nack():
                    return self._nack(cur, op, now)
                case Reject():
                    return self._reject(cur, op, now)
                case Extend():
                    return self._extend(cur, op, now)
                case Release():
                    return self._release(cur, op, now)
                case EnsureQueue():
                    return self._queue(cur, op.queue, now, create=True).settings
                case Stats():
                    return self._stats(cur, op.queue, now)
                case Purge():
                    return self._purge(cur, op.queue, now)
                case Redrive():
                    return self._redrive(cur, op.queue, now)
                case Stage():
                    return self._stage(cur, op, now)
                case CommitTxn():
                    return self._commit_txn(cur, op.txn, op.partitions, now)
                case AbortTxn():
                    return self._abort_txn(cur, op.txn, now)
        except ProtocolError as exc:
            return exc
        raise TypeError(f"unknown op {op!r}")

    # -- queues

    def _queue(self, cur: Any, name: str, now: float, *, create: bool) -> _QueueRow:
        row = self._queues.get(name)
        if row is not None and now - row.loaded_at < self._settings_ttl:
            return row
        select = (
            "SELECT id, visibility_timeout, max_deliveries, dedup_window "
            "FROM leasecast_queue WHERE name = %s"
        )
        found = self._exec(cur, select, (name,)).fetchone()
        if found is None:
            if not create:
                raise NotFound(f"queue {name!r} does not exist")
            d = self._defaults
            self._exec(
                cur,
                "INSERT INTO leasecast_queue "
                "(name, visibility_timeout, max_deliveries, dedup_window, created_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING",
                (name, d.visibility_timeout, d.max_deliveries, d.dedup_window, now),
            )
            found = self._exec(cur, select, (name,)).fetchone()
        queue_id, vt, max_deliveries, dedup_window = found
        row = _QueueRow(queue_id, QueueSettings(vt, max_deliveries, dedup_window), now)
        self._queues[name] = row
        return row

    # -- enqueue

    def _enqueue(
        self, cur: Any, queue: str, messages: Sequence[EnqueueSpec], now: float
    ) -> list[EnqueueResult]:
        q = self._queue(cur, queue, now, create=True)
        results: list[EnqueueResult | None] = [None] * len(messages)
        plain: list[int] = []
        for index, spec in enumerate(messages):
            if spec.key is None:
                plain.append(index)
                continue
            # Keyed messages go one by one, in order, so a key repeated inside
            # one batch is a duplicate of its first occurrence.
            if plain:
                self._insert_into(cur, q, messages, plain, results, now)
                plain = []
            results[index] = self._enqueue_keyed(cur, q, spec, now)
        if plain:
            self._insert_into(cur, q, messages, plain, results, now)
        return [r for r in results if r is not None]

    def _insert_into(
        self,
        cur: Any,
        q: _QueueRow,
        messages: Sequence[EnqueueSpec],
        indices: list[int],
        results: list[EnqueueResult | None],
        now: float,
    ) -> None:
        ids = self._insert(cur, [(q.id, messages[i]) for i in indices], now)
        for i, msg_id in zip(indices, ids, strict=True):
            results[i] = EnqueueResult(str(msg_id), False)

    def _insert(self, cur: Any, rows: Sequence[tuple[int, EnqueueSpec]], now: float) -> list[int]:
        """Insert messages; returns their ids in the order given."""
        ids: list[int] = []
        for start in range(0, len(rows), _INSERT_CHUNK):
            chunk = rows[start : start + _INSERT_CHUNK]
            columns: tuple[list[Any], ...] = ([], [], [], [], [], [])
            for queue_id, spec in chunk:
                for column, value in zip(
                    columns,
                    (
                        queue_id,
                        spec.body_json.decode(),
                        spec.key,
                        DELAYED if spec.delay > 0 else READY,
                        now + spec.delay,
                        now,
                    ),
                    strict=True,
                ):
                    column.append(value)
            if self.dialect is POSTGRESQL:
                # One statement of six arrays, whatever the row count: PostgreSQL
                # plans it once, where a VALUES list of thousands of parameters
                # costs more to parse than to run.
                sql = (
                    'INSERT INTO leasecast_message (queue_id, body, "key", state, visible_at, '
                    "deliveries, enqueued_at) SELECT q, b, k, s, v, 0, e FROM unnest("
                    "%s::bigint[], %s::text[], %s::text[], %s::smallint[], %s::float8[], "
                    "%s::float8[]) AS t(q, b, k, s, v, e) RETURNING id"
                )
                params: Sequence[Any] = columns
            else:
                sql = (
                    'INSERT INTO leasecast_message (queue_id, body, "key", state, visible_at, '
                    "deliveries, enqueued_at) VALUES "
                    + ",".join(["(%s, %s, %s, %s, %s, 0, %s)"] * len(chunk))
                    + " RETURNING id"
                )
                params = [value for row in zip(*columns, strict=True) for value in row]
            # Ids grow in insertion order, and RETURNING's row order is not
            # promised by either database: sorting restores the given order.
            ids += sorted(row[0] for row in self._exec(cur, sql, params).fetchall())
        return ids

    def _enqueue_keyed(
        self, cur: Any, q: _QueueRow, spec: EnqueueSpec, now: float
    ) -> EnqueueResult:
        # Claim the key first: the upsert takes it if new or expired. On
        # PostgreSQL a concurrent claimer waits on the unique index, so two
        # gateways cannot both enqueue one key.
        claimed = self._exec(
            cur,
            'INSERT INTO leasecast_dedup (queue_id, "key", msg_id, expires_at) '
            'VALUES (%s, %s, 0, %s) ON CONFLICT (queue_id, "key") DO UPDATE '
            "SET msg_id = 0, expires_at = excluded.expires_at "
            "WHERE leasecast_dedup.expires_at <= %s RETURNING queue_id",
            (q.id, spec.key, now + q.settings.dedup_window, now),
        ).fetchone()
        if claimed is None:
            existing = self._exec(
                cur,
                'SELECT msg_id FROM leasecast_dedup WHERE queue_id = %s AND "key" = %s',
                (q.id, spec.key),
            ).fetchone()
            return EnqueueResult(str(existing[0]), True)
        (msg_id,) = self._insert(cur, [(q.id, spec)], now)
        self._exec(
            cur,
            'UPDATE leasecast_dedup SET msg_id = %s WHERE queue_id = %s AND "key" = %s',
            (msg_id, q.id, spec.key),
        )
        return EnqueueResult(str(msg_id), False)

    def _enqueue_plain(
        self, cur: Any, ops: Sequence[Enqueue], results: list[Result], offset: int, now: float
    ) -> None:
        rows: list[tuple[int, EnqueueSpec]] = []
        for op in ops:
            q = self._queue(cur, op.queue, now, create=True)
            rows += [(q.id, spec) for spec in op.messages]
        ids = iter(self._insert(cur, rows, now))
        for k, op in enumerate(ops):
            results[offset + k] = [EnqueueResult(str(next(ids)), False) for _ in op.messages]

    # -- leases

    def _lease(self, cur: Any, op: Lease, now: float) -> LeaseResult:
        q = self._queue(cur, op.queue, now, create=True)
        timeout = op.visibility_timeout or q.settings.visibility_timeout
        result = LeaseResult()
        wanted = op.n
        while wanted > 0:
            token = secrets.randbits(62)
            expires_at = now + timeout
            if self.dialect is POSTGRESQL:
                params: tuple[Any, ...] = (
                    q.id,
                    wanted,
                    q.id,
                    now,
                    wanted,
                    wanted,
                    expires_at,
                    token,
                )
            else:
                params = (expires_at, token, q.id, wanted, q.id, now, wanted, wanted)
            rows = sorted(self._exec(cur, self.dialect.lease, params).fetchall())
            dead: list[int] = []
            for msg_id, body, deliveries in rows:
                if lease_outcome(deliveries, q.settings.max_deliveries) == "dead_letter":
                    dead.append(msg_id)
                else:
                    receipt = format_receipt(msg_id, token)
                    result.delivered.append(
                        Delivered(str(msg_id), receipt, body, deliveries, expires_at)
                    )
            if dead:
                # Not delivered after all: the raised count is put back, so a
                # dead message shows the deliveries it really had.
                self._exec(
                    cur,
                    "UPDATE leasecast_message SET state = 2, lease_token = NULL, "
                    "deliveries = deliveries - 1 WHERE id IN ("
                    + ",".join(["%s"] * len(dead))
                    + ")",
                    dead,
                )
                result.dead_lettered += len(dead)
            asked, wanted = wanted, wanted - (len(rows) - len(dead))
            if len(rows) < asked:
                break  # the queue ran dry; otherwise refill what was dead-lettered
        if len(result.delivered) < op.n:
            row = self._exec(
                cur,
                "SELECT MIN(visible_at) FROM leasecast_message "
                "WHERE queue_id = %s AND state IN (1, 3)",
                (q.id,),
            ).fetchone()
            result.next_due = row[0] if row else None
        return result

    def _leased(self, receipt: str) -> tuple[int, int]:
        parsed = parse_receipt(receipt)
        if parsed is None:
            raise StaleReceipt(f"receipt {receipt[:60]!r} was never issued")
        return parsed

    def _end_lease(
        self, cur: Any, receipt: str, now: float, set_sql: str, params: tuple[Any, ...]
    ) -> None:
        msg_id, token = self._leased(receipt)
        changed = self._exec(
            cur,
            f"UPDATE leasecast_message SET {set_sql} "
            "WHERE id = %s AND lease_token = %s AND state = 1 AND visible_at > %s",
            (*params, msg_id, token, now),
        ).rowcount
        if changed != 1:
            raise StaleReceipt("the receipt is not a current lease (acked, expired or redelivered)")

    def _ack(self, cur: Any, op: Ack, now: float) -> AckResult:
        msg_id, token = self._leased(op.receipt)
        deleted = self._exec(
            cur,
            "DELETE FROM leasecast_message "
            "WHERE id = %s AND lease_token = %s AND state = 1 AND visible_at > %s",
            (msg_id, token, now),
        ).rowcount
        if deleted != 1:
            raise StaleReceipt("the receipt is not a current lease (acked, expired or redelivered)")
        enqueued: list[EnqueueResult] = []
        by_queue: dict[str, list[int]] = {}
        for index, (queue, _) in enumerate(op.follow_ups):
            by_queue.setdefault(queue, []).append(index)
        slots: list[EnqueueResult | None] = [None] * len(op.follow_ups)
        for queue, indices in by_queue.items():
            specs = [op.follow_ups[i][1] for i in indices]
            for i, res in zip(indices, self._enqueue(cur, queue, specs, now), strict=True):
                slots[i] = res
        enqueued = [s for s in slots if s is not None]
        return AckResult(enqueued)

    def _ack_plain(
        self, cur: Any, ops: Sequence[Ack], results: list[Result], offset: int, now: float
    ) -> None:
        wanted: dict[int, tuple[int, int]] = {}  # op index -> (id, token)
        for k, op in enumerate(ops):
            parsed = parse_receipt(op.receipt)
            if parsed is None:
                results[offset + k] = StaleReceipt(f"receipt {op.receipt[:60]!r} was never issued")
            else:
                wanted[k] = parsed
        deleted: set[tuple[int, int]] = set()
        pairs = list(dict.fromkeys(wanted.values()))
        for start in range(0, len(pairs), _ACK_CHUNK):
            chunk = pairs[start : start + _ACK_CHUNK]
            ids = [msg_id for msg_id, _ in chunk]
            tokens = [token for _, token in chunk]
            if self.dialect is POSTGRESQL:
                sql = (
                    "DELETE FROM leasecast_message WHERE id = ANY(%s::bigint[]) AND state = 1 "
                    "AND visible_at > %s AND (id, lease_token) IN "
                    "(SELECT * FROM unnest(%s::bigint[], %s::bigint[])) RETURNING id, lease_token"
                )
                params: list[Any] = [ids, now, ids, tokens]
            else:
                # The plain "id IN" lets SQLite use the primary key; the row
                # values then check each lease token (it would scan otherwise).
                sql = (
                    "DELETE FROM leasecast_message WHERE id IN ("
                    + ",".join(["%s"] * len(chunk))
                    + ") AND state = 1 AND visible_at > %s AND (id, lease_token) IN (VALUES "
                    + ",".join(["(%s, %s)"] * len(chunk))
                    + ") RETURNING id, lease_token"
                )
                params = [*ids, now]
                for pair in chunk:
                    params += pair
            deleted.update(tuple(row) for row in self._exec(cur, sql, params).fetchall())
        for k, pair in wanted.items():
            if pair in deleted:
                deleted.discard(pair)  # a receipt repeated in one batch acks once
                results[offset + k] = AckResult([])
            else:
                results[offset + k] = StaleReceipt(
                    "the receipt is not a current lease (acked, expired or redelivered)"
                )

    def _nack(self, cur: Any, op: Nack, now: float) -> None:
        state = int(release_state(op.delay))
        self._end_lease(
            cur,
            op.receipt,
            now,
            "state = %s, visible_at = %s, lease_token = NULL",
            (state, now + op.delay),
        )

    def _reject(self, cur: Any, op: Reject, now: float) -> None:
        self._end_lease(cur, op.receipt, now, "state = 2, lease_token = NULL", ())

    def _extend(self, cur: Any, op: Extend, now: float) -> float:
        expires_at = now + op.timeout
        self._end_lease(cur, op.receipt, now, "visible_at = %s", (expires_at,))
        return expires_at

    def _release(self, cur: Any, op: Release, now: float) -> int:
        released = 0
        for receipt in op.receipts:
            parsed = parse_receipt(receipt)
            if parsed is None:
                continue
            # No visible_at test: an expired lease not yet taken again is
            # still ours to hand back, which makes it visible a little sooner.
            released += self._exec(
                cur,
                "UPDATE leasecast_message SET state = 0, visible_at = %s, lease_token = NULL "
                "WHERE id = %s AND lease_token = %s AND state = 1",
                (now, *parsed),
            ).rowcount
        return released

    # -- operator views and actions

    def _stats(self, cur: Any, queue: str | None, now: float) -> dict[str, Any]:
        if queue is not None:
            q = self._queue(cur, queue, now, create=False)
            return self._queue_stats(cur, queue, q, now)
        names = self._exec(cur, "SELECT name FROM leasecast_queue ORDER BY name").fetchall()
        return {
            "queues": [
                self._queue_stats(cur, name, self._queue(cur, name, now, create=False), now)
                for (name,) in names
            ]
        }

    def _queue_stats(self, cur: Any, name: str, q: _QueueRow, now: float) -> dict[str, Any]:
        counts = dict.fromkeys(("visible", "delayed", "in_flight", "dead"), 0)
        rows = self._exec(
            cur,
            "SELECT state, visible_at <= %s AS due, COUNT(*), MIN(enqueued_at) "
            "FROM leasecast_message WHERE queue_id = %s GROUP BY 1, 2",
            (now, q.id),
        ).fetchall()
        oldest: float | None = None
        for state, due, count, first in rows:
            if state == DEAD:
                counts["dead"] += count
                continue
            if state == READY or due:
                counts["visible"] += count
                oldest = first if oldest is None else min(oldest, first)
            elif state == LEASED:
                counts["in_flight"] += count
            else:
                counts["delayed"] += count
        s = q.settings
        return {
            "name": name,
            **counts,
            "oldest_visible_age": None if oldest is None else max(0.0, now - oldest),
            "visibility_timeout": s.visibility_timeout,
            "max_deliveries": s.max_deliveries,
            "dedup_window": s.dedup_window,
        }

    def _purge(self, cur: Any, queue: str, now: float) -> int:
        q = self._queue(cur, queue, now, create=False)
        # In flight means leased and not expired: those stay with their workers.
        purged: int = self._exec(
            cur,
            "DELETE FROM leasecast_message WHERE queue_id = %s "
            "AND NOT (state = 1 AND visible_at > %s)",
            (q.id, now),
        ).rowcount
        return purged

    def _redrive(self, cur: Any, queue: str, now: float) -> int:
        q = self._queue(cur, queue, now, create=False)
        redriven: int = self._exec(
            cur,
            "UPDATE leasecast_message SET state = 0, visible_at = %s, deliveries = 0, "
            "lease_token = NULL WHERE queue_id = %s AND state = 2",
            (now, q.id),
        ).rowcount
        return redriven

    # -- staging transactions (the Spark sink, docs/protocol.md)

    def _finished(self, cur: Any, txn: str) -> tuple[str, int] | None:
        row = self._exec(
            cur, "SELECT state, messages FROM leasecast_transaction WHERE name = %s", (txn,)
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def _stage(self, cur: Any, op: Stage, now: float) -> TxnResult:
        finished = self._finished(cur, op.txn)
        if finished is not None:
            # A retried task of a batch already committed (or aborted): its
            # rows are in (or were discarded); staging again changes nothing.
            return TxnResult(finished[0], 0, already=True)
        q = self._queue(cur, op.queue, now, create=True)
        self._exec(
            cur,
            'DELETE FROM leasecast_staged WHERE txn = %s AND "partition" = %s',
            (op.txn, op.partition),
        )
        for start in range(0, len(op.messages), _INSERT_CHUNK):
            chunk = op.messages[start : start + _INSERT_CHUNK]
            params: list[Any] = []
            for position, spec in enumerate(chunk, start):
                params += [
                    op.txn,
                    op.partition,
                    position,
                    q.id,
                    spec.body_json.decode(),
                    spec.key,
                    spec.delay,
                    now,
                ]
            self._exec(
                cur,
                'INSERT INTO leasecast_staged (txn, "partition", "position", queue_id, body, '
                '"key", delay, staged_at) VALUES '
                + ",".join(["(%s, %s, %s, %s, %s, %s, %s, %s)"] * len(chunk)),
                params,
            )
        return TxnResult("staged", len(op.messages))

    def _commit_txn(
        self, cur: Any, txn: str, partitions: frozenset[int] | None, now: float
    ) -> TxnResult:
        finished = self._finished(cur, txn)
        if finished is not None:
            if finished[0] != "committed":
                raise Invalid(f"transaction {txn!r} was aborted")
            return TxnResult("committed", finished[1], already=True)
        rows = self._exec(
            cur,
            'SELECT s."partition", q.name, s.body, s."key", s.delay FROM leasecast_staged AS s '
            "JOIN leasecast_queue AS q ON q.id = s.queue_id "
            'WHERE s.txn = %s ORDER BY s."partition", s."position"',
            (txn,),
        ).fetchall()
        if partitions is not None:
            rows = [row for row in rows if row[0] in partitions]
        by_queue: dict[str, list[EnqueueSpec]] = {}
        for _, queue, body, key, delay in rows:
            by_queue.setdefault(queue, []).append(EnqueueSpec(body.encode(), key, delay))
        for queue, specs in by_queue.items():
            self._enqueue(cur, queue, specs, now)
        self._committed_queues.update(by_queue)
        self._exec(cur, "DELETE FROM leasecast_staged WHERE txn = %s", (txn,))
        self._exec(
            cur,
            "INSERT INTO leasecast_transaction (name, state, messages, finished_at) "
            "VALUES (%s, 'committed', %s, %s)",
            (txn, len(rows), now),
        )
        return TxnResult("committed", len(rows))

    def _abort_txn(self, cur: Any, txn: str, now: float) -> TxnResult:
        finished = self._finished(cur, txn)
        if finished is not None:
            if finished[0] == "committed":
                raise Invalid(f"transaction {txn!r} is committed; it cannot be aborted")
            return TxnResult("aborted", 0, already=True)
        dropped: int = self._exec(
            cur, "DELETE FROM leasecast_staged WHERE txn = %s", (txn,)
        ).rowcount
        self._exec(
            cur,
            "INSERT INTO leasecast_transaction (name, state, messages, finished_at) "
            "VALUES (%s, 'aborted', 0, %s)",
            (txn, now),
        )
        return TxnResult("aborted", dropped)

    # -- housekeeping

    def forget_stale_staging(self, staged_for: float, remembered_for: float) -> int:
        """Drop staging never committed within ``staged_for`` seconds, and records of
        finished transactions older than ``remembered_for``."""
        now = self._clock()
        with self._transaction() as cur:
            dropped: int = self._exec(
                cur, "DELETE FROM leasecast_staged WHERE staged_at <= %s", (now - staged_for,)
            ).rowcount
            self._exec(
                cur,
                "DELETE FROM leasecast_transaction WHERE finished_at <= %s",
                (now - remembered_for,),
            )
        return dropped

    def forget_expired_keys(self) -> int:
        """Delete idempotency keys past their window (run now and then, off the hot path)."""
        with self._transaction() as cur:
            deleted: int = self._exec(
                cur, "DELETE FROM leasecast_dedup WHERE expires_at <= %s", (self._clock(),)
            ).rowcount
        return deleted


def woken_queues(op: Op, result: Result) -> tuple[str, ...]:
    """The queues in which ``op`` (with this result) may have made messages visible."""
    if isinstance(result, ProtocolError):
        return ()
    match op:
        case Enqueue() | Redrive():
            return (op.queue,)
        case Nack() | Release():
            return (op.queue,)
        case Ack():
            return tuple({queue for queue, _ in op.follow_ups})
    return ()


def _is_plain_enqueue(op: Op) -> bool:
    return isinstance(op, Enqueue) and all(spec.key is None for spec in op.messages)


def _is_plain_ack(op: Op) -> bool:
    return isinstance(op, Ack) and not op.follow_ups
