"""Staged transactions (the Spark sink, docs/protocol.md: Transactions).

A task stages its partition of a batch; the driver commits the batch once,
which enqueues every staged message at once. A retried task, or a replayed
commit, changes nothing: finished transactions are remembered.

A transaction name belongs to the principal that first touched it (protocol
1.2: General): its record (``leasecast_transaction``) is made ``open`` with
that owner by the first stage, commit or abort, and every later one by
another principal is ``forbidden``, checked in the same store transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from gateway.core.errors import Forbidden, Invalid
from gateway.core.protocol import EnqueueSpec
from gateway.store.dialects import POSTGRESQL
from gateway.store.enqueue import enqueue
from gateway.store.ops import AbortTxn, CommitTxn, Stage, TxnResult
from gateway.store.txn import Txn

__all__ = ["abort", "commit", "forget_stale_staging", "stage"]

_INSERT_CHUNK = 400  # 11 columns a row: under SQLite's variable limit
#: The state of a transaction's record while it stages (its owner is bound).
_OPEN = "open"


@dataclass(frozen=True, slots=True)
class _Record:
    """A transaction's row: ``open`` while it stages, then ``committed`` or ``aborted``."""

    state: str
    messages: int
    owner: str | None


def _claim(txn: Txn, name: str, owner: str | None, *, any_owner: bool = False) -> _Record:
    """The transaction's record, made ``open`` and bound to ``owner`` if it has none.

    The record is locked (PostgreSQL; SQLite's write transaction already
    excludes the others), so a stage, a commit and an abort of one name take
    turns: a stage never lands in a transaction being committed.

    Raises:
        Forbidden: another principal owns the name. The detail says nothing
            about the transaction (its state, queue, messages or owner).
    """
    txn.exec(
        "INSERT INTO leasecast_transaction (name, state, messages, finished_at, owner) "
        "VALUES (%s, 'open', 0, %s, %s) ON CONFLICT (name) DO NOTHING",
        (name, txn.now, owner),
    )
    lock = " FOR UPDATE" if txn.dialect is POSTGRESQL else ""
    state, messages, bound = txn.exec(
        f"SELECT state, messages, owner FROM leasecast_transaction WHERE name = %s{lock}",
        (name,),
    ).fetchone()
    # A record without an owner was finished before owners were kept: anyone's.
    if owner is not None and bound is not None and bound != owner and not any_owner:
        raise Forbidden(f"transaction {name!r} belongs to another principal")
    return _Record(state, messages, bound)


def stage(txn: Txn, op: Stage) -> TxnResult:
    """Replace partition ``op.partition`` of ``op.txn`` with ``op.messages``.

    Raises:
        Forbidden: another principal owns ``op.txn``.
    """
    record = _claim(txn, op.txn, op.owner)
    if record.state != _OPEN:
        # A retried task of a batch already committed (or aborted): its
        # rows are in (or were discarded); staging again changes nothing.
        return TxnResult(record.state, 0, already=True)
    q = txn.queue(op.queue, create=True)
    txn.exec(
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
                spec.group,
                spec.priority,
                spec.ttl,
                txn.now,
            ]
        txn.exec(
            'INSERT INTO leasecast_staged (txn, "partition", "position", queue_id, body, '
            '"key", delay, "group", priority, ttl, staged_at) VALUES '
            + ",".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(chunk)),
            params,
        )
    return TxnResult("staged", len(op.messages))


def commit(txn: Txn, op: CommitTxn) -> TxnResult:
    """Enqueue everything staged under ``op.txn`` (only ``op.partitions``, if given).

    Raises:
        Forbidden: another principal owns ``op.txn``.
        Invalid: the transaction was aborted.
        QueueFull: a bounded queue cannot take its messages; nothing was applied.
    """
    with txn.savepoint():
        # The claim too: a commit that fails leaves no record of its own.
        record = _claim(txn, op.txn, op.owner)
        if record.state != _OPEN:
            if record.state != "committed":
                raise Invalid(f"transaction {op.txn!r} was aborted")
            return TxnResult("committed", record.messages, already=True)
        rows = txn.exec(
            'SELECT s."partition", q.name, s.body, s."key", s.delay, s."group", s.priority, '
            "s.ttl FROM leasecast_staged AS s JOIN leasecast_queue AS q ON q.id = s.queue_id "
            'WHERE s.txn = %s ORDER BY s."partition", s."position"',
            (op.txn,),
        ).fetchall()
        if op.partitions is not None:
            rows = [row for row in rows if row[0] in op.partitions]
        by_queue: dict[str, list[EnqueueSpec]] = {}
        for _, queue, body, key, delay, group, priority, ttl in rows:
            by_queue.setdefault(queue, []).append(
                EnqueueSpec(body.encode(), key, delay, group, priority, ttl)
            )
        for queue, specs in by_queue.items():
            enqueue(txn, queue, specs)
        txn.exec("DELETE FROM leasecast_staged WHERE txn = %s", (op.txn,))
        _finish(txn, op.txn, "committed", len(rows))
    return TxnResult("committed", len(rows))


def abort(txn: Txn, op: AbortTxn) -> TxnResult:
    """Discard what is staged under ``op.txn``.

    Raises:
        Forbidden: another principal owns ``op.txn`` (an ``admin`` may abort any).
        Invalid: the transaction is committed.
    """
    record = _claim(txn, op.txn, op.owner, any_owner=op.any_owner)
    if record.state != _OPEN:
        if record.state == "committed":
            raise Invalid(f"transaction {op.txn!r} is committed; it cannot be aborted")
        return TxnResult("aborted", 0, already=True)
    dropped: int = txn.exec("DELETE FROM leasecast_staged WHERE txn = %s", (op.txn,)).rowcount
    _finish(txn, op.txn, "aborted", 0)
    return TxnResult("aborted", dropped)


def _finish(txn: Txn, name: str, state: str, messages: int) -> None:
    txn.exec(
        "UPDATE leasecast_transaction SET state = %s, messages = %s, finished_at = %s "
        "WHERE name = %s",
        (state, messages, txn.now, name),
    )


def forget_stale_staging(
    transaction: Callable[[], AbstractContextManager[Txn]],
    staged_for: float,
    remembered_for: float,
) -> int:
    """Drop staging never committed within ``staged_for`` seconds, and records of
    transactions opened or finished more than ``remembered_for`` ago (an open
    record's ``finished_at`` is when it was opened); returns rows dropped."""
    with transaction() as txn:
        dropped: int = txn.exec(
            "DELETE FROM leasecast_staged WHERE staged_at <= %s", (txn.now - staged_for,)
        ).rowcount
        txn.exec(
            "DELETE FROM leasecast_transaction WHERE finished_at <= %s",
            (txn.now - remembered_for,),
        )
    return dropped
