"""Staged transactions (the Spark sink, docs/protocol.md: Transactions).

A task stages its partition of a batch; the driver commits the batch once,
which enqueues every staged message at once. A retried task, or a replayed
commit, changes nothing: finished transactions are remembered.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from gateway.errors import Invalid
from gateway.protocol import EnqueueSpec
from gateway.store.enqueue import enqueue
from gateway.store.ops import CommitTxn, Stage, TxnResult
from gateway.store.txn import Txn

__all__ = ["abort", "commit", "forget_stale_staging", "stage"]

_INSERT_CHUNK = 400  # 11 columns a row: under SQLite's variable limit


def _finished(txn: Txn, name: str) -> tuple[str, int] | None:
    row = txn.exec(
        "SELECT state, messages FROM leasecast_transaction WHERE name = %s", (name,)
    ).fetchone()
    return None if row is None else (row[0], row[1])


def stage(txn: Txn, op: Stage) -> TxnResult:
    """Replace partition ``op.partition`` of ``op.txn`` with ``op.messages``."""
    finished = _finished(txn, op.txn)
    if finished is not None:
        # A retried task of a batch already committed (or aborted): its
        # rows are in (or were discarded); staging again changes nothing.
        return TxnResult(finished[0], 0, already=True)
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
        Invalid: the transaction was aborted.
        QueueFull: a bounded queue cannot take its messages; nothing was applied.
    """
    finished = _finished(txn, op.txn)
    if finished is not None:
        if finished[0] != "committed":
            raise Invalid(f"transaction {op.txn!r} was aborted")
        return TxnResult("committed", finished[1], already=True)
    rows = txn.exec(
        'SELECT s."partition", q.name, s.body, s."key", s.delay, s."group", s.priority, s.ttl '
        "FROM leasecast_staged AS s JOIN leasecast_queue AS q ON q.id = s.queue_id "
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
    with txn.savepoint():
        for queue, specs in by_queue.items():
            enqueue(txn, queue, specs)
        txn.exec("DELETE FROM leasecast_staged WHERE txn = %s", (op.txn,))
        _remember(txn, op.txn, "committed", len(rows))
    return TxnResult("committed", len(rows))


def abort(txn: Txn, name: str) -> TxnResult:
    """Discard what is staged under ``name``.

    Raises:
        Invalid: the transaction is committed.
    """
    finished = _finished(txn, name)
    if finished is not None:
        if finished[0] == "committed":
            raise Invalid(f"transaction {name!r} is committed; it cannot be aborted")
        return TxnResult("aborted", 0, already=True)
    dropped: int = txn.exec("DELETE FROM leasecast_staged WHERE txn = %s", (name,)).rowcount
    _remember(txn, name, "aborted", 0)
    return TxnResult("aborted", dropped)


def _remember(txn: Txn, name: str, state: str, messages: int) -> None:
    txn.exec(
        "INSERT INTO leasecast_transaction (name, state, messages, finished_at) "
        "VALUES (%s, %s, %s, %s)",
        (name, state, messages, txn.now),
    )


def forget_stale_staging(
    transaction: Callable[[], AbstractContextManager[Txn]],
    staged_for: float,
    remembered_for: float,
) -> int:
    """Drop staging never committed within ``staged_for`` seconds, and records of
    finished transactions older than ``remembered_for``; returns rows dropped."""
    with transaction() as txn:
        dropped: int = txn.exec(
            "DELETE FROM leasecast_staged WHERE staged_at <= %s", (txn.now - staged_for,)
        ).rowcount
        txn.exec(
            "DELETE FROM leasecast_transaction WHERE finished_at <= %s",
            (txn.now - remembered_for,),
        )
    return dropped
