"""The store runner: applies batches of ops, one transaction per batch.

A :class:`Store` owns one database connection and is used from one thread
(the group-commit thread of ``gateway.engine.committer``). :meth:`Store.run` applies a
batch of operations in one transaction, so a burst of enqueues, acks and lease
rounds from many sockets costs one commit (design decision 3). Consecutive
plain enqueues become one multi-row INSERT and consecutive plain acks one
DELETE, so the number of statements does not grow with the number of messages.

Business refusals (a stale receipt, an unknown queue, a full queue) are
returned as that operation's result and change nothing. One operation's
failure never fails the others of its batch:

- an operator or transaction op (the HTTP API's: settings, browse, requeue,
  purge, stage, commit...) runs under a savepoint of its own; if it fails,
  only it is undone and answered ``unavailable``, and the batch goes on, so
  its neighbours are neither failed nor run again;
- the hot ops (enqueues, lease rounds, acks: typed and checked before they
  reach the store, so only the database itself fails them) run without one,
  a savepoint being a round trip on PostgreSQL. If one fails, the batch is
  rolled back and run again in order without losing anyone's op: the ops
  before the failing one as one batch, the failing statement's ops one by
  one, the ops after it as one batch.

When no connection to the database can be made at all (it is down, failing
over, or cut off by the network), the batch's ops, and every op of it not yet
run again, are answered ``unavailable`` at once: running them one by one
would make each wait for a connection attempt of its own (libpq's
``connect_timeout``) before being answered the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, assert_never

from gateway.core.errors import ProtocolError, Unavailable
from gateway.core.leases import DEFAULT_QUEUE_SETTINGS, Clock, QueueSettings
from gateway.store import enqueue as enqueueing
from gateway.store import leasing, operator, staging, tasks
from gateway.store.dialects import POSTGRESQL, Dialect, Statement
from gateway.store.groups import settle
from gateway.store.ops import (
    AbortTxn,
    Ack,
    AllStats,
    Browse,
    Cancel,
    CommitTxn,
    Configure,
    DeleteMessage,
    Enqueue,
    EnsureQueue,
    Extend,
    Lease,
    Nack,
    Op,
    Purge,
    Redrive,
    Reject,
    Release,
    RequeueMessage,
    Result,
    Stage,
    Stats,
)
from gateway.store.txn import COUNTER_SHARD, QueueCache, SavepointLost, Txn

__all__ = ["NOTIFY_CHANNEL", "Store"]

log = logging.getLogger("leasecast.store")

#: The PostgreSQL NOTIFY channel on which woken queues are announced.
NOTIFY_CHANNEL = "leasecast_wake"
#: Failures of one batch after which its ops run one by one (see Store.run).
MAX_SPLITS = 3


class Store:
    """Applies batches of operations to the database in single transactions.

    Args:
        connect: returns a fresh DB-API connection in autocommit mode; called
            again after a failure, so a restarted database is reconnected.
        dialect: :data:`~gateway.store.dialects.SQLITE` or
            :data:`~gateway.store.dialects.POSTGRESQL`.
        clock: the current time in seconds.
        defaults: settings of queues created on first use.
        settings_ttl: seconds a queue's settings are cached before re-reading
            (so edits in the admin take effect without a restart).
        announce_as: on PostgreSQL, announce woken queues to the other gateway
            processes with ``NOTIFY`` (see ``gateway.engine.notify``), signed with
            this process name so its own listener can skip them.
        counter_shard: the row of each queue counter this store adds to
            (:data:`~gateway.store.txn.COUNTER_SHARDS`).
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
        counter_shard: int = COUNTER_SHARD,
    ) -> None:
        self._connect = connect
        self._conn: Any = None
        #: no connection could be made during the current :meth:`run`
        self._unreachable: BaseException | None = None
        self.dialect = dialect
        self._clock = clock
        self._queues = QueueCache(defaults, settings_ttl)
        self._announce_as = announce_as if dialect is POSTGRESQL else None
        #: queues woken by the last :meth:`run` (read by the committer)
        self.woken: set[str] = set()
        #: of those, the queues a lease round of the same :meth:`run` saw every
        #: wake of: a lease round ran after the last statement that woke them
        #: (read by the committer: their pumps need no wake-up for it)
        self.caught_up: set[str] = set()
        self._counter_shard = counter_shard
        #: what the last :meth:`run` committed to queue counters, by (queue,
        #: counter, label): read by the committer, which hands it to the
        #: runtime's metrics (the dashboard's per-process rates)
        self.counted: dict[tuple[str, str, str], int] = {}

    # -- plumbing

    def close(self) -> None:
        """Close the connection (a later call reconnects)."""
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    @contextmanager
    def transaction(self, *, relaxed: bool = False) -> Iterator[Txn]:
        """One transaction: committed if the block ends normally, else rolled back.

        Groups noted as unsettled are settled before the commit, and on
        PostgreSQL the woken queues are announced with ``NOTIFY``, which
        listeners receive on commit and only then.

        Args:
            relaxed: on PostgreSQL the commit does not wait for the log's
                flush (``synchronous_commit`` off): for transactions whose
                loss in a crash loses nothing confirmed.
        """
        cur = self._begin(relaxed)
        txn = Txn(cur, self.dialect, self._clock(), self._queues)
        wakes = txn.woken = _Wakes()
        try:
            yield txn
            settle(txn)
            counts, counted = txn.counts_statement(self._counter_shard)
            tail = [counts] if counts is not None else []
            if self._announce_as is not None:
                tail += [
                    ("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, f"{self._announce_as} {queue}"))
                    for queue in sorted(txn.woken)
                ]
            if self.dialect is POSTGRESQL:
                _commit_with(cur, tail)
            else:  # calls into this process, no round trips to save
                for statement in tail:
                    txn.exec(*statement)
                cur.execute("COMMIT")
        except BaseException:
            try:
                cur.execute("ROLLBACK")
            except Exception:  # the connection itself may be gone
                self.close()
            raise
        # A later transaction's wake undoes an earlier one's lease round; a
        # savepoint rolled back replaces the set, and then nothing is known.
        self.caught_up -= txn.woken
        if txn.woken is wakes:
            self.caught_up |= wakes.caught_up
        self.woken |= txn.woken
        for key, n in counted.items():
            self.counted[key] = self.counted.get(key, 0) + n

    def _begin(self, relaxed: bool = False) -> Any:
        """A cursor inside ``BEGIN``, on a fresh connection if the old one is dead.

        A PostgreSQL connection the server closed while it was idle (a restart,
        an idle timeout) fails on its first statement. Nothing has been applied
        at that point, so one new connection may try again: the batch then runs
        instead of failing with ``unavailable``.
        """
        for attempt in range(2):
            if self._conn is None:
                try:
                    self._conn = self._connect()
                except Exception as exc:
                    raise _Unreachable(f"{type(exc).__name__}: {exc}") from exc
            cur = self._conn.cursor()
            try:
                self.dialect.start(cur, relaxed=relaxed)
                return cur
            except Exception as exc:
                self.close()
                if self.dialect is not POSTGRESQL or attempt:
                    raise
                log.info("reconnecting: the database connection was closed (%s)", exc)
        raise AssertionError("unreachable")

    # -- batches

    def run(self, ops: Sequence[Op]) -> list[Result]:
        """Apply ``ops`` in one transaction; returns one result per op, in order.

        A result is the op's value or the :class:`ProtocolError` that refused it
        (which changed nothing). An operator or transaction op that fails for
        any other reason gets :class:`Unavailable` alone (its savepoint is
        rolled back, the batch goes on). If a hot op's statement fails, the
        batch is rolled back and run again around it: the ops before it as one
        batch, its own ops one at a time, the ops after it as one batch; an op
        that still fails gets :class:`Unavailable`.
        """
        self.woken = set()
        self.caught_up = set()
        self.counted = {}
        self._unreachable = None
        return self._run_split(ops)

    def _run_split(self, ops: Sequence[Op], splits: int = 0) -> list[Result]:
        """:meth:`_run_batch`; if it fails, again around the ops that failed it.

        Args:
            splits: how many failures led here. Past :data:`MAX_SPLITS` (a
                database failing again and again) every op runs on its own.
        """
        if not ops:
            return []
        if self._unreachable is not None:
            return self._refuse_unreachable(ops)
        try:
            return self._run_batch(ops)
        except _Unreachable as unreachable:
            self._unreachable = unreachable.__cause__ or unreachable
            log.warning("database unreachable (%s)", self._unreachable)
            return self._refuse_unreachable(ops)
        except _StatementFailed as failed:
            cause = failed.__cause__
            start, end = failed.start, failed.end
        except Exception as exc:  # settling, counting or the commit: no op to blame
            cause, start, end = exc, 0, len(ops)
        log.warning("batch of %d ops failed (%s: %s)", len(ops), type(cause).__name__, cause)
        self._queues.clear()
        self.close()
        if len(ops) == 1:
            return [Unavailable(f"storage failed: {type(cause).__name__}")]
        if splits >= MAX_SPLITS:
            start, end = 0, len(ops)
        # In order: the ops before the failing statement, its ops one by one
        # (which of them failed it is not known), then the ops after it.
        results = self._run_split(ops[:start], splits + 1)
        for op in ops[start:end]:
            results += self._run_split([op], splits + 1)
        return results + self._run_split(ops[end:], splits + 1)

    def _refuse_unreachable(self, ops: Sequence[Op]) -> list[Result]:
        name = type(self._unreachable).__name__
        return [Unavailable(f"storage unreachable: {name}") for _ in ops]

    def _run_batch(self, ops: Sequence[Op]) -> list[Result]:
        results: list[Result] = [None] * len(ops)
        # Losing a lease round in a crash loses nothing: the messages are
        # simply visible again (at-least-once). So these commits need not wait
        # for the WAL flush; every confirmed write does.
        relaxed = all(isinstance(op, Lease | Release) for op in ops)
        with self.transaction(relaxed=relaxed) as txn:
            i = 0
            while i < len(ops):
                # Runs of plain enqueues and plain acks share one statement.
                j = i + 1
                op = ops[i]
                try:
                    if isinstance(op, _OPERATOR_OPS):
                        results[i] = _apply_alone(txn, op)
                    elif enqueueing.is_plain_enqueue(txn, op):
                        while j < len(ops) and enqueueing.is_plain_enqueue(txn, ops[j]):
                            j += 1
                        results[i:j] = enqueueing.enqueue_plain(txn, ops[i:j])  # type: ignore[arg-type]
                    elif _is_plain_ack(op):
                        while j < len(ops) and _is_plain_ack(ops[j]):
                            j += 1
                        results[i:j] = leasing.ack_plain(txn, ops[i:j])  # type: ignore[arg-type]
                    elif type(op) is Lease:
                        wakes = txn.woken
                        seen = wakes.added if isinstance(wakes, _Wakes) else -1
                        results[i] = _apply_one(txn, op)
                        if (
                            isinstance(wakes, _Wakes)
                            and wakes.added == seen
                            and not isinstance(results[i], ProtocolError)
                        ):
                            # The round saw every wake of its queue so far,
                            # unless it woke the queue itself (a message it
                            # dead-lettered freed a max_in_flight place).
                            wakes.caught_up.add(op.queue)
                    else:
                        results[i] = _apply_one(txn, op)
                except Exception as exc:
                    raise _StatementFailed(i, j) from exc
                i = j
        return results

    # -- housekeeping

    def forget_stale_staging(self, staged_for: float, remembered_for: float) -> int:
        """Drop staging never committed within ``staged_for`` seconds, and records of
        finished transactions older than ``remembered_for``."""
        return staging.forget_stale_staging(self.transaction, staged_for, remembered_for)

    def forget_old_results(self, older_than: float) -> int:
        """Delete task results finished more than ``older_than`` seconds ago."""
        with self.transaction() as txn:
            return tasks.forget_results(txn, older_than)

    def forget_expired_keys(self) -> int:
        """Delete idempotency keys past their window (run now and then, off the hot path)."""
        with self.transaction() as txn:
            deleted: int = txn.exec(
                "DELETE FROM leasecast_dedup WHERE expires_at <= %s", (txn.now,)
            ).rowcount
        return deleted


def _commit_with(cur: Any, tail: list[Statement]) -> None:
    """Run ``tail`` (statements whose results nobody reads) and ``COMMIT`` in
    one round trip: one simple query, each statement's values written into
    its text by the driver (``ClientCursor.mogrify``, which quotes them).

    The counters' upsert and the notifications end every transaction, and
    each was a round trip of its own before the commit's: on the benchmark
    machine about 0.15 ms apiece, on a store thread that runs one
    transaction at a time. If one fails, PostgreSQL skips the rest, the
    ``COMMIT`` with them, and the caller rolls back.
    """
    if not tail:
        cur.execute("COMMIT", prepare=False)
        return
    # Imported here: only PostgreSQL gets here, and the driver is a tenth of
    # the gateway's start on SQLite.
    import psycopg

    mogrify = psycopg.ClientCursor(cur.connection).mogrify
    text = ";\n".join([mogrify(sql, params) for sql, params in tail])
    cur.execute(f"{text};\nCOMMIT", prepare=False)


class _Wakes(set[str]):
    """A transaction's woken queues, knowing which were leased after their last wake.

    ``caught_up`` holds the queues a lease round of the transaction ran for
    after every statement that woke them; any later wake (another op, the
    groups settled at the end) takes the queue out again.
    """

    def __init__(self) -> None:
        super().__init__()
        self.caught_up: set[str] = set()
        #: how many wakes were noted, repeats included
        self.added = 0

    def add(self, name: str) -> None:
        super().add(name)
        self.added += 1
        self.caught_up.discard(name)


class _Unreachable(Exception):
    """No connection to the database could be made (raised from the connect's error)."""


class _StatementFailed(Exception):
    """Ops ``start:end`` of a batch failed (the cause is chained): the batch is lost."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__(start, end)
        self.start = start
        self.end = end


#: The ops of operators and of the transaction API: each runs under a
#: savepoint of its own (:func:`_apply_alone`). Rare next to the hot ops, so
#: the savepoint's statements cost nothing that shows; and they take values
#: from URLs and bodies, where a bad one must fail its own op only.
_OPERATOR_OPS = (
    EnsureQueue,
    Configure,
    Stats,
    AllStats,
    Purge,
    Redrive,
    Browse,
    RequeueMessage,
    DeleteMessage,
    Cancel,
    Stage,
    CommitTxn,
    AbortTxn,
)


def _apply_alone(txn: Txn, op: Op) -> Result:
    """Apply ``op`` under a savepoint: if it fails or is refused, what it wrote
    is undone and its neighbours in the batch keep theirs, run once.

    Raises:
        SavepointLost: the failure took the whole transaction with it.
    """
    try:
        with txn.savepoint(catch=Exception):
            result = _apply_one(txn, op)
            if isinstance(result, ProtocolError):
                raise result  # a refusal changes nothing: undo what it wrote first
    except ProtocolError as refusal:
        return refusal
    except SavepointLost:
        raise
    except Exception as exc:
        log.warning("op %s failed alone", type(op).__name__, exc_info=exc)
        return Unavailable(f"storage failed: {type(exc).__name__}")
    return result


def _apply_one(txn: Txn, op: Op) -> Result:
    """Apply one op; a :class:`ProtocolError` it raises is its result."""
    try:
        match op:
            case Enqueue():
                return enqueueing.enqueue(txn, op.queue, op.messages)
            case Lease():
                return leasing.lease(txn, op)
            case Ack():
                return leasing.ack(txn, op)
            case Nack():
                leasing.nack(txn, op)
                return None
            case Reject():
                leasing.reject(txn, op.receipt)
                return None
            case Extend():
                return leasing.extend(txn, op)
            case Release():
                return leasing.release(txn, op)
            case EnsureQueue():
                return txn.queue(op.queue, create=True).settings
            case Configure():
                return operator.configure(txn, op.queue, op.changes)
            case Stats():
                return operator.stats(txn, txn.queue(op.queue, create=False))
            case AllStats():
                return operator.all_stats(txn)
            case Purge():
                return operator.purge(txn, txn.queue(op.queue, create=False))
            case Redrive():
                return operator.redrive(txn, txn.queue(op.queue, create=False))
            case Browse():
                q = txn.queue(op.queue, create=False)
                return operator.browse(txn, q, op.state, op.limit, op.after)
            case RequeueMessage():
                q = txn.queue(op.queue, create=False)
                return operator.requeue_message(txn, q, op.id, op.expect)
            case DeleteMessage():
                q = txn.queue(op.queue, create=False)
                return operator.delete_message(txn, q, op.id, op.expect)
            case Cancel():
                return operator.cancel_message(txn, txn.queue(op.queue, create=False), op.id)
            case Stage():
                return staging.stage(txn, op)
            case CommitTxn():
                return staging.commit(txn, op)
            case AbortTxn():
                return staging.abort(txn, op)
            case _:
                assert_never(op)
    except ProtocolError as exc:
        return exc


def _is_plain_ack(op: Op) -> bool:
    return isinstance(op, Ack) and not op.follow_ups and op.task is None
